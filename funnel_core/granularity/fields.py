"""The user-facing settings of the Mix-of-Granularity splitters' adapters, declared once for
LlamaIndex and LangChain.

Each model below lists the settings of one core splitter as pydantic fields (name, type, default,
description); the LlamaIndex node parser and the LangChain text splitter of that splitter both
inherit it, so editors, mypy and the docs see every field and each default is written once.
``tests/adapters/test_adapter_fields.py`` checks every field against the splitter's constructor.
Imported only by the adapter packages: pydantic comes with both frameworks, and the splitters
themselves do not need it.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional

from pydantic import BaseModel, Field

from funnel_core.granularity.graph import GraphGranularityBuilder
from funnel_core.granularity.levels import MultiGranularityChunker

__all__ = ["MultiGranularityFields", "GraphGranularityFields", "MixOfGranularityFields"]


class MultiGranularityFields(BaseModel):
    """The settings of :class:`~funnel_core.granularity.levels.MultiGranularityChunker` (MoG's
    nested levels), for both adapters."""

    stage_class: ClassVar[type] = MultiGranularityChunker

    chunk_size: int = Field(default=64, description='Finest chunk size in words (level 1).')
    n_gra: int = Field(
        default=5, description='Number of granularity levels; a level-j chunk is two adjacent '
                               'level-(j-1) chunks of the same document.')
    sentence_aware: bool = Field(default=True, description='End finest chunks at sentence ends.')


class GraphGranularityFields(BaseModel):
    """The settings of :class:`~funnel_core.granularity.graph.GraphGranularityBuilder` (MoGG's
    sentence graph), for both adapters."""

    stage_class: ClassVar[type] = GraphGranularityBuilder

    sentences_per_node: int = Field(
        default=2, description='Sentences per graph node (1-2 in the paper).')
    n_gra: int = Field(
        default=5, description='Number of hop ranges (levels) the retriever will use.')
    k_graph: int = Field(default=3, description='Edges per node (its most BM25-similar nodes).')
    t_graph: float = Field(
        default=0.3, description='Minimum normalised BM25 similarity of an edge, in [0, 1].')
    block_size: int = Field(
        default=512, description='Nodes scored per block when building the kNN graph (memory bound).')
    max_df: Optional[float] = Field(
        default=None, description='Ignore terms in more than this share of nodes when linking '
                                  '(None: keep all).')
    bm25: Optional[dict[str, Any]] = Field(
        default=None, description='BM25 settings of the similarity (k1, b, ...).')


class MixOfGranularityFields(BaseModel):
    """The settings of both adapters' ``MixOfGranularityRetriever`` besides the number of results
    (``similarity_top_k`` in LlamaIndex, ``k`` in LangChain): those of the
    :class:`~funnel_core.granularity.retrieval.MixOfGranularityRetrieve` it holds (an edit is
    forwarded to it, validated and honoured at the next query), and ``n_gra`` (an edit rebuilds
    the stage; the per-level BM25 indexes are rebuilt only when ``n_gra`` or ``bm25`` changes).
    The LangChain retriever inherits them; the LlamaIndex one, a plain class, takes them as
    keyword arguments with these defaults."""

    #: The fields forwarded to the stage's setting of the same name.
    forwarded: ClassVar[tuple[str, ...]] = ("router", "k_r", "normalize", "level_margin", "bm25")

    router: Optional[Any] = Field(
        default=None, description='A trained GranularityRouter; None: uniform level weights (the '
                                  'finest level is returned).')
    k_r: int = Field(default=3, description='Units BM25 retrieves per level before mixing (paper: 3).')
    normalize: str = Field(
        default="none", description='Per-level BM25 scores: "none" (raw, equation 1) or "max" '
                                    "(divided by the level's best).")
    level_margin: float = Field(
        default=0.0, description="Prefer a finer level unless a coarser one's router weight is "
                                 "higher by more than this, in [0, 1] (0: the paper's argmax).")
    n_gra: int = Field(default=5, description='Hop ranges when the units are graph nodes (a '
                                              "hierarchy's levels come from its units).")
    bm25: Optional[dict] = Field(default=None, description='BM25 settings of the per-level indexes.')
