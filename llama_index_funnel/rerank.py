"""LlamaIndex node postprocessors for FunnelRAG's pre-ranking stage.

* :class:`CrossEncoderRerank` — cross-encoder reranking (sentence-transformers, FlagEmbedding or
  plain transformers backend) with ``batch_size``, ``device``, ``max_length``, ``normalize``,
  ``score_threshold`` and ``top_n``;
* :class:`MonoT5Rerank` — monoT5 reranking (``true``/``false`` logits of a T5 model);
* :class:`LaterChunkingPostprocessor` — FunnelRAG's later chunking: splits retrieved nodes into
  ~100-word passages that point to their parent node (``NodeRelationship.PARENT``) and carry the
  parent's score, so a reranker placed after it scores finer units.

All three are plain ``BaseNodePostprocessor`` objects: put them in ``node_postprocessors`` of any
query engine. They copy nodes (never mutate the retriever's), keep earlier scores in
flat ``funnel_score_<stage>`` metadata keys (hidden from LLM and embedder), emit ``ReRankStartEvent``/``ReRankEndEvent``, and have a real async path.
Models load lazily, on the first query.
"""

from __future__ import annotations

from funnel_core.config import CrossEncoderConfig, LaterChunkingConfig, MonoT5Config, adapter_base
from llama_index_funnel._base import StagePostprocessor

__all__ = ["CrossEncoderRerank", "MonoT5Rerank", "LaterChunkingPostprocessor"]


class CrossEncoderRerank(adapter_base(CrossEncoderConfig, StagePostprocessor)):  # type: ignore[misc]
    """Rerank nodes with a cross-encoder (FunnelRAG's pre-ranker).

    The fields are those of :class:`funnel_core.config.CrossEncoderConfig`.

    Example::

        rerank = CrossEncoderRerank(model="BAAI/bge-reranker-v2-m3", backend="flagembedding",
                                    top_n=8, device="cuda")
        engine = RetrieverQueryEngine.from_args(retriever, node_postprocessors=[rerank])
    """

    @classmethod
    def class_name(cls) -> str:
        return "CrossEncoderRerank"

    def _model_name(self) -> str:
        return self.stage.model_name  # type: ignore[attr-defined]


class MonoT5Rerank(adapter_base(MonoT5Config, StagePostprocessor)):  # type: ignore[misc]
    """Rerank nodes with monoT5 (``castorini/monot5-base-msmarco`` by default); the fields are
    those of :class:`funnel_core.config.MonoT5Config`."""

    @classmethod
    def class_name(cls) -> str:
        return "MonoT5Rerank"


class LaterChunkingPostprocessor(adapter_base(LaterChunkingConfig, StagePostprocessor)):  # type: ignore[misc]
    """Split retrieved nodes into ~``words``-word passages (FunnelRAG section 3.1.3).

    Each passage is a ``TextNode`` with a ``PARENT`` relationship to its node (and the node's
    ``SOURCE``), the parent's score, its position as ``funnel_...`` metadata keys, and the parent's
    metadata and excluded keys. Passages are emitted parent by parent in the parents' rank
    order. The fields are those of :class:`funnel_core.config.LaterChunkingConfig`.
    """

    @classmethod
    def class_name(cls) -> str:
        return "LaterChunkingPostprocessor"
