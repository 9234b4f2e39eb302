"""Former name of :mod:`langchain_funnel.rerank` (the module is named as in
``llama_index_funnel``); kept so existing imports still work."""

from langchain_funnel.rerank import CrossEncoderReranker, LaterChunkingTransformer, MonoT5Reranker

__all__ = ["CrossEncoderReranker", "MonoT5Reranker", "LaterChunkingTransformer"]
