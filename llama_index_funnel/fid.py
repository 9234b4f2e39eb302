"""LlamaIndex node postprocessors for attention-based post-ranking (FunnelRAG stage 3).

* :class:`FiDAttentionRerank` — a Fusion-in-Decoder T5 reader's cross-attention (eq. 3).
* :class:`AttentionLMRerank` — a causal LM's calibrated query-to-passage attention (ICR style).

Both delegate to :mod:`funnel_core.rerank.fid` / :mod:`funnel_core.rerank.attention_lm`; the
model loads on first use. Node titles are read from ``node.metadata["title"]``.
"""

from __future__ import annotations

from funnel_core.config import AttentionLMConfig, FiDAttentionConfig, adapter_base
from llama_index_funnel._base import StagePostprocessor

__all__ = ["FiDAttentionRerank", "AttentionLMRerank"]


class FiDAttentionRerank(adapter_base(FiDAttentionConfig, StagePostprocessor)):  # type: ignore[misc]
    """Rerank nodes by the cross-attention of a FiD (T5) reader; the fields are those of
    :class:`funnel_core.config.FiDAttentionConfig`."""

    @classmethod
    def class_name(cls) -> str:
        return "FiDAttentionRerank"


class AttentionLMRerank(adapter_base(AttentionLMConfig, StagePostprocessor)):  # type: ignore[misc]
    """Rerank nodes by a causal LM's calibrated query-to-passage attention; the fields are those
    of :class:`funnel_core.config.AttentionLMConfig`."""

    @classmethod
    def class_name(cls) -> str:
        return "AttentionLMRerank"
