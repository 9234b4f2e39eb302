"""Offline builds of big indexes: the BM25 kNN graph and clustering, batch embedding and batch
pair scoring, on the local engine or on Ray Data (:mod:`funnel_core.offline.ray`).

* :mod:`~funnel_core.offline.build`: the functions below (``funnel build`` calls them);
* :mod:`~funnel_core.offline.shards`: the Parquet shard tables both engines write;
* :mod:`~funnel_core.offline.ray`: the Ray engine (the only module that imports Ray).
"""

from funnel_core.offline.build import (
    ENGINES,
    BuildReport,
    apply_pair_scores,
    build_index,
    dense_index_from_shards,
    embed_texts,
    knn_graph,
    load_build,
    read_embeddings,
    read_pair_scores,
    score_groups,
)

__all__ = ["ENGINES", "BuildReport", "knn_graph", "build_index", "load_build", "embed_texts", "read_embeddings",
           "dense_index_from_shards", "score_groups", "read_pair_scores", "apply_pair_scores"]
