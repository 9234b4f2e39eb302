"""LangChain document compressors for attention-based post-ranking (FunnelRAG stage 3).

* :class:`FiDAttentionReranker` — a Fusion-in-Decoder T5 reader's cross-attention (eq. 3).
* :class:`AttentionLMReranker` — a causal LM's calibrated query-to-passage attention (ICR style).

Both delegate to :mod:`funnel_core.rerank.fid` / :mod:`funnel_core.rerank.attention_lm`; the
model loads on first use. Document titles are read from ``Document.metadata["title"]``.
"""

from __future__ import annotations

from funnel_core.config import AttentionLMConfig, FiDAttentionConfig, adapter_base
from langchain_funnel._base import StageCompressor

__all__ = ["FiDAttentionReranker", "AttentionLMReranker"]


class FiDAttentionReranker(adapter_base(FiDAttentionConfig, StageCompressor)):  # type: ignore[misc]
    """Rerank documents by the cross-attention of a FiD (T5) reader; the fields are those of
    :class:`funnel_core.config.FiDAttentionConfig`."""


class AttentionLMReranker(adapter_base(AttentionLMConfig, StageCompressor)):  # type: ignore[misc]
    """Rerank documents by a causal LM's calibrated query-to-passage attention; the fields are
    those of :class:`funnel_core.config.AttentionLMConfig`."""
