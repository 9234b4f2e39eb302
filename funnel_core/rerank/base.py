"""The reranker stage every model-based scorer builds on.

A :class:`Reranker` needs only :meth:`Reranker.score` (query, texts) -> floats. The base class
does the rest the same way for every model: copies units (never mutates them), keeps the
previous score in ``metadata["scores"]``, optional sigmoid normalisation, ``score_threshold``,
``top_n`` (also as ``reranker % n``), Python-float scores, and an async twin.

It also holds the helpers that model backends share: :func:`resolve_device` (fp16 only on CUDA)
and :func:`load_pretrained` (turns "cannot reach the hub" into an error that names the model
and suggests a local folder).
"""

from __future__ import annotations

import math
import os
import threading
from abc import abstractmethod
from typing import Any, Callable, Sequence, TypeVar

from funnel_core.errors import ModelLoadError, check_positive_int
from funnel_core.funnel import Stage
from funnel_core.units import Unit

__all__ = ["Reranker", "resolve_device", "load_pretrained", "sigmoid", "LazyModel", "tokenizer_lock"]

_TOKENIZER_LOCKS: dict[int, threading.Lock] = {}
_TOKENIZER_LOCKS_GUARD = threading.Lock()


def tokenizer_lock(tokenizer: Any) -> threading.Lock:
    """The lock to hold while calling ``tokenizer``.

    A Hugging Face fast tokenizer sets padding and truncation on its shared Rust object at every
    call, so concurrent calls from several threads (a retriever used by ``chain.batch`` or by an
    async server) corrupt each other's settings and return ragged batches. Tokenizing is cheap;
    model forward passes run outside the lock.
    """
    key = id(tokenizer)
    with _TOKENIZER_LOCKS_GUARD:
        lock = _TOKENIZER_LOCKS.get(key)
        if lock is None:
            lock = _TOKENIZER_LOCKS[key] = threading.Lock()
    return lock

T = TypeVar("T")


def sigmoid(x: float) -> float:
    """Numerically safe logistic function."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def resolve_device(device: str | None) -> str:
    """``None``/``"auto"`` -> ``"cuda"`` when available, else ``"mps"``, else ``"cpu"``."""
    if device not in (None, "auto"):
        return str(device)
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def load_pretrained(loader: Callable[..., T], name_or_path: str, what: str = "model",
                    **kwargs: Any) -> T:
    """Call ``loader(name_or_path, **kwargs)`` and explain failures.

    A hub name that cannot be downloaded (no network, ``HF_HUB_OFFLINE=1``) or a folder that does
    not exist raises :class:`~funnel_core.errors.ModelLoadError` naming the model and the fix.
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a hub name or a local folder path, got "
                        f"{type(name_or_path).__name__}.")
    try:
        return loader(str(name_or_path), **kwargs)
    except (OSError, ValueError, EnvironmentError) as exc:
        local = os.path.isdir(str(name_or_path))
        hint = ("the folder exists but does not hold a loadable checkpoint (config.json, weights "
                "and tokenizer files)") if local else (
            "it is not a local folder and could not be fetched from the model hub (offline?); "
            "download it where the hub is reachable (e.g. `huggingface-cli download "
            f"{name_or_path} --local-dir ./models/x`) and pass that folder instead")
        raise ModelLoadError(f"cannot load {what} {str(name_or_path)!r}: {hint}. "
                             f"Underlying error: {type(exc).__name__}: {exc}") from exc


class LazyModel:
    """Load something once, on first use, thread-safely."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._value: Any = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._value is not None

    def get(self) -> Any:
        if self._value is None:
            with self._lock:
                if self._value is None:
                    self._value = self._factory()
        return self._value


class Reranker(Stage):
    """Base class of every model-based reranking stage.

    Args:
        top_n: Keep at most this many units (``None`` keeps all). ``reranker % n`` does the same.
        score_threshold: Drop units whose (normalised, if ``normalize``) score is below this.
        normalize: Map raw scores through a sigmoid into (0, 1), for thresholds and fusion.
        batch_size: Pairs per forward pass.
        name: Stage name in traces and in ``metadata["scores"]``.
    """

    name = "reranker"

    def __init__(self, *, top_n: int | None = None, score_threshold: float | None = None,
                 normalize: bool = False, batch_size: int = 32, name: str | None = None) -> None:
        self.top_n = check_positive_int(top_n, "top_n", allow_none=True)
        self.batch_size = check_positive_int(batch_size, "batch_size")
        if score_threshold is not None and not isinstance(score_threshold, (int, float)):
            raise TypeError(f"score_threshold must be a number or None, got {score_threshold!r}.")
        self.score_threshold = score_threshold
        self.normalize = normalize
        if name:
            self.name = name

    @abstractmethod
    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        """Raw relevance score of each text for the query (higher is better)."""

    def rank(self, query: str, units: Sequence[Unit], top_n: int | None = None) -> list[Unit]:
        """Score ``units`` and return rescored copies, best first (stable for ties).

        ``top_n`` (an int >= 1, or ``None`` for the instance's setting) caps the result.
        """
        check_positive_int(top_n, "top_n", allow_none=True)
        units = list(units)
        if not units:
            return []
        for u in units:
            if not isinstance(u, Unit):
                raise TypeError(f"{type(self).__name__} expects Unit objects, got "
                                f"{type(u).__name__}.")
        raw = self.score(query, [u.text for u in units])
        if len(raw) != len(units):  # a backend bug, never silently misalign
            raise RuntimeError(f"{self.name} returned {len(raw)} scores for {len(units)} units.")
        scores = [sigmoid(float(s)) if self.normalize else float(s) for s in raw]
        order = sorted(range(len(units)), key=lambda i: -scores[i])
        out = [units[i].rescored(scores[i], self.name) for i in order]
        if self.score_threshold is not None:
            out = [u for u in out if u.score >= self.score_threshold]
        limit = top_n if top_n is not None else self.top_n
        return out[:limit] if limit is not None else out

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        return self.rank(query, units)
