"""Mix-of-Granularity for LlamaIndex (``docs/mix_of_granularity.md``): the node parsers
:class:`MultiGranularityNodeParser` (MoG) and :class:`GraphGranularityNodeParser` (MoGG), and
:class:`MixOfGranularityRetriever` over either parser's nodes."""

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
from funnel_core.settings import StageAdapter, checked_keywords, field_defaults
from funnel_core.units import Unit, keep_source_funnel_keys, read_funnel_metadata
from llama_index_funnel._base import UnitRetriever, annotate_node, node_to_unit

__all__ = ["MultiGranularityNodeParser", "GraphGranularityNodeParser", "MixOfGranularityRetriever"]


def _doc_unit(node: BaseNode) -> Unit:
    return Unit(id=node.node_id, text=node.get_content(metadata_mode=MetadataMode.NONE),
                metadata=read_funnel_metadata(node.metadata)[0], level="document")


def _text_node(unit: Unit, source: BaseNode, drop: Sequence[str] = ()) -> TextNode:
    """A parsed node: the source's metadata and excluded keys, and the structure (granularity,
    doc_id, position, graph neighbours, ...) as hidden flat ``funnel_...`` keys."""
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
    """Raise when an ``IngestionPipeline`` hands a graph parser only part of its documents (with
    ``num_workers > 1``, or a ``docstore`` that passes only new or changed ones), over which it
    would silently build a separate, sparser graph."""
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
    """A node parser holding one core splitter (:class:`funnel_core.settings.StageAdapter`).
    Node ids are structural, so an ``id_func`` other than the default is refused."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    _stage: Any = PrivateAttr(default=None)

    @classmethod
    def class_name(cls) -> str:
        return cls.__name__

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
    """Split documents into ``n_gra`` nested granularity levels (MoG section 3.2): a
    :class:`~funnel_core.granularity.levels.MultiGranularityChunker`.

    Nodes carry ``funnel_granularity`` (1 = finest), ``funnel_doc_id``, ... metadata keys and
    ``PARENT``/``CHILD`` relationships: put *all* nodes in the docstore and index the leaves
    (``get_leaf_nodes``) for ``AutoMergingRetriever``; pass all nodes to
    :class:`MixOfGranularityRetriever`.
    """

    include_prev_next_rel: bool = Field(
        default=False, description="PREV/NEXT links (off: consecutive nodes may be of different levels).")

    def _parse_nodes(self, nodes: Sequence[BaseNode], show_progress: bool = False,
                     **kwargs: Any) -> List[BaseNode]:
        chunker: MultiGranularityChunker = self.stage
        out: List[BaseNode] = []
        pairs: List[tuple[Dict[str, Any], Dict[str, Any]]] = []
        for di, doc in enumerate(get_tqdm_iterable(nodes, show_progress, "Parsing granularity levels")):
            units = [u for level in chunker.split_document(_doc_unit(doc), di) for u in level]
            by_id = {u.id: _text_node(u, doc, drop=("child_ids",)) for u in units}
            for unit in units:
                node = by_id[unit.id]
                if unit.parent_id is not None:
                    node.relationships[NodeRelationship.PARENT] = by_id[unit.parent_id].as_related_node_info()
                if kids := unit.funnel.get("child_ids"):
                    node.relationships[NodeRelationship.CHILD] = [by_id[k].as_related_node_info() for k in kids]
                out.append(node)
                pairs.append((doc.metadata, node.metadata))
        keep_source_funnel_keys(type(self).__name__, pairs)
        return out


class GraphGranularityNodeParser(GraphGranularityFields, _StageNodeParser):
    """Split documents into MoGG graph nodes and link them: a
    :class:`~funnel_core.granularity.graph.GraphGranularityBuilder` (edges in the
    ``funnel_graph_neighbors_json`` and ``funnel_graph_weights_json`` metadata keys).

    The graph spans the documents of one call, so parse the whole corpus at once: inside an
    ``IngestionPipeline`` with ``num_workers > 1``, or with a docstore that passes on only the
    new or changed documents, it raises instead of building a graph over a part.
    """

    include_prev_next_rel: bool = Field(default=True, description="PREV/NEXT links within a document.")
    last_build_seconds: Optional[float] = Field(default=None, description="Seconds of the last build.")

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


#: The defaults of :class:`~funnel_core.granularity.fields.MixOfGranularityFields`.
_MOG: dict[str, Any] = field_defaults(MixOfGranularityFields)


class MixOfGranularityRetriever(UnitRetriever):
    """MoG / MoGG retrieval over *all* the nodes of either granularity parser (``nodes``),
    returning ``similarity_top_k``. Settings: see
    :class:`~funnel_core.granularity.fields.MixOfGranularityFields` (attributes, forwarded to the
    :class:`~funnel_core.granularity.retrieval.MixOfGranularityRetrieve` it holds, ``.stage``).
    """

    @checked_keywords
    def __init__(self, nodes: Sequence[BaseNode], router: Optional[GranularityRouter] = None, *,
                 similarity_top_k: int = 1, k_r: int = _MOG["k_r"], normalize: str = _MOG["normalize"],
                 level_margin: float = _MOG["level_margin"], n_gra: int = _MOG["n_gra"],
                 bm25: Optional[dict] = _MOG["bm25"],
                 callback_manager: Optional[CallbackManager] = None,
                 verbose: bool = False) -> None:
        nodes = list(nodes)
        if not nodes:
            raise ValueError("MixOfGranularityRetriever needs nodes; parse documents with "
                             "MultiGranularityNodeParser or GraphGranularityNodeParser first.")
        check_positive_int(similarity_top_k, "similarity_top_k")
        self._units, self._nodes, self.n_gra = [node_to_unit(n) for n in nodes], nodes, n_gra
        self._stage = mog_stage(self._units, router, n_gra=n_gra, bm25=bm25,
                                top_k=similarity_top_k, k_r=k_r, normalize=normalize,
                                level_margin=level_margin)  # indexes the levels now
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
            return
        if name == "n_gra" and "_stage" in self.__dict__:
            self._stage = mog_rebuilt(self._stage, self._units, value)  # validated by the rebuild
        super().__setattr__(name, value)

    @property
    def stage(self) -> MixOfGranularityRetrieve:
        """The core MoG stage this retriever runs."""
        return self._stage

    @property
    def structure(self) -> GranularityStructure:
        return self.stage.structure

    def _search(self, query: str) -> list[Unit]:
        return self.stage.retrieve(query)

    def _originals(self) -> Sequence[BaseNode]:
        return self._nodes
