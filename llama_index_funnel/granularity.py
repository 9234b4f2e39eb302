"""Mix-of-Granularity for LlamaIndex: node parsers and the MoG retriever.

* :class:`MultiGranularityNodeParser` — ``n_gra`` nested levels per document with
  ``NodeRelationship.PARENT/CHILD``, so ``get_leaf_nodes``, ``get_root_nodes`` and
  ``AutoMergingRetriever`` work on its output, as on ``HierarchicalNodeParser``'s.
* :class:`GraphGranularityNodeParser` — MoGG's 1-2 sentence nodes; the BM25 kNN edges travel in
  ``metadata["funnel_graph_neighbors_json"]`` (a JSON list of ids, hidden from the LLM and the
  embedder, kept by flat-metadata vector stores).
* :class:`MixOfGranularityRetriever` — the MoG selection rule over either parser's nodes, with
  the router weights and the chosen level in each result's metadata.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.callbacks import CallbackManager
from llama_index.core.node_parser.interface import NodeParser
from llama_index.core.schema import (
    BaseNode,
    MetadataMode,
    NodeRelationship,
    TextNode,
)
from llama_index.core.utils import get_tqdm_iterable

from funnel_core.config import (
    ConfiguredAdapter,
    GraphGranularityConfig,
    MixOfGranularityConfig,
    MultiGranularityConfig,
    adapter_base,
    config_attributes,
    config_of,
)
from funnel_core.errors import check_positive_int
from funnel_core.granularity.graph import GraphGranularityBuilder
from funnel_core.granularity.levels import GranularityStructure, MultiGranularityChunker
from funnel_core.granularity.retrieval import MixOfGranularityRetrieve, mog_stage
from funnel_core.granularity.router import GranularityRouter
from funnel_core.units import Unit, read_funnel_metadata
from llama_index_funnel._base import UnitRetriever, annotate_node, node_to_unit

__all__ = ["MultiGranularityNodeParser", "GraphGranularityNodeParser", "MixOfGranularityRetriever"]

def _doc_unit(node: BaseNode) -> Unit:
    return Unit(id=node.node_id, text=node.get_content(metadata_mode=MetadataMode.NONE),
                metadata=read_funnel_metadata(node.metadata)[0], level="document")


def _text_node(unit: Unit, source: BaseNode, drop: Sequence[str] = ()) -> TextNode:
    """A parsed node: the source's metadata keys and excluded keys as they were, the structure
    (granularity, doc_id, position, graph neighbours, ...) as flat ``funnel_...`` keys (hidden
    from the LLM and the embedder)."""
    user = read_funnel_metadata(source.metadata)[0]
    if drop:
        unit = Unit(id=unit.id, text=unit.text, parent_id=unit.parent_id, level=unit.level,
                    funnel={k: v for k, v in unit.funnel.items() if k not in drop})
    node = TextNode(id_=unit.id, text=unit.text,
                    excluded_llm_metadata_keys=list(source.excluded_llm_metadata_keys),
                    excluded_embed_metadata_keys=list(source.excluded_embed_metadata_keys))
    annotate_node(node, unit, user)
    node.relationships[NodeRelationship.SOURCE] = source.as_related_node_info()
    return node


#: IngestionPipeline's worker functions: each runs the transformations on one batch of nodes.
_PIPELINE_WORKERS = frozenset({"_run_transformations_worker", "_arun_transformations_worker"})


def _refuse_batched_ingestion(name: str) -> None:
    """Raise when called from an ``IngestionPipeline(num_workers > 1)`` worker process.

    A graph parser links nodes across all the documents of one call; the pipeline splits the
    documents into one batch per worker, so each worker would build its own, sparser graph (84
    instead of 108 edges on the same documents) without any sign of it.
    """
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        if (frame.f_code.co_name in _PIPELINE_WORKERS
                and frame.f_globals.get("__name__") == "llama_index.core.ingestion.pipeline"):
            raise ValueError(
                f"{name} links nodes across all the documents it parses at once, but "
                "IngestionPipeline(num_workers > 1) hands each worker process a separate batch, "
                "which would build a separate, sparser graph per batch. Run the pipeline with "
                "num_workers=None (or 1), or parse first: nodes = "
                f"{name}(...).get_nodes_from_documents(documents), then run the pipeline's "
                "other transformations on those nodes with workers.")
        frame = frame.f_back  # type: ignore[assignment]


class _ConfiguredNodeParser(ConfiguredAdapter, NodeParser):
    """A node parser whose settings are the fields of a core config (see ``adapter_base``);
    :attr:`stage` is the core splitter built from their current values."""

    _stage: Any = PrivateAttr(default=None)
    _stage_key: Any = PrivateAttr(default=None)

    def model_post_init(self, __context: Any) -> None:
        _ = self.stage  # validates every setting now, naming the value


class MultiGranularityNodeParser(adapter_base(MultiGranularityConfig,  # type: ignore[misc]
                                              _ConfiguredNodeParser)):
    """Split documents into ``n_gra`` nested granularity levels (MoG section 3.2).

    Level 1 holds sentence-aware chunks of about ``chunk_size`` words; each level-``j`` node is
    two adjacent level-``j - 1`` nodes of the same document. Every node gets
    ``metadata["funnel_granularity"]`` (1 = finest), ``funnel_doc_id``, ``funnel_doc_index``,
    ``funnel_position``, ``funnel_level`` and ``funnel_parent_id`` (flat scalars), a
    ``PARENT`` relationship (below the top level) and ``CHILD`` relationships (above level 1).
    Put *all* nodes in the docstore and index the leaves (``get_leaf_nodes``) for
    ``AutoMergingRetriever``; pass all nodes to :class:`MixOfGranularityRetriever`.

    The settings (``chunk_size``, ``n_gra``, ``sentence_aware``) are the fields of
    :class:`funnel_core.config.MultiGranularityConfig`. A document shorter than one finest chunk
    yields one node per level with the same text.
    """

    include_prev_next_rel: bool = Field(
        default=False, description="PREV/NEXT links (off: consecutive nodes may be of different levels).")

    @classmethod
    def class_name(cls) -> str:
        return "MultiGranularityNodeParser"

    def _parse_nodes(self, nodes: Sequence[BaseNode], show_progress: bool = False,
                     **kwargs: Any) -> List[BaseNode]:
        chunker: MultiGranularityChunker = self.stage
        out: List[BaseNode] = []
        for di, doc in enumerate(get_tqdm_iterable(nodes, show_progress, "Parsing granularity levels")):
            levels = chunker.split_document(_doc_unit(doc), di)
            by_id: Dict[str, TextNode] = {}
            for level in levels:
                for unit in level:
                    by_id[unit.id] = _text_node(unit, doc, drop=("child_ids",))
            for level in levels:
                for unit in level:
                    node = by_id[unit.id]
                    if unit.parent_id is not None:
                        node.relationships[NodeRelationship.PARENT] = \
                            by_id[unit.parent_id].as_related_node_info()
                    kids = unit.funnel.get("child_ids")
                    if kids:
                        node.relationships[NodeRelationship.CHILD] = \
                            [by_id[k].as_related_node_info() for k in kids]
                    out.append(node)
        return out


class GraphGranularityNodeParser(adapter_base(GraphGranularityConfig,  # type: ignore[misc]
                                              _ConfiguredNodeParser)):
    """Split documents into MoGG graph nodes of ``sentences_per_node`` sentences and link them.

    Each node is linked to its ``k_graph`` most BM25-similar nodes (anywhere in the parsed
    documents) whose normalised similarity reaches ``t_graph``; edges are undirected and stored
    as ``metadata["funnel_graph_neighbors_json"]`` (a JSON list of ids) and
    ``metadata["funnel_graph_weights_json"]``. The graph spans
    the documents of one call, so parse the whole corpus at once. ``last_build_seconds`` is the
    edge-building time of the latest call. With no pair above ``t_graph`` the nodes get empty
    neighbour lists (and a warning): every hop range is then the node alone. The settings are the
    fields of :class:`funnel_core.config.GraphGranularityConfig`.
    """

    include_prev_next_rel: bool = Field(default=True, description="PREV/NEXT links within a document.")
    last_build_seconds: Optional[float] = Field(default=None, description="Seconds of the last build.")

    @classmethod
    def class_name(cls) -> str:
        return "GraphGranularityNodeParser"

    def _parse_nodes(self, nodes: Sequence[BaseNode], show_progress: bool = False,
                     **kwargs: Any) -> List[BaseNode]:
        _refuse_batched_ingestion(type(self).__name__)
        if not nodes:
            return []
        builder: GraphGranularityBuilder = self.stage
        docs = {n.node_id: n for n in nodes}
        graph = builder.build([_doc_unit(n) for n in nodes])
        self.last_build_seconds = graph.build_seconds
        return [_text_node(u, docs[u.funnel["doc_id"]]) for u in graph.nodes]


@config_attributes(MixOfGranularityConfig, "config")
class MixOfGranularityRetriever(UnitRetriever):
    """MoG / MoGG retrieval over the nodes of either granularity parser.

    Args:
        nodes: *All* nodes of :class:`MultiGranularityNodeParser` (every level), or the nodes of
            :class:`GraphGranularityNodeParser` (detected by ``funnel_graph_neighbors_json``).
        router: A trained :class:`~funnel_core.granularity.router.GranularityRouter`; ``None``
            means uniform level weights (the finest level is returned).
        similarity_top_k: Nodes returned.
        callback_manager: LlamaIndex callback manager.
        verbose: LlamaIndex's verbose flag.
        config: A :class:`funnel_core.config.MixOfGranularityConfig`, or its fields as keyword
            arguments: ``k_r`` (BM25 hits per level, 3), ``normalize`` (``"none"``, equation 1,
            or ``"max"``), ``level_margin``, ``n_gra`` (hop ranges of graph nodes), ``bm25``.
            Each is also an attribute: an edit is validated and honoured at the next query (the
            per-level BM25 indexes are rebuilt only when ``n_gra`` or ``bm25`` changed).

    Each result's metadata holds ``funnel_router_weights_json``, ``funnel_chosen_level`` and
    ``funnel_finest_id``; its score is the mixed score.
    """

    def __init__(self, nodes: Sequence[BaseNode], router: Optional[GranularityRouter] = None, *,
                 similarity_top_k: int = 1, callback_manager: Optional[CallbackManager] = None,
                 verbose: bool = False, config: Optional[MixOfGranularityConfig] = None,
                 **settings: Any) -> None:
        nodes = list(nodes)
        if not nodes:
            raise ValueError("MixOfGranularityRetriever needs nodes; parse documents with "
                             "MultiGranularityNodeParser or GraphGranularityNodeParser first.")
        self.similarity_top_k = check_positive_int(similarity_top_k, "similarity_top_k")
        self.config = config_of(MixOfGranularityConfig, config, settings, type(self).__name__)
        self.router = router
        self._units = [node_to_unit(n) for n in nodes]
        self._stage: Optional[MixOfGranularityRetrieve] = None
        _ = self.stage  # indexes the levels now
        self._nodes = nodes
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    @property
    def stage(self) -> MixOfGranularityRetrieve:
        """The core MoG stage for the current settings (see ``funnel_core`` ``mog_stage``)."""
        self._stage = mog_stage(self._units, self.router, self.config,
                                top_k=self.similarity_top_k, previous=self._stage)
        return self._stage

    @property
    def structure(self) -> GranularityStructure:
        return self.stage.structure

    @classmethod
    def class_name(cls) -> str:
        return "MixOfGranularityRetriever"

    def _search(self, query: str) -> list[Unit]:
        return self.stage.retrieve(query)

    def _originals(self) -> Sequence[BaseNode]:
        return self._nodes
