"""RankRAG reranking for LlamaIndex: :class:`RankRAGRerank`, a node postprocessor scoring each
(query, node) by P("True") of an LLM judge.

The LLM can be a LlamaIndex ``LLM`` (text only: RankRAG parses its replies), a ``funnel_core``
provider, or a hub name / folder of a local causal LM (RankRAG reads True/False logits).
"""

from __future__ import annotations

from typing import Any

from llama_index.core.bridge.pydantic import Field
from llama_index.core.llms.llm import LLM as LlamaIndexBaseLLM

from funnel_core.rerank.fields import RankRAGFields
from llama_index_funnel._base import StagePostprocessor
from llama_index_funnel.llm import stage_llm

__all__ = ["RankRAGRerank"]


class RankRAGRerank(RankRAGFields, StagePostprocessor):
    """RankRAG reranking as a LlamaIndex node postprocessor (sync + async, rerank events): a
    :class:`~funnel_core.rerank.rankrag.RankRAGScorer`; ``llm`` may also be a LlamaIndex ``LLM``.

    Example::

        from llama_index.core.query_engine import RetrieverQueryEngine
        rerank = RankRAGRerank(llm=smollm2_path(), gguf_file=SMOLLM2_GGUF, top_n=5)
        engine = RetrieverQueryEngine.from_args(retriever, node_postprocessors=[rerank])
    """

    llm: Any = Field(description="LlamaIndex LLM, funnel_core LLM provider, or a causal-LM "
                                 "name/folder.")

    @classmethod
    def class_name(cls) -> str:
        return "RankRAGRerank"

    def _model_name(self) -> str:
        return self.llm if isinstance(self.llm, str) else type(self.llm).__name__

    def _stage_value(self, name: str, value: Any) -> Any:
        return stage_llm(value, self.timeout) if name == "llm" else value

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "timeout" and isinstance(self.llm, LlamaIndexBaseLLM):
            self.stage.llm = self._stage_value("llm", self.llm)  # the new timeout
