"""funnel-rag core: framework-agnostic retrieval stages from FunnelRAG, Mix-of-Granularity,
FB-RAG, RankRAG and "Searching for Best Practices in RAG".

Heavy libraries (torch, transformers, sentence-transformers, FlagEmbedding) are imported lazily
inside the code that needs them; importing ``funnel_core`` is cheap.
"""

from funnel_core.bm25 import BM25Index, BM25Retrieve, bm25_scores
from funnel_core.errors import FunnelError, ModelLoadError, PersistError
from funnel_core.funnel import FunctionStage, Funnel, FunnelResult, Stage, as_stage
from funnel_core.funnelrag.chunking import LaterChunking, OpenClusters
from funnel_core.text import split_sentences, word_windows
from funnel_core.units import StageRecord, Trace, Unit
from funnel_core.version import __version__

__all__ = [
    "BM25Index", "BM25Retrieve", "bm25_scores",
    "FunnelError", "ModelLoadError", "PersistError",
    "FunctionStage", "Funnel", "FunnelResult", "Stage", "as_stage",
    "LaterChunking", "OpenClusters", "split_sentences", "word_windows",
    "StageRecord", "Trace", "Unit", "__version__",
]
