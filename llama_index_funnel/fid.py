"""LlamaIndex node postprocessors for attention-based post-ranking (FunnelRAG stage 3):
:class:`FiDAttentionRerank` (a FiD T5 reader's cross-attention, eq. 3) and
:class:`AttentionLMRerank` (a causal LM's calibrated query-to-passage attention, ICR style).
"""

from __future__ import annotations

from funnel_core.rerank.fields import AttentionLMFields, FiDAttentionFields
from llama_index_funnel._base import StagePostprocessor

__all__ = ["FiDAttentionRerank", "AttentionLMRerank"]


class FiDAttentionRerank(FiDAttentionFields, StagePostprocessor):
    """Rerank nodes by the cross-attention of a FiD (T5) reader: a
    :class:`~funnel_core.rerank.fid.FiDAttentionScorer`."""


class AttentionLMRerank(AttentionLMFields, StagePostprocessor):
    """Rerank nodes by a causal LM's calibrated query-to-passage attention: an
    :class:`~funnel_core.rerank.attention_lm.AttentionLMScorer`."""
