"""The reranker stage every model-based scorer builds on.

A :class:`Reranker` needs only :meth:`Reranker.score` (query, texts) -> floats. The base class
does the rest the same way for every model: copies units (never mutates them), keeps the
previous score in ``Unit.funnel`` (``score_<stage>``), optional sigmoid normalisation,
``score_threshold``, ``top_n`` (also as ``reranker % n``), Python-float scores, and an async twin.
It also counts the work: every call of a subclass's ``score`` adds one to :attr:`Reranker.calls`
and the number of (query, text) pairs to :attr:`Reranker.pairs_scored` (and to
:mod:`funnel_core.counters`, where the evaluation harness reads cost per query).

Model loading lives in :mod:`funnel_core.models` and score helpers in :mod:`funnel_core.scoring`.
"""

from __future__ import annotations

import functools
import threading
from abc import abstractmethod
from typing import Any, Callable, Sequence

from funnel_core import counters
from funnel_core.errors import check_positive_int
from funnel_core.funnel import Stage
from funnel_core.scoring import check_finite_scores, rank_by_scores, sigmoid
from funnel_core.units import Unit

__all__ = ["Reranker"]

_depth = threading.local()


def count_extra_pairs(n: int) -> None:
    """Inside a counted ``score``: ``n`` more (query, text) pairs went through the model than
    texts were scored (a long text scored as its best window counts every window)."""
    _depth.extra = getattr(_depth, "extra", 0) + n


def _counted(score: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a subclass's ``score`` so that the outermost call in a thread counts once (a
    ``score`` that calls another reranker's ``score`` is one call, not two)."""

    @functools.wraps(score)
    def counted_score(self: "Reranker", query: str, texts: Sequence[str], *args: Any,
                      **kwargs: Any) -> Any:
        depth = getattr(_depth, "n", 0)
        _depth.n = depth + 1
        if depth == 0:
            _depth.extra = 0
        try:
            out = score(self, query, texts, *args, **kwargs)
        finally:
            _depth.n = depth
        if depth == 0:
            self._count(len(out) + _depth.extra)
        return out

    counted_score.__funnel_counted__ = True  # type: ignore[attr-defined]
    return counted_score


class Reranker(Stage):
    """Base class of every model-based reranking stage.

    Args:
        top_n: Keep at most this many units (``None`` keeps all). ``reranker % n`` does the same.
        score_threshold: Drop units whose (normalised, if ``normalize``) score is below this.
        normalize: Map raw scores through a sigmoid into (0, 1), for thresholds and fusion.
        batch_size: Pairs per forward pass.
        name: Stage name in traces and in the score history (``Unit.funnel["score_<name>"]``).
    """

    name = "reranker"
    #: Calls of :meth:`score` on this object (each a batch of pairs for one query).
    calls: int = 0
    #: (query, text) pairs scored by this object.
    pairs_scored: int = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("score")
        if own is not None and not getattr(own, "__funnel_counted__", False) \
                and not getattr(own, "__isabstractmethod__", False):
            cls.score = _counted(own)  # type: ignore[method-assign]

    def _count(self, pairs: int) -> None:
        self.calls += 1
        self.pairs_scored += pairs
        counters.add(model_calls=1, pairs_scored=pairs)

    def __init__(self, *, top_n: int | None = None, score_threshold: float | None = None,
                 normalize: bool = False, batch_size: int = 32, name: str | None = None) -> None:
        self.top_n = check_positive_int(top_n, "top_n", allow_none=True)
        self.batch_size = check_positive_int(batch_size, "batch_size")
        if score_threshold is not None and not isinstance(score_threshold, (int, float)):
            raise TypeError(f"score_threshold must be a number or None, got {score_threshold!r}.")
        if score_threshold is not None and score_threshold != score_threshold:
            raise ValueError("score_threshold is NaN, which no score passes; pass a number or None.")
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
        raw = check_finite_scores(
            raw, f"{type(self).__name__} ({self.name})", [u.id for u in units],
            "A model in float16/bfloat16 can overflow: load it with dtype='float32' (or check the "
            "texts of these units, e.g. empty or extremely long ones).")
        scores = [sigmoid(s) if self.normalize else s for s in raw]
        order = rank_by_scores(scores, top_n if top_n is not None else self.top_n,
                               self.score_threshold)
        return [units[i].rescored(scores[i], self.name) for i in order]

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        return self.rank(query, units)

    def _warm_up_batch(self) -> None:
        self.score("warm up", ["a short passage to warm the model up"])
