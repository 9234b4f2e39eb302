"""RankRAG reranking for LangChain: :class:`RankRAGReranker`, a document compressor (and LCEL
Runnable) scoring each (query, document) by P("True") of an LLM judge.

The LLM can be a LangChain chat model or LLM (text only: RankRAG parses its replies), a
``funnel_core`` provider, or a hub name / folder of a local causal LM (RankRAG reads logits).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from funnel_core.llm import LLM
from funnel_core.rerank.fields import RankRAGFields
from langchain_funnel._base import StageCompressor
from langchain_funnel.llm import stage_llm

__all__ = ["RankRAGReranker"]


class RankRAGReranker(RankRAGFields, StageCompressor):
    """RankRAG reranking as a LangChain document compressor: a
    :class:`~funnel_core.rerank.rankrag.RankRAGScorer`; ``llm`` may also be a LangChain model.

    Example::

        reranker = RankRAGReranker(llm=chat_model, top_n=3)
        retriever = FunnelRetriever.from_stages(bm25_retriever, reranker)
    """

    llm: Any = Field(description="LangChain chat model/LLM, funnel_core LLM provider, or a "
                                 "causal-LM name/folder.")

    def _stage_value(self, name: str, value: Any) -> Any:
        return stage_llm(value, self.timeout) if name == "llm" else value

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "timeout" and not isinstance(self.llm, (str, LLM)):
            self.stage.llm = self._stage_value("llm", self.llm)  # the new timeout
