"""LlamaIndex node postprocessors for FunnelRAG's pre-ranking stage: :class:`CrossEncoderRerank`,
:class:`MonoT5Rerank` and :class:`LaterChunkingPostprocessor` (splits retrieved nodes into
passages, so a reranker placed after it scores finer units). Each holds a ``funnel_core`` stage
(:class:`~llama_index_funnel._base.StagePostprocessor`); put them in ``node_postprocessors``.
"""

from __future__ import annotations

from funnel_core.funnelrag.fields import LaterChunkingFields
from funnel_core.rerank.fields import CrossEncoderFields, MonoT5Fields
from llama_index_funnel._base import StagePostprocessor

__all__ = ["CrossEncoderRerank", "MonoT5Rerank", "LaterChunkingPostprocessor"]


class CrossEncoderRerank(CrossEncoderFields, StagePostprocessor):
    """Rerank nodes with a cross-encoder: a :class:`~funnel_core.rerank.cross_encoder.CrossEncoderScorer`.

    Scores are sigmoid probabilities (``normalize=True``), the scale of LlamaIndex's
    ``SentenceTransformerRerank``, so ``SimilarityPostprocessor(similarity_cutoff=0.5)`` after it
    keeps the nodes the model calls relevant.

    Example::

        rerank = CrossEncoderRerank(model="BAAI/bge-reranker-v2-m3", library="flagembedding",
                                    top_n=8, device="cuda")
        engine = RetrieverQueryEngine.from_args(retriever, node_postprocessors=[rerank])
    """


class MonoT5Rerank(MonoT5Fields, StagePostprocessor):
    """Rerank nodes with monoT5: a :class:`~funnel_core.rerank.monot5.MonoT5Scorer`."""


class LaterChunkingPostprocessor(LaterChunkingFields, StagePostprocessor):
    """Split retrieved nodes into ~``words``-word passages (FunnelRAG section 3.1.3): a
    :class:`~funnel_core.funnelrag.chunking.LaterChunking` stage.

    Each passage is a ``TextNode`` with a ``PARENT`` relationship to its node (and the node's
    ``SOURCE``, metadata and excluded keys), emitted parent by parent in rank order.
    """
