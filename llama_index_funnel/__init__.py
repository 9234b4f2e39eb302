"""LlamaIndex-native funnel-rag components (retrievers, node postprocessors, node parsers,
query transforms). Thin adapters over :mod:`funnel_core`."""

from llama_index_funnel._base import StagePostprocessor, UnitRetriever, nodes_to_units, units_to_nodes
from llama_index_funnel.best_practices import (
    ExtractiveCompressorPostprocessor,
    HybridRetriever,
    HyDETransform,
    QueryClassifierGate,
    QueryClassifierQueryEngine,
    RepackPostprocessor,
    SentenceEmbedderEmbedding,
)
from llama_index_funnel.dense import DenseRetriever
from llama_index_funnel.fbrag import ForwardLookupQueryBundle, ForwardLookupQueryTransform, ForwardLookupRetriever
from llama_index_funnel.fid import AttentionLMRerank, FiDAttentionRerank
from llama_index_funnel.funnel import FunnelRetriever, PostprocessorStage, RetrieverStage
from llama_index_funnel.granularity import (
    GraphGranularityNodeParser,
    MixOfGranularityRetriever,
    MultiGranularityNodeParser,
)
from llama_index_funnel.llm import LlamaIndexLLM
from llama_index_funnel.rankrag import RankRAGRerank
from llama_index_funnel.rerank import CrossEncoderRerank, LaterChunkingPostprocessor, MonoT5Rerank
from llama_index_funnel.retrievers import BM25Retriever, ClusteredBM25Retriever

__all__ = ["DenseRetriever", "LlamaIndexLLM", "ForwardLookupQueryBundle", "ForwardLookupQueryTransform", "ForwardLookupRetriever", "RankRAGRerank", "AttentionLMRerank", "FiDAttentionRerank", "CrossEncoderRerank", "LaterChunkingPostprocessor", "MonoT5Rerank", "ExtractiveCompressorPostprocessor", "HybridRetriever", "HyDETransform", "QueryClassifierGate", "QueryClassifierQueryEngine", "RepackPostprocessor", "SentenceEmbedderEmbedding", "GraphGranularityNodeParser", "MixOfGranularityRetriever", "MultiGranularityNodeParser", "FunnelRetriever", "PostprocessorStage", "RetrieverStage", "BM25Retriever", "ClusteredBM25Retriever", "StagePostprocessor", "UnitRetriever",
           "nodes_to_units", "units_to_nodes"]
