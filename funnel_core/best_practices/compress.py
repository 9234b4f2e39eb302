"""Query-based extractive compression ("Searching for Best Practices in RAG", section 3.7).

Recomp-style sentence selection: split the retrieved units into sentences, score every sentence
against the query, and keep the best sentences until a budget is spent — ``ratio`` of the input
tokens (0.4 by default, our choice, not a setting of the paper) and/or ``max_tokens``. Kept sentences are written
back in their original order, inside their original units, so the context still reads naturally
and every sentence keeps its provenance (unit id, metadata).

Sentence scores come from an embedding model (cosine similarity with
:class:`~funnel_core.embeddings.SentenceEmbedder`, all-MiniLM-L6-v2 by default) or from BM25
(:func:`~funnel_core.bm25.bm25_scores`, no model at all). Tokens are whitespace tokens
(:func:`~funnel_core.text.count_tokens`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Sequence

import numpy as np

from funnel_core.bm25 import bm25_scores
from funnel_core.embeddings import SentenceEmbedder
from funnel_core.errors import check_positive_int
from funnel_core.funnel import Stage
from funnel_core.hardware import normalize_dtype
from funnel_core.settings import Settings
from funnel_core.text import count_tokens, split_sentences
from funnel_core.units import Unit

__all__ = ["ExtractiveCompressor", "COMPRESSION_METHODS", "COMPRESSION_SCOPES", "check_ratio",
           "with_embedder"]

COMPRESSION_METHODS = ("embedding", "bm25", "random")
COMPRESSION_SCOPES = ("global", "unit")


def check_ratio(ratio: object) -> float:
    """Check that ``ratio`` is a number in (0, 1] and return it as a float."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
        raise TypeError(f"ratio must be a number in (0, 1], got {type(ratio).__name__} {ratio!r}.")
    if not 0.0 < float(ratio) <= 1.0:
        raise ValueError(f"ratio must be in (0, 1] (the share of tokens to keep, e.g. 0.4), "
                         f"got {ratio}.")
    return float(ratio)


