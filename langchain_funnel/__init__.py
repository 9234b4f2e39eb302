"""LangChain-native funnel-rag components (retrievers, document compressors, text splitters,
runnables). Thin adapters over :mod:`funnel_core`."""

from langchain_funnel._base import StageCompressor, UnitRetriever, documents_to_units, units_to_documents
from langchain_funnel.best_practices import (
    ExtractiveCompressor,
    HybridRetriever,
    HyDERetriever,
    RepackTransformer,
    SentenceEmbedderEmbeddings,
    hyde_query,
    query_classifier_branch,
)
from langchain_funnel.compression import CompressionRetriever
from langchain_funnel.dense import DenseRetriever
from langchain_funnel.fbrag import ForwardLookupRetriever
from langchain_funnel.fid import AttentionLMReranker, FiDAttentionReranker
from langchain_funnel.funnel import FunnelRetriever, LCCompressorStage, LCRetrieverStage, LCRunnableStage, rerank_chain
from langchain_funnel.granularity import (
    GraphGranularitySplitter,
    MixOfGranularityRetriever,
    MultiGranularityTextSplitter,
)
from langchain_funnel.llm import LangChainLLM
from langchain_funnel.rankrag import RankRAGReranker
from langchain_funnel.rerank import CrossEncoderReranker, LaterChunkingTransformer, MonoT5Reranker
from langchain_funnel.retrievers import BM25Retriever, ClusteredBM25Retriever

__all__ = ["DenseRetriever", "LangChainLLM", "ForwardLookupRetriever", "RankRAGReranker", "AttentionLMReranker", "FiDAttentionReranker", "CompressionRetriever", "CrossEncoderReranker", "LaterChunkingTransformer", "MonoT5Reranker", "ExtractiveCompressor", "HybridRetriever", "HyDERetriever", "RepackTransformer", "SentenceEmbedderEmbeddings", "hyde_query", "query_classifier_branch", "GraphGranularitySplitter", "MixOfGranularityRetriever", "MultiGranularityTextSplitter", "FunnelRetriever", "LCCompressorStage", "LCRetrieverStage", "LCRunnableStage", "BM25Retriever", "ClusteredBM25Retriever", "StageCompressor", "UnitRetriever",
           "documents_to_units", "rerank_chain", "units_to_documents"]
