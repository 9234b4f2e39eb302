"""A bi-encoder as a reranker: cosine similarity of query and unit embeddings."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from funnel_core.embeddings import DenseIndex, SentenceEmbedder
from funnel_core.rerank.base import Reranker

__all__ = ["EmbeddingScorer"]


class EmbeddingScorer(Reranker):
    """Rerank units by cosine similarity between query and unit embeddings (a bi-encoder).

    Cheaper than a cross-encoder and available offline with the packaged MiniLM; useful as a
    middle funnel stage or when no cross-encoder checkpoint is at hand. Texts go through the
    embedder's cache, so a text is embedded once per process; with ``index=`` (a
    :class:`DenseIndex` built with the same model) the rows the index already stores are used
    for texts it holds.
    """

    name = "embedding_rerank"

    def __init__(self, embedder: SentenceEmbedder | None = None, *, index: "DenseIndex | None" = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.embedder = embedder or (index.embedder if index is not None else SentenceEmbedder())
        self.index = index

    def _stored_rows(self, texts: Sequence[str]) -> tuple[np.ndarray | None, list[int]]:
        """The index's matrix and, per text, its row there (-1: not stored)."""
        index = self.index
        if index is None or index.embedder._model_key() != self.embedder._model_key():
            return None, [-1] * len(texts)
        st = index._state
        by_text = st.by_text()
        return st.embeddings, [by_text.get(t, -1) for t in texts]

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        matrix, rows = self._stored_rows(texts)
        missing = [t for t, r in zip(texts, rows) if r < 0]
        emb = self.embedder.encode([query, *missing])
        q, fresh = emb[0], iter(emb[1:])
        vecs = [matrix[r] if r >= 0 and matrix is not None else next(fresh) for r in rows]
        if not vecs:
            return []
        return [float(x) for x in np.stack(vecs) @ q]
