"""BM25 as a reranker: the candidates themselves are the corpus (model-free)."""

from __future__ import annotations

from typing import Any, Sequence

from funnel_core.bm25 import bm25_scores
from funnel_core.rerank.base import Reranker

__all__ = ["BM25Scorer"]


class BM25Scorer(Reranker):
    """Rerank candidate units by BM25, with the candidates themselves as the corpus.

    A cheap, model-free way to order finer units after later chunking (they inherit their
    parent's score, so they tie), and the BM25 scorer FB-RAG uses for S(C; Q).
    """

    name = "bm25_rerank"

    def __init__(self, *, bm25_config: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bm25_config = dict(bm25_config or {})

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        return bm25_scores(query, texts, **self.bm25_config)
