"""Cross-encoder pre-ranking (FunnelRAG section 3.1.2): read query and passage together, score.

:class:`CrossEncoderScorer` is a :class:`~funnel_core.rerank.base.Reranker` stage with three
interchangeable model libraries (``library=``):

* ``"sentence-transformers"`` (default) — ``sentence_transformers.CrossEncoder.predict``; default
  model ``cross-encoder/ms-marco-MiniLM-L6-v2``;
* ``"flagembedding"`` — ``FlagEmbedding.FlagReranker``; default model ``BAAI/bge-reranker-v2-m3``
  (the pre-ranker of the FunnelRAG paper);
* ``"transformers"`` — a plain ``AutoModelForSequenceClassification`` loop; no extra dependency,
  optional length-sorted batching, and passage-only truncation.

Every library accepts a hub name or a local folder, loads lazily on first use (thread-safe), runs
float16 only on CUDA, and returns raw scores as Python floats (``normalize=True`` maps them through a
sigmoid). Truncation never cuts the query away: the ``"transformers"`` library truncates the
passage only (a query longer than half of ``max_length`` is first clipped to half);
sentence-transformers and FlagEmbedding truncate the longer side first, so a query shorter than the
passage is kept whole.

``window_words`` scores long texts whole instead of truncating them: a text longer than that many
words is cut into sentence-aware windows (:func:`funnel_core.text.word_windows`) and scores as its
best window (MaxP, Dai & Callan 2019). It is how a 512-position cross-encoder pre-ranks ~1K-token
documents without seeing only their first paragraph.

``fuse_weight`` optionally interpolates the cross-encoder score with the previous stage's score
(both min-max normalised per query): ``(1 - w) * ce + w * previous``. It is off by default.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from funnel_core.errors import check_positive_int, check_probability
from funnel_core.models import LazyModel, flagembedding_error, load_pretrained, resolve_device, tokenizer_lock
from funnel_core.rerank.base import Reranker, count_extra_pairs
from funnel_core.rerank.runtimes import RUNTIMES, OnnxSession, PairTokenizer, choose_runtime, export_onnx, score_batches
from funnel_core.scoring import minmax  # noqa: F401 (re-exported: funnel_core.rerank.cross_encoder.minmax)
from funnel_core.settings import Settings
from funnel_core.text import word_windows
from funnel_core.units import Unit

__all__ = ["CrossEncoderScorer", "encode_pairs", "LIBRARIES", "RUNTIMES", "DEFAULT_MODELS", "minmax"]

LIBRARIES = ("sentence-transformers", "flagembedding", "transformers")
DEFAULT_MODELS = {
    "sentence-transformers": "cross-encoder/ms-marco-MiniLM-L6-v2",
    "flagembedding": "BAAI/bge-reranker-v2-m3",
    "transformers": "cross-encoder/ms-marco-MiniLM-L6-v2",
}


def encode_pairs(tokenizer: Any, queries: Sequence[str], texts: Sequence[str], max_length: int,
                 return_tensors: str = "pt") -> Any:
    """Tokenize (query, passage) pairs so that only the passage is truncated.

    A query longer than about half of ``max_length`` tokens is clipped to that half first, so
    every pair fits and the passage always keeps at least the other half.
    """
    limit = max(1, (max_length - 3) // 2)
    clipped: dict[str, str] = {}
    with tokenizer_lock(tokenizer):
        for q in set(queries):
            ids = tokenizer(q, add_special_tokens=False)["input_ids"]
            clipped[q] = q if len(ids) <= limit else tokenizer.decode(ids[:limit])
        return tokenizer([clipped[q] for q in queries], list(texts), truncation="only_second",
                         max_length=max_length, padding=True, return_tensors=return_tensors)


class CrossEncoderScorer(Settings, Reranker):
    """Score (query, passage) pairs with a cross-encoder and rerank units.

    Args:
        model: Hub name or local folder; ``None`` picks the library's default
            (:data:`DEFAULT_MODELS`).
        library: The model library: ``"sentence-transformers"``, ``"flagembedding"`` or
            ``"transformers"`` (``backend=`` in the rest of the package means storage: memory or
            Milvus).
        batch_size: Pairs per forward pass.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"`` or ``None`` (automatic).
        max_length: Tokens per pair (query + passage); longer passages are truncated.
        sort_by_length: Batch pairs of similar length together (less padding). The
            sentence-transformers backend always does this internally.
        normalize: Sigmoid the scores into (0, 1) (for thresholds and fusion).
        top_n: Keep the best ``top_n`` units (``None``: all).
        score_threshold: Drop units scoring below this (after ``normalize``).
        window_words: Score a text longer than this many words as the maximum over its windows
            of about this many words (MaxP); ``None`` (default) truncates to ``max_length``.
        window_overlap: Words repeated between consecutive windows (``window_words`` only).
        fuse_weight: Weight ``w`` of the previous stage's score in
            ``(1 - w) * minmax(ce) + w * minmax(previous)``; ``None`` (default) = pure cross-encoder.
        name: Stage name (key ``score_<name>`` in ``Unit.funnel``).
        model_kwargs: Extra keyword arguments for the backend's loader.
        runtime: Where the model runs (:mod:`funnel_core.rerank.runtimes`): ``"torch"``,
            ``"onnx"`` (onnxruntime fp32, scores equal to torch fp32), ``"openvino"``, or ``"auto"`` (default: torch on a GPU; on a
            CPU OpenVINO when installed, else torch where bf16 is native, else ONNX fp32:
            :func:`~funnel_core.rerank.runtimes.cpu_auto_runtime`, measured in
            ``benchmarks/results/ce_backends.json``). Non-torch runtimes serve the ``"transformers"``
            backend (passage-only truncation) and the ``"sentence-transformers"`` backend (the
            tokenizer's pair truncation, as sentence-transformers does); the export is cached
            next to the model (``<model>/funnel_onnx/``) or under ``export_dir``.
        dtype: Torch-runtime precision: ``"auto"`` (default; :mod:`funnel_core.hardware`: bf16
            autocast only where native — AVX-512-BF16/AMX CPUs, GPUs of compute capability >= 8 —,
            fp16 on older GPUs, fp32 otherwise), ``"float32"``, ``"bfloat16"`` (autocast, weights
            stay fp32: about 2x faster on CPUs with AVX512-BF16 or AMX; scores move by about
            1e-2) or ``"float16"`` (weights, CUDA only). The one precision setting. An explicit
            bf16 request on hardware without native bf16 warns once.
        export_dir: Folder for the ONNX export (``None``: next to a local model folder when
            writable, else ``$FUNNEL_RAG_CACHE/ce_export/...``).
    """

    name = "cross_encoder"
    #: Settings whose edit loads the model again; any other edit keeps it.
    load_settings = frozenset({"model", "library", "device", "max_length", "model_kwargs",
                               "runtime", "export_dir", "dtype"})

    def __init__(self, model: str | os.PathLike | None = None, *,
                 library: str = "sentence-transformers", batch_size: int = 32,
                 device: str | None = None, max_length: int = 512,
                 sort_by_length: bool = True, normalize: bool = False,
                 top_n: int | None = None,
                 score_threshold: float | None = None, window_words: int | None = None,
                 window_overlap: int = 0, fuse_weight: float | None = None,
                 name: str | None = None, model_kwargs: dict[str, Any] | None = None,
                 runtime: str = "auto", export_dir: str | os.PathLike | None = None,
                 dtype: str = "auto") -> None:
        super().__init__(top_n=top_n, score_threshold=score_threshold, normalize=normalize,
                         batch_size=batch_size, name=name)
        if library not in LIBRARIES:
            raise ValueError(f"unknown cross-encoder library {library!r}; choose one of "
                             f"{LIBRARIES}.")
        if model is not None and not isinstance(model, (str, os.PathLike)):
            raise TypeError(f"model must be a hub name or a local folder path, got "
                            f"{type(model).__name__}.")
        self.library = library
        self.model = None if model is None else os.fspath(model)
        self.device = device
        self.max_length = check_positive_int(max_length, "max_length")
        self.sort_by_length = bool(sort_by_length)
        self.window_words = None if window_words is None else check_positive_int(window_words,
                                                                                 "window_words")
        if (isinstance(window_overlap, bool) or not isinstance(window_overlap, int)
                or window_overlap < 0
                or (self.window_words is not None and window_overlap >= self.window_words)):
            raise ValueError(f"window_overlap must be an int in [0, window_words), got "
                             f"{window_overlap!r}.")
        self.window_overlap = window_overlap
        self.fuse_weight = None if fuse_weight is None else check_probability(fuse_weight, "fuse_weight")
        self.model_kwargs = dict(model_kwargs or {})
        if runtime not in RUNTIMES:
            raise ValueError(f"unknown cross-encoder runtime {runtime!r}; choose one of {RUNTIMES}.")
        if runtime not in ("auto", "torch") and library == "flagembedding":
            raise ValueError(f"runtime {runtime!r} serves the 'transformers' and "
                             "'sentence-transformers' libraries, not 'flagembedding'; pass "
                             "library='transformers' (same model folder) or runtime='torch'.")
        from funnel_core.hardware import normalize_dtype

        self.dtype = normalize_dtype(dtype)
        if runtime not in ("auto", "torch") and self.dtype not in ("auto", "float32"):
            raise ValueError(f"dtype={dtype!r} applies to runtime='torch', not {runtime!r}; pass "
                             "dtype='auto' or runtime='torch'.")
        self.runtime = runtime
        self.export_dir = None if export_dir is None else os.fspath(export_dir)
        self._model = LazyModel(self._load)

    @property
    def model_name(self) -> str:
        """The model that loads: ``model``, or the backend's default (:data:`DEFAULT_MODELS`)."""
        return self.model if self.model is not None else DEFAULT_MODELS[self.library]

    # -- loading ---------------------------------------------------------------------------
    def _requested_dtype(self) -> str:
        return self.dtype

    @property
    def active_runtime(self) -> str | None:
        """The runtime ``runtime`` resolved to (``None`` until loaded); it travels with the
        loaded model to a stage rebuilt around it."""
        return getattr(self._model.get(), "_funnel_runtime", None) if self._model.loaded else None

    @property
    def active_dtype(self) -> str | None:
        """The torch runtime's precision (``dtype`` resolved on its device; ``None`` until loaded
        or with an ONNX/OpenVINO runtime); it travels with the loaded model."""
        return getattr(self._model.get(), "_funnel_dtype", None) if self._model.loaded else None

    def _load(self) -> Callable[[list[str], list[str]], list[float]]:
        from funnel_core.hardware import resolve_dtype

        device = resolve_device(self.device)
        requested = self._requested_dtype()
        runtime = choose_runtime(self.runtime, device, self.library, fp32=requested == "float32")
        if self.runtime == "auto" and requested not in ("auto", "float32"):
            runtime = "torch"  # an explicit torch precision request keeps torch
        active = None
        if runtime != "torch":
            if not device.startswith("cpu"):
                raise ValueError(f"runtime {runtime!r} runs on the CPU, but device={device!r}; "
                                 "pass device='cpu' or runtime='torch'.")
            score = self._load_onnx(runtime)
        else:
            active = resolve_dtype(requested, device)
            load = {"sentence-transformers": self._load_st,
                    "flagembedding": self._load_flag}.get(self.library, self._load_hf)
            score = load(device, active)
        score._funnel_runtime, score._funnel_dtype = runtime, active  # type: ignore[attr-defined]
        return score

    def _load_st(self, device: str, active: str):
        import torch
        from sentence_transformers import CrossEncoder

        kwargs = dict(self.model_kwargs)
        # the resolved precision, also for float16 checkpoints (the models funnel train keeps)
        kwargs.setdefault("torch_dtype", torch.float16 if active == "float16" else torch.float32)
        model = load_pretrained(CrossEncoder, self.model_name, what="cross-encoder", device=device,
                                max_length=self.max_length, model_kwargs=kwargs)
        identity = torch.nn.Identity()
        autocast: dict[str, Any] = dict(device_type=torch.device(device).type,
                                        dtype=torch.bfloat16,
                                        enabled=active == "bfloat16")

        def score(queries: list[str], texts: list[str], batch_size: int,
                  sort_by_length: bool) -> list[float]:
            with torch.autocast(**autocast):
                out = model.predict(list(zip(queries, texts)), batch_size=batch_size,
                                    activation_fn=identity, show_progress_bar=False,
                                    convert_to_numpy=True)
            if out.ndim > 1:  # several labels: the last one is "relevant"
                out = out[:, -1]
            return out.tolist()

        score.model = model  # type: ignore[attr-defined]
        return score

    def _load_flag(self, device: str, active: str):
        try:
            from FlagEmbedding import FlagReranker
        except ImportError as exc:  # missing, or installed against another transformers
            raise flagembedding_error(exc) from exc

        max_length = self.max_length
        model = load_pretrained(FlagReranker, self.model_name, what="cross-encoder",
                                use_fp16=active == "float16", devices=[device],
                                batch_size=self.batch_size, max_length=max_length,
                                **self.model_kwargs)

        def score(queries: list[str], texts: list[str], batch_size: int,
                  sort_by_length: bool) -> list[float]:
            out = model.compute_score(list(zip(queries, texts)), batch_size=batch_size,
                                      max_length=max_length, normalize=False)
            return [float(x) for x in (out if isinstance(out, (list, tuple)) else [out])]

        score.model = model  # type: ignore[attr-defined]
        return score

    def _load_hf(self, device: str, active: str):
        import torch
        from transformers import AutoModelForSequenceClassification

        tokenizer = self._hf_tokenizer()
        model = load_pretrained(AutoModelForSequenceClassification.from_pretrained,
                                self.model_name, what="cross-encoder", **self.model_kwargs)
        # float16 on disk (the models funnel train keeps) runs in the precision resolved for this hardware
        model = (model.half() if active == "float16" else model.float()).to(device).eval()
        autocast: dict[str, Any] = dict(device_type=torch.device(device).type,
                                        dtype=torch.bfloat16,
                                        enabled=active == "bfloat16")

        max_length = self.max_length

        @torch.inference_mode()
        def score(queries: list[str], texts: list[str], batch_size: int,
                  sort_by_length: bool) -> list[float]:
            order = list(range(len(texts)))
            if sort_by_length:
                order.sort(key=lambda i: -(len(texts[i]) + len(queries[i])))
            out = [0.0] * len(texts)
            for b in range(0, len(order), batch_size):
                idx = order[b:b + batch_size]
                enc = encode_pairs(tokenizer, [queries[i] for i in idx], [texts[i] for i in idx],
                                   max_length).to(device)
                with torch.autocast(**autocast):
                    logits = model(**enc).logits.float()
                for i, s in zip(idx, logits[:, -1].tolist()):
                    out[i] = s
            return out

        score.model = model  # type: ignore[attr-defined]
        score.tokenizer = tokenizer  # type: ignore[attr-defined]
        return score

    def _load_onnx(self, runtime: str):
        path = export_onnx(self.model_name, cache_dir=self.export_dir,
                           model_kwargs=self.model_kwargs)
        session = OnnxSession(path, engine="openvino" if runtime == "openvino" else "onnxruntime")
        max_length = self.max_length
        # transformers passage-only truncation; sentence-transformers the tokenizer's own
        # pair truncation ("longest_first")
        strategy = "only_second" if self.library == "transformers" else "longest_first"
        pairs = PairTokenizer.from_export(path.parent, max_length, strategy)
        hf_tokenizer = LazyModel(self._hf_tokenizer)  # imports transformers (and torch)
        limit = max(1, (max_length - 3) // 2)

        def tokenize(queries: list[str], texts: list[str]) -> Any:
            if pairs is not None and (strategy == "longest_first" or all(
                    pairs.token_count(q) <= limit for q in set(queries))):
                return pairs(queries, texts)  # what transformers returns, without importing it
            # a query long enough to be clipped (decoded and re-encoded, as encode_pairs does),
            # or an export that kept no tokenizer
            tokenizer = hf_tokenizer.get()
            if strategy == "only_second":
                return encode_pairs(tokenizer, queries, texts, max_length, return_tensors="np")
            with tokenizer_lock(tokenizer):
                return tokenizer(queries, texts, truncation=True, padding=True,
                                 max_length=max_length, return_tensors="np")

        def score(queries: list[str], texts: list[str], batch_size: int,
                  sort_by_length: bool) -> list[float]:
            return score_batches(session, tokenize, queries, texts, batch_size, sort_by_length)

        score.session = session  # type: ignore[attr-defined]
        score.pair_tokenizer = pairs  # type: ignore[attr-defined]
        score.runtime = runtime  # type: ignore[attr-defined]
        return score

    def _hf_tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        return load_pretrained(AutoTokenizer.from_pretrained, self.model_name, what="tokenizer")

    def load(self) -> "CrossEncoderScorer":
        """Load the model now instead of on first use; returns ``self``."""
        self._model.get()
        return self

    # -- scoring ---------------------------------------------------------------------------
    def score_pairs(self, queries: Sequence[str], texts: Sequence[str]) -> list[float]:
        """Raw scores of many (query, text) pairs, possibly of different queries, in one call."""
        queries, texts = list(queries), list(texts)
        if len(queries) != len(texts):
            raise ValueError(f"got {len(queries)} queries for {len(texts)} texts; pass one query "
                             "per text.")
        for t in texts:
            if not isinstance(t, str):
                raise TypeError(f"texts must be strings, got {type(t).__name__}; convert "
                                "non-text content to text first.")
        if not texts:
            return []
        if self.window_words is None:
            return [float(s) for s in self._model.get()(queries, texts, self.batch_size,
                                                         self.sort_by_length)]
        owner, win_queries, win_texts = [], [], []
        for i, (q, t) in enumerate(zip(queries, texts)):
            windows = (word_windows(t, self.window_words, self.window_overlap)
                       if len(t.split()) > self.window_words else [t])
            for w in windows:
                owner.append(i)
                win_queries.append(q)
                win_texts.append(w)
        best = [float("-inf")] * len(texts)
        for i, s in zip(owner, self._model.get()(win_queries, win_texts, self.batch_size,
                                                 self.sort_by_length)):
            best[i] = max(best[i], float(s))
        count_extra_pairs(len(win_texts) - len(texts))  # the model scored every window
        return best

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        """Raw relevance score of each text for ``query`` (Python floats, higher is better)."""
        return self.score_pairs([query] * len(texts), texts)

    def rank(self, query: str, units: Sequence[Unit], top_n: int | None = None) -> list[Unit]:
        """Rerank units; with ``fuse_weight`` the previous score is interpolated in."""
        if self.fuse_weight is None or not units:
            return super().rank(query, units, top_n)
        units = list(units)
        ce = minmax(self.score(query, [u.text for u in units]))
        prev = minmax([u.score if u.score is not None else 0.0 for u in units])
        w = self.fuse_weight
        fused = [(1 - w) * c + w * p for c, p in zip(ce, prev)]
        order = sorted(range(len(units)), key=lambda i: -fused[i])
        out = [units[i].rescored(fused[i], self.name) for i in order]
        if self.score_threshold is not None:
            out = [u for u in out if u.score is not None and u.score >= self.score_threshold]
        limit = top_n if top_n is not None else self.top_n
        return out[:limit] if limit is not None else out

    def __repr__(self) -> str:
        return (f"CrossEncoderScorer(model={self.model_name!r}, library={self.library!r}, "
                f"max_length={self.max_length}, batch_size={self.batch_size}, "
                f"window_words={self.window_words}, runtime={self.runtime!r}, "
                f"dtype={self.dtype!r})")
