"""Mix-of-Granularity for LlamaIndex (see ``docs/mix_of_granularity.md``): the node parsers
:class:`MultiGranularityNodeParser` (MoG's nested levels, linked with
``NodeRelationship.PARENT/CHILD`` so ``get_leaf_nodes`` and ``AutoMergingRetriever`` work on
them) and :class:`GraphGranularityNodeParser` (MoGG's sentence graph), and
:class:`MixOfGranularityRetriever`, the MoG selection rule over either parser's nodes."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr, field_validator
from llama_index.core.callbacks import CallbackManager
from llama_index.core.node_parser.interface import NodeParser
from llama_index.core.node_parser.node_utils import default_id_func
from llama_index.core.schema import (
    BaseNode,
    MetadataMode,
    NodeRelationship,
    TextNode,
)
from llama_index.core.utils import get_tqdm_iterable

from funnel_core.errors import check_positive_int
from funnel_core.granularity.fields import (
    GraphGranularityFields,
    MixOfGranularityFields,
    MultiGranularityFields,
)
from funnel_core.granularity.graph import GraphGranularityBuilder
from funnel_core.granularity.levels import GranularityStructure, MultiGranularityChunker
from funnel_core.granularity.retrieval import MixOfGranularityRetrieve, mog_rebuilt, mog_stage
from funnel_core.granularity.router import GranularityRouter
from funnel_core.settings import StageAdapter, checked_keywords
from funnel_core.units import Unit, keep_source_funnel_keys, read_funnel_metadata
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
#: IngestionPipeline's entry points, whose ``input_nodes`` / ``nodes_to_run`` say what its
#: docstore let through.
_PIPELINE_RUNS = frozenset({"run", "arun"})
_PIPELINE_MODULE = "llama_index.core.ingestion.pipeline"


def _refuse_partial_ingestion(name: str) -> None:
    """Raise when an ``IngestionPipeline`` hands a graph parser only part of its documents,
    over which it would build a separate, sparser graph without any sign of it: with
    ``num_workers > 1`` (one batch per worker process), or with a ``docstore`` that passes only
    the new or changed documents (a first ingestion, which passes them all, is not refused).
    The error messages say why and what to do instead."""
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        code, module = frame.f_code.co_name, frame.f_globals.get("__name__")
        if module == _PIPELINE_MODULE and code in _PIPELINE_WORKERS:
            raise ValueError(
                f"{name} links nodes across all the documents it parses at once, but "
                "IngestionPipeline(num_workers > 1) hands each worker process a separate batch, "
                "which would build a separate, sparser graph per batch. Run the pipeline with "
                "num_workers=None (or 1), or parse first: nodes = "
                f"{name}(...).get_nodes_from_documents(documents), then run the pipeline's "
                "other transformations on those nodes with workers.")
        if module == _PIPELINE_MODULE and code in _PIPELINE_RUNS:
            pipeline = frame.f_locals.get("self")
            given, run = frame.f_locals.get("input_nodes"), frame.f_locals.get("nodes_to_run")
            if (getattr(pipeline, "docstore", None) is not None and given is not None
                    and run is not None and 0 < len(run) < len(given)):
                raise ValueError(
                    f"{name} links nodes across all the documents it parses at once, but this "
                    f"IngestionPipeline's docstore passed it only {len(run)} of the "
                    f"{len(given)} documents (the new or changed ones): the graph would be "
                    "rebuilt over those alone, with no edge to the unchanged documents (the "
                    "pipeline recorded their hashes in its docstore before this parser ran). Re-parse "
                    f"the whole corpus: nodes = {name}(...).get_nodes_from_documents(all_documents), "
                    "then run a pipeline without the graph parser (docstore and vector store "
                    "as before) on those nodes; or use this parser in a pipeline without a "
                    "docstore.")
        frame = frame.f_back  # type: ignore[assignment]


class _StageNodeParser(StageAdapter, NodeParser):
    """A node parser holding one core splitter (``stage_class``) built from the fields named
    like its settings; an edit of one is forwarded to it. Unknown keywords raise.

    Node ids are structural (document, level, position: the MoG retriever and the
    PARENT/CHILD links read them), so NodeParser's ``id_func`` is not used: the default is
    accepted, also as ``to_dict`` saves it (by name), and any other is refused rather than
    silently ignored."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    _stage: Any = PrivateAttr(default=None)

    @field_validator("id_func", mode="before")
    @classmethod
    def _structural_ids(cls, value: Any) -> Any:
        if isinstance(value, dict):  # NodeParser.to_dict saves the function by name
            value = default_id_func if value.get("id_func_name") == default_id_func.__name__ \
                else value.get("id_func_name")
        if value is None or value is default_id_func:
            return default_id_func
        name = getattr(value, "__name__", value)
        raise ValueError(
            f"{cls.__name__} names its nodes by document, level and position (the MoG retriever "
            f"and the PARENT/CHILD links read those ids), so it does not use id_func; got "
            f"id_func={name!r}. Leave id_func out (or pass the default).")


