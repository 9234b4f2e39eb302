"""LlamaIndex node postprocessors for FunnelRAG's pre-ranking stage: :class:`CrossEncoderRerank`,
:class:`MonoT5Rerank` and :class:`LaterChunkingPostprocessor` (splits retrieved nodes into
passages, so a reranker placed after it scores finer units).

All three are plain ``BaseNodePostprocessor`` objects: put them in ``node_postprocessors`` of any
query engine. They copy nodes (never mutate the retriever's), keep earlier scores in flat
``funnel_score_<stage>`` metadata keys (hidden from LLM and embedder), emit
``ReRankStartEvent``/``ReRankEndEvent``, and have a real async path. Models load lazily, on the
first query. Each field is a setting of the ``funnel_core`` stage the postprocessor holds
(``.stage``); an edit is forwarded to it and honoured at the next call.
"""

from __future__ import annotations

from funnel_core.funnelrag.fields import LaterChunkingFields
from funnel_core.rerank.fields import CrossEncoderFields, MonoT5Fields
from llama_index_funnel._base import StagePostprocessor

__all__ = ["CrossEncoderRerank", "MonoT5Rerank", "LaterChunkingPostprocessor"]


class CrossEncoderRerank(CrossEncoderFields, StagePostprocessor):
    """Rerank nodes with a cross-encoder (FunnelRAG's pre-ranker; a sentence-transformers,
    FlagEmbedding or plain transformers backend): a
    :class:`~funnel_core.rerank.cross_encoder.CrossEncoderScorer`.

    Scores are sigmoid probabilities in (0, 1) by default (``normalize=True``), the scale of
    LlamaIndex's ``SentenceTransformerRerank``, so ``SimilarityPostprocessor(similarity_cutoff=0.5)``
    after it keeps the nodes the model calls relevant; ``normalize=False`` gives raw logits (the
    order is the same either way).

    Example::

        rerank = CrossEncoderRerank(model="BAAI/bge-reranker-v2-m3", library="flagembedding",
                                    top_n=8, device="cuda")
        engine = RetrieverQueryEngine.from_args(retriever, node_postprocessors=[rerank])
    """

    @classmethod
    def class_name(cls) -> str:
        return "CrossEncoderRerank"

    def _model_name(self) -> str:
        return self.stage.model_name  # type: ignore[union-attr]


class MonoT5Rerank(MonoT5Fields, StagePostprocessor):
    """Rerank nodes with monoT5 (the ``true``/``false`` logits of a T5 model,
    ``castorini/monot5-base-msmarco`` by default): a :class:`~funnel_core.rerank.monot5.MonoT5Scorer`."""

    @classmethod
    def class_name(cls) -> str:
        return "MonoT5Rerank"


class LaterChunkingPostprocessor(LaterChunkingFields, StagePostprocessor):
    """Split retrieved nodes into ~``words``-word passages (FunnelRAG section 3.1.3).

    Each passage is a ``TextNode`` with a ``PARENT`` relationship to its node (and the node's
    ``SOURCE``), the parent's score, its position as ``funnel_...`` metadata keys, and the
    parent's metadata and excluded keys. Passages are emitted parent by parent in the parents'
    rank order (a :class:`~funnel_core.funnelrag.chunking.LaterChunking` stage).
    """

    @classmethod
    def class_name(cls) -> str:
        return "LaterChunkingPostprocessor"
