"""LangChain document compressors for attention-based post-ranking (FunnelRAG stage 3); titles
are read from ``metadata["title"]``."""

from __future__ import annotations

from funnel_core.rerank.fields import AttentionLMFields, FiDAttentionFields
from langchain_funnel._base import StageCompressor

__all__ = ["FiDAttentionReranker", "AttentionLMReranker"]


class FiDAttentionReranker(FiDAttentionFields, StageCompressor):
    """Rerank documents by the cross-attention of a FiD (T5) reader: a
    :class:`~funnel_core.rerank.fid.FiDAttentionScorer`."""


class AttentionLMReranker(AttentionLMFields, StageCompressor):
    """Rerank documents by a causal LM's calibrated query-to-passage attention: an
    :class:`~funnel_core.rerank.attention_lm.AttentionLMScorer`."""
