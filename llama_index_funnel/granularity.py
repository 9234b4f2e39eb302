"""Mix-of-Granularity for LlamaIndex: node parsers and the MoG retriever.

* :class:`MultiGranularityNodeParser` — ``n_gra`` nested levels per document with
  ``NodeRelationship.PARENT/CHILD``, so ``get_leaf_nodes``, ``get_root_nodes`` and
  ``AutoMergingRetriever`` work on its output, as on ``HierarchicalNodeParser``'s.
* :class:`GraphGranularityNodeParser` — MoGG's 1-2 sentence nodes; the BM25 kNN edges travel in
  ``metadata["graph_neighbors"]`` (hidden from the LLM and the embedder).
* :class:`MixOfGranularityRetriever` — the MoG selection rule over either parser's nodes, with
  the router weights and the chosen level in each result's metadata.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from llama_index.core.bridge.pydantic import Field
from llama_index.core.callbacks import CallbackManager
from llama_index.core.node_parser.interface import NodeParser
from llama_index.core.schema import (
    BaseNode,
    MetadataMode,
    NodeRelationship,
    TextNode,
)
from llama_index.core.utils import get_tqdm_iterable

from funnel_core.errors import check_positive_int
from funnel_core.granularity.graph import GranularityGraph, GraphGranularityBuilder
from funnel_core.granularity.levels import GranularityHierarchy, MultiGranularityChunker
from funnel_core.granularity.retrieval import MixOfGranularityRetrieve
from funnel_core.granularity.router import GranularityRouter
from funnel_core.units import FUNNEL_KEY, Unit, framework_metadata, split_metadata
from llama_index_funnel._base import UnitRetriever, node_to_unit

__all__ = ["MultiGranularityNodeParser", "GraphGranularityNodeParser", "MixOfGranularityRetriever"]

def _doc_unit(node: BaseNode) -> Unit:
    return Unit(id=node.node_id, text=node.get_content(metadata_mode=MetadataMode.NONE),
                metadata=split_metadata(node.metadata)[0], level="document")


def _text_node(unit: Unit, source: BaseNode, drop: Sequence[str] = ()) -> TextNode:
    """A parsed node: the source's metadata and excluded keys as they were, the structure
    (granularity, doc_id, position, graph neighbours, ...) under ``metadata["funnel"]``."""
    user, ours = framework_metadata(unit, source.metadata)
    for key in drop:
        ours.pop(key, None)
    node = TextNode(id_=unit.id, text=unit.text, metadata={**user, FUNNEL_KEY: ours},
                    excluded_llm_metadata_keys=[*source.excluded_llm_metadata_keys, FUNNEL_KEY],
                    excluded_embed_metadata_keys=[*source.excluded_embed_metadata_keys, FUNNEL_KEY])
    node.relationships[NodeRelationship.SOURCE] = source.as_related_node_info()
    return node


class MultiGranularityNodeParser(NodeParser):
    """Split documents into ``n_gra`` nested granularity levels (MoG section 3.2).

    Level 1 holds sentence-aware chunks of about ``chunk_size`` words; each level-``j`` node is
    two adjacent level-``j - 1`` nodes of the same document. Every node gets
    ``metadata["granularity"]`` (1 = finest), ``doc_id``, ``doc_index`` and ``position``, a
    ``PARENT`` relationship (below the top level) and ``CHILD`` relationships (above level 1).
    Put *all* nodes in the docstore and index the leaves (``get_leaf_nodes``) for
    ``AutoMergingRetriever``; pass all nodes to :class:`MixOfGranularityRetriever`.

    A document shorter than one finest chunk yields one node per level with the same text.
    """

    chunk_size: int = Field(default=64, description="Finest chunk size in words.", gt=0)
    n_gra: int = Field(default=5, description="Number of granularity levels (1 = finest).", gt=0)
    sentence_aware: bool = Field(default=True, description="End finest chunks at sentence ends.")
    include_prev_next_rel: bool = Field(
        default=False, description="PREV/NEXT links (off: consecutive nodes may be of different levels).")

    def __init__(self, *, chunk_size: int = 64, n_gra: int = 5, sentence_aware: bool = True,
                 callback_manager: Optional[CallbackManager] = None, **kwargs: Any) -> None:
        check_positive_int(chunk_size, "chunk_size")
        check_positive_int(n_gra, "n_gra (number of granularity levels)")
        super().__init__(chunk_size=chunk_size, n_gra=n_gra, sentence_aware=sentence_aware,
                         callback_manager=callback_manager or CallbackManager([]), **kwargs)

    @classmethod
    def class_name(cls) -> str:
        return "MultiGranularityNodeParser"

    def _parse_nodes(self, nodes: Sequence[BaseNode], show_progress: bool = False,
                     **kwargs: Any) -> List[BaseNode]:
        chunker = MultiGranularityChunker(chunk_size=self.chunk_size, n_gra=self.n_gra,
                                          sentence_aware=self.sentence_aware)
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
                    kids = unit.metadata.get("child_ids")
                    if kids:
                        node.relationships[NodeRelationship.CHILD] = \
                            [by_id[k].as_related_node_info() for k in kids]
                    out.append(node)
        return out


class GraphGranularityNodeParser(NodeParser):
    """Split documents into MoGG graph nodes of ``sentences_per_node`` sentences and link them.

    Each node is linked to its ``k_graph`` most BM25-similar nodes (anywhere in the parsed
    documents) whose normalised similarity reaches ``t_graph``; edges are undirected and stored
    as ``metadata["graph_neighbors"]`` (ids) and ``metadata["graph_weights"]``. The graph spans
    the documents of one call, so parse the whole corpus at once. ``last_build_seconds`` is the
    edge-building time of the latest call. With no pair above ``t_graph`` the nodes get empty
    neighbour lists (and a warning): every hop range is then the node alone.
    """

    sentences_per_node: int = Field(default=2, description="Sentences per node (1-2 in the paper).", gt=0)
    n_gra: int = Field(default=5, description="Number of hop ranges (levels).", gt=0)
    k_graph: int = Field(default=3, description="Edges per node.", gt=0)
    t_graph: float = Field(default=0.3, description="Minimum normalised BM25 similarity.", ge=0, le=1)
    include_prev_next_rel: bool = Field(default=True, description="PREV/NEXT links within a document.")
    last_build_seconds: Optional[float] = Field(default=None, description="Seconds of the last build.")

    def __init__(self, *, sentences_per_node: int = 2, n_gra: int = 5, k_graph: int = 3,
                 t_graph: float = 0.3, callback_manager: Optional[CallbackManager] = None,
                 **kwargs: Any) -> None:
        GraphGranularityBuilder(sentences_per_node=sentences_per_node, n_gra=n_gra,
                                k_graph=k_graph, t_graph=t_graph)  # validates, naming the value
        super().__init__(sentences_per_node=sentences_per_node, n_gra=n_gra, k_graph=k_graph,
                         t_graph=t_graph, callback_manager=callback_manager or CallbackManager([]),
                         **kwargs)

    @classmethod
    def class_name(cls) -> str:
        return "GraphGranularityNodeParser"

    def _parse_nodes(self, nodes: Sequence[BaseNode], show_progress: bool = False,
                     **kwargs: Any) -> List[BaseNode]:
        if not nodes:
            return []
        builder = GraphGranularityBuilder(sentences_per_node=self.sentences_per_node,
                                          n_gra=self.n_gra, k_graph=self.k_graph,
                                          t_graph=self.t_graph)
        docs = {n.node_id: n for n in nodes}
        graph = builder.build([_doc_unit(n) for n in nodes])
        self.last_build_seconds = graph.build_seconds
        return [_text_node(u, docs[u.metadata["doc_id"]]) for u in graph.nodes]


class MixOfGranularityRetriever(UnitRetriever):
    """MoG / MoGG retrieval over the nodes of either granularity parser.

    Args:
        nodes: *All* nodes of :class:`MultiGranularityNodeParser` (every level), or the nodes of
            :class:`GraphGranularityNodeParser` (detected by ``metadata["graph_neighbors"]``).
        router: A trained :class:`~funnel_core.granularity.router.GranularityRouter`; ``None``
            means uniform level weights (the finest level is returned).
        similarity_top_k: Nodes returned.
        k_r: Nodes BM25 retrieves per level before mixing.
        n_gra: Hop ranges for graph nodes (levels of a hierarchy come from its nodes).
        normalize: Per-level BM25 score normalisation, ``"max"`` or ``"none"``.
        bm25: Keyword arguments for the per-level BM25 indexes.

    Each result's metadata holds ``router_weights``, ``chosen_level`` and ``finest_id``; its score
    is the mixed score.
    """

    def __init__(self, nodes: Sequence[BaseNode], router: Optional[GranularityRouter] = None, *,
                 similarity_top_k: int = 1, k_r: int = 3, n_gra: int = 5,
                 normalize: str = "max", bm25: Optional[dict] = None,
                 callback_manager: Optional[CallbackManager] = None, verbose: bool = False) -> None:
        nodes = list(nodes)
        if not nodes:
            raise ValueError("MixOfGranularityRetriever needs nodes; parse documents with "
                             "MultiGranularityNodeParser or GraphGranularityNodeParser first.")
        self.similarity_top_k = check_positive_int(similarity_top_k, "similarity_top_k")
        units = [node_to_unit(n) for n in nodes]
        structure: GranularityGraph | GranularityHierarchy
        if any("graph_neighbors" in u.metadata for u in units):
            structure = GranularityGraph.from_units(units, n_gra=n_gra)
        else:
            structure = GranularityHierarchy.from_units(units)
        self.structure = structure
        self.stage = MixOfGranularityRetrieve(structure, router, k_r=k_r,
                                              top_k=self.similarity_top_k, normalize=normalize,
                                              bm25=bm25)
        self._nodes = nodes
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    @classmethod
    def class_name(cls) -> str:
        return "MixOfGranularityRetriever"

    def _search(self, query: str) -> list[Unit]:
        return self.stage.retrieve(query, k=self.similarity_top_k)

    def _originals(self) -> Sequence[BaseNode]:
        return self._nodes
