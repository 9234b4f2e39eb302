"""Model-based reranking stages (cross-encoders, monoT5, FiD attention, RankRAG)."""

from funnel_core.rerank.base import (
    LazyModel,
    Reranker,
    load_pretrained,
    resolve_device,
    sigmoid,
    tokenizer_lock,
)

__all__ = ["Reranker", "LazyModel", "load_pretrained", "resolve_device", "sigmoid", "tokenizer_lock"]
