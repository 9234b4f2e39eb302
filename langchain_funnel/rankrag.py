"""RankRAG reranking for LangChain: :class:`RankRAGReranker`."""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from funnel_core.rerank.fields import RankRAGFields
from langchain_funnel._base import StageCompressor
from langchain_funnel.llm import stage_llm

__all__ = ["RankRAGReranker"]


class RankRAGReranker(RankRAGFields, StageCompressor):
    """RankRAG reranking as a LangChain document compressor: a
    :class:`~funnel_core.rerank.rankrag.RankRAGScorer`; ``llm`` may also be a LangChain model
    (read as text: its replies are parsed).

    Example::

        reranker = RankRAGReranker(llm=chat_model, top_n=3)
        retriever = FunnelRetriever.from_stages(bm25_retriever, reranker)
    """

    wrap_llm: ClassVar[Callable[[Any, Any], Any]] = staticmethod(stage_llm)
