"""FunnelRAG (Zhao et al., 2024): coarse-to-fine retrieval for large corpora.

* :mod:`~funnel_core.funnelrag.clustering`: Algorithm 1 (documents clustered into ~4K-token units)
  and the adjacency builders it runs on (links, BM25 kNN, embedding kNN);
* :mod:`~funnel_core.funnelrag.clustered_index`: BM25 over the clusters, opened into documents;
* :mod:`~funnel_core.funnelrag.chunking`: later chunking (section 3.1.3) and opening clusters;
* :mod:`~funnel_core.funnelrag.presets`: the whole funnel in one call;
* :mod:`~funnel_core.funnelrag.early_exit`: skip the post-ranker when the pre-ranker is confident
  (ours).

Pre-ranking (cross-encoder, monoT5) and post-ranking (FiD cross-attention) are rerankers, in
:mod:`funnel_core.rerank`; L2G distillation and FiD training are in :mod:`funnel_core.train`.
"""

from funnel_core.funnelrag.chunking import LaterChunking, OpenClusters
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index, ClusteredBM25Retrieve
from funnel_core.funnelrag.clustering import cluster_documents
from funnel_core.funnelrag.early_exit import ConfidentExit
from funnel_core.funnelrag.presets import funnelrag

__all__ = ["ClusteredBM25Index", "ClusteredBM25Retrieve", "ConfidentExit", "LaterChunking", "OpenClusters", "cluster_documents",
           "funnelrag"]