class MultiGranularityNodeParser(MultiGranularityFields, _StageNodeParser):
    """Split documents into ``n_gra`` nested granularity levels (MoG section 3.2).

    Level 1 holds sentence-aware chunks of about ``chunk_size`` words; each level-``j`` node is
    two adjacent level-``j - 1`` nodes of the same document. Every node gets
    ``metadata["funnel_granularity"]`` (1 = finest), ``funnel_doc_id``, ``funnel_doc_index``,
    ``funnel_position``, ``funnel_level`` and ``funnel_parent_id`` (flat scalars), a
    ``PARENT`` relationship (below the top level) and ``CHILD`` relationships (above level 1).
    Put *all* nodes in the docstore and index the leaves (``get_leaf_nodes``) for
    ``AutoMergingRetriever``; pass all nodes to :class:`MixOfGranularityRetriever`.

    The settings (``chunk_size``, ``n_gra``, ``sentence_aware``) are those of the
    :class:`~funnel_core.granularity.levels.MultiGranularityChunker` it holds. A document shorter
    than one finest chunk yields one node per level with the same text.
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
        pairs: List[tuple[Dict[str, Any], Dict[str, Any]]] = []
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
                    pairs.append((doc.metadata, node.metadata))
        keep_source_funnel_keys(type(self).__name__, pairs)
        return out


class GraphGranularityNodeParser(GraphGranularityFields, _StageNodeParser):
    """Split documents into MoGG graph nodes of ``sentences_per_node`` sentences and link them.

    Each node is linked to its ``k_graph`` most BM25-similar nodes (anywhere in the parsed
    documents) whose normalised similarity reaches ``t_graph``; edges are undirected and stored
    as ``metadata["funnel_graph_neighbors_json"]`` (a JSON list of ids) and
    ``metadata["funnel_graph_weights_json"]``. The graph spans
    the documents of one call, so parse the whole corpus at once: inside an
    ``IngestionPipeline`` with ``num_workers > 1``, or with a docstore that passes on only the
    new or changed documents, it raises instead of building a graph over a part. ``last_build_seconds`` is the
    edge-building time of the latest call. With no pair above ``t_graph`` the nodes get empty
    neighbour lists (and a warning): every hop range is then the node alone. The settings are
    those of the :class:`~funnel_core.granularity.graph.GraphGranularityBuilder` it holds.
    """

    include_prev_next_rel: bool = Field(default=True, description="PREV/NEXT links within a document.")
    last_build_seconds: Optional[float] = Field(default=None, description="Seconds of the last build.")

    @classmethod
    def class_name(cls) -> str:
        return "GraphGranularityNodeParser"

    def _parse_nodes(self, nodes: Sequence[BaseNode], show_progress: bool = False,
                     **kwargs: Any) -> List[BaseNode]:
        _refuse_partial_ingestion(type(self).__name__)
        if not nodes:
            return []
        builder: GraphGranularityBuilder = self.stage
        docs = {n.node_id: n for n in nodes}
        graph = builder.build([_doc_unit(n) for n in nodes])
        self.last_build_seconds = graph.build_seconds
        out: List[BaseNode] = [_text_node(u, docs[u.funnel["doc_id"]]) for u in graph.nodes]
        keep_source_funnel_keys(type(self).__name__,
                                ((docs[u.funnel["doc_id"]].metadata, n.metadata)
                                 for u, n in zip(graph.nodes, out)))
        return out


class MixOfGranularityRetriever(UnitRetriever):
    """MoG / MoGG retrieval over the nodes of either granularity parser.

    Args:
        nodes: *All* nodes of :class:`MultiGranularityNodeParser` (every level), or the nodes of
            :class:`GraphGranularityNodeParser` (detected by ``funnel_graph_neighbors_json``).
        similarity_top_k: Nodes returned.
        callback_manager: LlamaIndex callback manager.
        verbose: LlamaIndex's verbose flag.

    The other arguments (``router``, ``k_r``, ``normalize``, ``level_margin``, ``n_gra``,
    ``bm25``) are the fields of :class:`~funnel_core.granularity.fields.MixOfGranularityFields`
    (the same as LangChain's ``MixOfGranularityRetriever``), with their defaults and meaning.
    Each setting is also an attribute, forwarded to the core
    :class:`~funnel_core.granularity.retrieval.MixOfGranularityRetrieve` it holds (``.stage``): an
    edit is validated and honoured at the next query. Each result's metadata holds
    ``funnel_router_weights_json``, ``funnel_chosen_level`` and ``funnel_finest_id``; its score
    is the mixed score.
    """

    @checked_keywords
    def __init__(self, nodes: Sequence[BaseNode], router: Optional[GranularityRouter] = None, *,
                 similarity_top_k: int = 1, k_r: int = 3, normalize: str = "none",
                 level_margin: float = 0.0, n_gra: int = 5, bm25: Optional[dict] = None,
                 callback_manager: Optional[CallbackManager] = None,
                 verbose: bool = False) -> None:
        nodes = list(nodes)
        if not nodes:
            raise ValueError("MixOfGranularityRetriever needs nodes; parse documents with "
                             "MultiGranularityNodeParser or GraphGranularityNodeParser first.")
        check_positive_int(similarity_top_k, "similarity_top_k")
        self._units = [node_to_unit(n) for n in nodes]
        self._stage = mog_stage(self._units, router, n_gra=n_gra, bm25=bm25,
                                top_k=similarity_top_k, k_r=k_r, normalize=normalize,
                                level_margin=level_margin)  # indexes the levels now
        self._n_gra, self._nodes = n_gra, nodes
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    @staticmethod
    def _forwarded(name: str) -> Optional[str]:
        """The stage setting an attribute is forwarded to (``None``: not forwarded)."""
        if name == "similarity_top_k":
            return "top_k"
        return name if name in MixOfGranularityFields.forwarded else None

    def __getattr__(self, name: str) -> Any:
        forwarded = self._forwarded(name)
        if forwarded is None or "_stage" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self.__dict__["_stage"], forwarded)

    def __setattr__(self, name: str, value: Any) -> None:
        setting = self._forwarded(name) if "_stage" in self.__dict__ else None
        if setting is not None:
            setattr(self._stage, setting, value)  # validated by the stage
        elif "_stage" in self.__dict__ and name == "n_gra":
            self._stage = mog_rebuilt(self._stage, self._units, value)
            self._n_gra = value
        else:
            super().__setattr__(name, value)

    @property
    def n_gra(self) -> int:
        return self._n_gra

    @property
    def stage(self) -> MixOfGranularityRetrieve:
        """The core MoG stage this retriever runs."""
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