class ExtractiveCompressor(Settings, Stage):
    """Keep the sentences of the retrieved units most similar to the query.

    Args:
        method: ``"embedding"`` (cosine similarity, default), ``"bm25"``, or ``"random"``: a
            control that keeps random sentences up to the same budget (seeded by ``seed`` and
            the query, so a query always keeps the same sentences).
        ratio: Share of the input tokens to keep, in (0, 1]; 0.4 by default.
        max_tokens: Optional absolute token budget; with ``ratio`` too, the smaller one wins.
            Pass ``ratio=1.0`` to use ``max_tokens`` alone.
        scope: ``"global"`` (default): one budget over all units, so sentences compete across
            units and a unit with nothing relevant may disappear; ``"unit"``: each unit is
            compressed to its own budget and none is dropped.
        min_sentences: Sentences always kept per scope (the best ones), even over the budget.
        embedder: A loaded :class:`SentenceEmbedder` to share (``None``: one built lazily from
            ``model``, ``batch_size`` and ``device``); only for ``method="embedding"``.
        model: Sentence-embedding model when no ``embedder`` is given (``None``: the packaged
            all-MiniLM-L6-v2).
        batch_size: Sentences per forward pass of that model.
        device: Torch device of that model (``None``: best available).
        dtype: Precision of that model (:class:`SentenceEmbedder`'s ``dtype``; ``"auto"``:
            bf16 autocast only where the hardware runs it natively).
        cache_size: Sentence embeddings kept in an LRU cache (0 = off, default). The same
            documents come back for many queries in a RAG system; with a cache only the query
            and unseen sentences are encoded. :meth:`precompute` fills it in large batches.
        name: Stage name (``None``: ``"extractive_compressor"``).
        seed: Seed of the ``"random"`` control (unused by the other methods).

    Output units keep their order, id, score and metadata; their text holds the kept sentences
    in original order, and the bookkeeping (``Unit.funnel``) records
    ``compression_original_tokens``, ``compression_kept_tokens``,
    ``compression_kept_sentences``, ``compression_total_sentences`` and
    ``compression_best_sentence_score``.
    """

    #: Settings whose edit drops the embedding model (and its cache); any other edit keeps it.
    load_settings = frozenset({"model", "batch_size", "device", "dtype", "embedder"})
    model_attrs = ()
    unserialised = ("embedder",)
    setting_attrs = {"embedder": "_given_embedder"}

    def __init__(self, *, method: str = "embedding", ratio: float = 0.4,
                 max_tokens: int | None = None, scope: str = "global", min_sentences: int = 1,
                 embedder: SentenceEmbedder | None = None, cache_size: int = 0,
                 name: str | None = None, model: str | None = None, batch_size: int = 64,
                 device: str | None = None, dtype: str = "auto", seed: int = 0) -> None:
        if method not in COMPRESSION_METHODS:
            raise ValueError(f"unknown compression method {method!r}; choose one of "
                             f"{COMPRESSION_METHODS}.")
        if scope not in COMPRESSION_SCOPES:
            raise ValueError(f"unknown scope {scope!r}; choose one of {COMPRESSION_SCOPES}.")
        self.method = method
        self.ratio = check_ratio(ratio)
        self.max_tokens = check_positive_int(max_tokens, "max_tokens", allow_none=True)
        self.scope = scope
        if isinstance(min_sentences, bool) or not isinstance(min_sentences, int) or min_sentences < 0:
            raise ValueError(f"min_sentences must be an int >= 0, got {min_sentences!r}.")
        self.min_sentences = min_sentences
        self._given_embedder = self._embedder = embedder
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 0:
            raise ValueError(f"cache_size must be an int >= 0, got {cache_size!r}.")
        self.cache_size = cache_size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self.model, self.device = model, device
        self.dtype = normalize_dtype(dtype)
        self.batch_size = check_positive_int(batch_size, "batch_size")
        self.name = name or "extractive_compressor"
        self.seed = int(seed)

    def drop_model(self) -> None:
        given = self.__dict__.get("_given_embedder")
        object.__setattr__(self, "_embedder", given)
        object.__setattr__(self, "_cache", OrderedDict())

    @property
    def embedder(self) -> SentenceEmbedder:
        if self._embedder is None:
            self._embedder = SentenceEmbedder(self.model, device=self.device, batch_size=self.batch_size,
                                              dtype=self.dtype)
        return self._embedder

    # -- scoring -----------------------------------------------------------------------------
    def _embed_sentences(self, sentences: Sequence[str]) -> np.ndarray:
        if not self.cache_size:
            return self.embedder.encode(list(sentences))
        missing = list(dict.fromkeys(s for s in sentences if s not in self._cache))
        if missing:
            for s, e in zip(missing, self.embedder.encode(missing)):
                self._cache[s] = e
        rows = []
        for s in sentences:
            self._cache.move_to_end(s)
            rows.append(self._cache[s])
        out = np.stack(rows)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return out

    def precompute(self, units: Iterable[Unit]) -> int:
        """Embed the sentences of ``units`` into the cache in large batches; returns how many
        sentences the cache holds. Needs ``cache_size > 0`` and ``method="embedding"``."""
        if not self.cache_size or self.method != "embedding":
            raise ValueError("precompute needs method='embedding' and cache_size > 0.")
        sentences = [s for u in units for s in split_sentences(u.text)]
        if sentences:
            self._embed_sentences(sentences[-self.cache_size:])
        return len(self._cache)

    def score_sentences(self, query: str, sentences: Sequence[str]) -> list[float]:
        """Similarity of each sentence to the query (higher is better), as Python floats."""
        if not sentences:
            return []
        if self.method == "bm25":
            return bm25_scores(query, list(sentences))
        if self.method == "random":
            import zlib

            rng = np.random.default_rng([self.seed, zlib.crc32(query.encode("utf-8"))])
            return [float(x) for x in rng.random(len(sentences))]
        if self.cache_size:
            q, s = self.embedder.encode([query])[0], self._embed_sentences(sentences)
        else:
            emb = self.embedder.encode([query, *sentences])
            q, s = emb[0], emb[1:]
        if not self.embedder.normalize:  # cosine even for an un-normalised embedder
            q = q / (np.linalg.norm(q) or 1.0)
            s = s / np.clip(np.linalg.norm(s, axis=1, keepdims=True), 1e-12, None)
        return [float(x) for x in s @ q]

    def _budget(self, total_tokens: int) -> float:
        budget = self.ratio * total_tokens
        return min(budget, self.max_tokens) if self.max_tokens is not None else budget

    def _select(self, scores: Sequence[float], lengths: Sequence[int]) -> set[int]:
        """Greedy: best sentences first; skip one that would pass the budget, keep trying."""
        budget = self._budget(sum(lengths))
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        kept: set[int] = set()
        used = 0
        for n, i in enumerate(order):
            if n < self.min_sentences or used + lengths[i] <= budget:
                kept.add(i)
                used += lengths[i]
        return kept

    # -- stage -------------------------------------------------------------------------------
    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        if not units:
            return []
        per_unit = [split_sentences(u.text) for u in units]
        flat = [(ui, s) for ui, sents in enumerate(per_unit) for s in sents]
        scores = self.score_sentences(query, [s for _, s in flat])
        lengths = [count_tokens(s) for _, s in flat]
        if self.scope == "global":
            kept = self._select(scores, lengths)
        else:
            kept, start = set(), 0
            for sents in per_unit:
                idx = list(range(start, start + len(sents)))
                local = self._select([scores[i] for i in idx], [lengths[i] for i in idx])
                kept |= {start + i for i in local}
                start += len(sents)
        out: list[Unit] = []
        start = 0
        for ui, (unit, sents) in enumerate(zip(units, per_unit)):
            idx = list(range(start, start + len(sents)))
            start += len(sents)
            keep = [i for i in idx if i in kept]
            if not keep:
                continue
            new = unit.copy()
            new.text = " ".join(flat[i][1] for i in keep)
            new.funnel.update({
                "compression_original_tokens": count_tokens(unit.text),
                "compression_kept_tokens": sum(lengths[i] for i in keep),
                "compression_kept_sentences": len(keep),
                "compression_total_sentences": len(idx),
                "compression_best_sentence_score": float(max(scores[i] for i in keep)),
            })
            out.append(new)
        return out


def with_embedder(stage: ExtractiveCompressor, embedder: SentenceEmbedder | None) -> ExtractiveCompressor:
    """``stage`` using ``embedder`` (an already loaded model shared by the caller), when given."""
    if embedder is not None and stage._embedder is not embedder:
        stage._embedder = embedder
        stage._cache.clear()  # embeddings of another model
    return stage
