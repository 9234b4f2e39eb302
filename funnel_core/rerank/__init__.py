"""Model-based reranking stages: cross-encoders, monoT5, FiD attention, decoder-only attention,
RankRAG, plus the CPU runtimes of the cross-encoder. Every scorer subclasses
:class:`~funnel_core.rerank.base.Reranker`."""

from funnel_core.rerank.base import Reranker

__all__ = ["Reranker"]
