"""RankRAG reranking for LlamaIndex: :class:`RankRAGRerank`."""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from funnel_core.rerank.fields import RankRAGFields
from llama_index_funnel._base import StagePostprocessor
from llama_index_funnel.llm import stage_llm

__all__ = ["RankRAGRerank"]


class RankRAGRerank(RankRAGFields, StagePostprocessor):
    """Score each (query, node) by P("True") of an LLM judge: a
    :class:`~funnel_core.rerank.rankrag.RankRAGScorer`; ``llm`` may also be a LlamaIndex ``LLM``.

    Example::

        rerank = RankRAGRerank(llm=smollm2_path(), gguf_file=SMOLLM2_GGUF, top_n=5)
        engine = RetrieverQueryEngine.from_args(retriever, node_postprocessors=[rerank])
    """

    wrap_llm: ClassVar[Callable[[Any, Any], Any]] = staticmethod(stage_llm)
