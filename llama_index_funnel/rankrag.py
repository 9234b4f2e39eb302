"""RankRAG reranking for LlamaIndex: :class:`RankRAGRerank`, a node postprocessor scoring each
(query, node) by P("True") of an LLM judge."""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from funnel_core.rerank.fields import RankRAGFields
from llama_index_funnel._base import StagePostprocessor
from llama_index_funnel.llm import stage_llm

__all__ = ["RankRAGRerank"]


class RankRAGRerank(RankRAGFields, StagePostprocessor):
    """RankRAG reranking as a LlamaIndex node postprocessor (sync + async, rerank events): a
    :class:`~funnel_core.rerank.rankrag.RankRAGScorer`; ``llm`` may also be a LlamaIndex ``LLM``
    (read as text: RankRAG parses its replies; a local causal LM named by hub name/folder is
    scored from its True/False logits).

    Example::

        from llama_index.core.query_engine import RetrieverQueryEngine
        rerank = RankRAGRerank(llm=smollm2_path(), gguf_file=SMOLLM2_GGUF, top_n=5)
        engine = RetrieverQueryEngine.from_args(retriever, node_postprocessors=[rerank])
    """

    wrap_llm: ClassVar[Callable[[Any, Any], Any]] = staticmethod(stage_llm)

    @classmethod
    def class_name(cls) -> str:
        return "RankRAGRerank"

    def _model_name(self) -> str:
        return self.llm if isinstance(self.llm, str) else type(self.llm).__name__
