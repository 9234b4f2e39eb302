"""Mix-of-Granularity (MoG) and Mix-of-Granularity-Graph (MoGG).

* :mod:`~funnel_core.granularity.levels` — nested granularity levels of a corpus.
* :mod:`~funnel_core.granularity.graph` — MoGG's sentence graph with hop-range levels.
* :mod:`~funnel_core.granularity.router` — the MLP router and its soft-label training.
* :mod:`~funnel_core.granularity.retrieval` — the MoG selection rule as a stage.
"""

from funnel_core.granularity.graph import GranularityGraph, GraphGranularityBuilder, bm25_knn_graph
from funnel_core.granularity.levels import (
    GranularityHierarchy,
    GranularityStructure,
    MultiGranularityChunker,
    level_name,
)
from funnel_core.granularity.retrieval import (
    MOG_PRESETS,
    GranularityBM25,
    MixOfGranularityRetrieve,
    choose_level,
)
from funnel_core.granularity.router import (
    GranularityRouter,
    RouterNotTrainedError,
    level_choice_counts,
    level_similarities,
    soft_labels,
)

__all__ = [
    "GranularityStructure", "GranularityHierarchy", "MultiGranularityChunker", "level_name",
    "GranularityGraph", "GraphGranularityBuilder", "bm25_knn_graph",
    "GranularityBM25", "MixOfGranularityRetrieve", "MOG_PRESETS", "choose_level",
    "GranularityRouter", "RouterNotTrainedError", "level_similarities", "soft_labels",
    "level_choice_counts",
]
