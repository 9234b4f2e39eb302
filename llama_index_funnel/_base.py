"""Conversion between LlamaIndex nodes and :class:`funnel_core.Unit` (the metadata contract of
``docs/frameworks.md``), and the two thin base classes every LlamaIndex object of this package
builds on: :class:`StagePostprocessor` (runs one ``funnel_core`` stage) and
:class:`UnitRetriever` (a retriever whose search returns units)."""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections import ChainMap
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, List, Mapping, Optional, Sequence

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.bridge.pydantic import ConfigDict, PrivateAttr
from llama_index.core.callbacks import CBEventType, EventPayload
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import (
    BaseNode,
    MetadataMode,
    NodeRelationship,
    NodeWithScore,
    QueryBundle,
    RelatedNodeInfo,
    TextNode,
)

from funnel_core.errors import check_query
from funnel_core.funnel import Stage, WarmUpMixin
from funnel_core.settings import StageAdapter
from funnel_core.units import Unit, funnel_metadata, unit_of

dispatcher = get_dispatcher(__name__)

__all__ = ["StagePostprocessor", "UnitRetriever", "node_to_unit", "nodes_to_units",
           "units_to_nodes", "annotate_node", "hide_keys", "Handoff", "handing"]

def _node_text(node: BaseNode) -> str:
    return node.get_content(metadata_mode=MetadataMode.NONE)


def node_to_unit(nws: NodeWithScore | BaseNode) -> Unit:
    """Convert a ``NodeWithScore`` (or a bare node) into a :class:`Unit`
    (:func:`funnel_core.units.unit_of`), which keeps a reference to the node (``unit.source``)
    so that :func:`units_to_nodes` hands back a copy of it."""
    if isinstance(nws, BaseNode):
        nws = NodeWithScore(node=nws, score=None)
    if not isinstance(nws, NodeWithScore):
        raise TypeError(f"expected a NodeWithScore or a node, got {type(nws).__name__}.")
    node = nws.node
    if not hasattr(node, "text") or not isinstance(getattr(node, "text", None), str):
        raise TypeError(f"node {node.node_id!r} ({type(node).__name__}) has no text to score; "
                        "funnel-rag stages work on text nodes only.")
    parent = node.relationships.get(NodeRelationship.PARENT)
    return unit_of(node.node_id, _node_text(node), node.metadata, score=nws.score, source=node,
                   parent_id=parent.node_id if isinstance(parent, RelatedNodeInfo) else None)


def nodes_to_units(nodes: Sequence[NodeWithScore | BaseNode]) -> list[Unit]:
    return [node_to_unit(n) for n in nodes]


def hide_keys(node: BaseNode, keys: Iterable[str]) -> None:
    """Exclude ``keys`` from the node's LLM and embedding text (LlamaIndex's own mechanism)."""
    for key in keys:
        if key not in node.excluded_llm_metadata_keys:
            node.excluded_llm_metadata_keys.append(key)
        if key not in node.excluded_embed_metadata_keys:
            node.excluded_embed_metadata_keys.append(key)


def annotate_node(node: BaseNode, unit: Unit, metadata: Mapping[str, Any]) -> None:
    """Set ``node.metadata`` to ``metadata`` (the user's, untouched) plus the unit's bookkeeping
    as flat ``funnel_...`` keys (:func:`funnel_core.units.funnel_metadata`), excluded from the
    LLM and embedding text."""
    ours = funnel_metadata(unit)
    node.metadata = {**metadata, **ours}
    hide_keys(node, ours)


def unit_to_node(unit: Unit, by_id: Mapping[str, BaseNode] | None = None,
                 annotate: bool = True) -> BaseNode:
    """One unit -> a node: a copy of the node it came from (``unit.source``, or ``by_id``; with the
    unit's text if a stage shortened it), or,
    for a unit cut from a node, a ``TextNode`` that inherits its parent's excluded keys,
    templates and ``SOURCE`` and points to it with ``PARENT`` (its metadata is the unit's, which
    the stage copied from the parent).

    The user's metadata keys are never changed. With ``annotate``, our bookkeeping is added as
    flat ``funnel_...`` keys (scalars; excluded from LLM and embedding text); without it
    (retrievers), a copied node's metadata is exactly what it was, so ``node.hash`` is unchanged
    and ``QueryFusionRetriever`` recognises the node.
    """
    by_id = by_id or {}
    src = unit.source if isinstance(unit.source, BaseNode) else by_id.get(unit.id)
    if src is not None and src.node_id == unit.id:
        node = src.model_copy()
        node.relationships = dict(src.relationships)
        if _node_text(src) != unit.text:  # e.g. compressed: the same node with less text
            node.set_content(unit.text)
        node.excluded_llm_metadata_keys = list(src.excluded_llm_metadata_keys)
        node.excluded_embed_metadata_keys = list(src.excluded_embed_metadata_keys)
        if annotate:
            annotate_node(node, unit, src.metadata)
        else:
            node.metadata = dict(src.metadata)
        return node
    parent = by_id.get(unit.parent_id) if unit.parent_id is not None else None
    node = TextNode(id_=unit.id, text=unit.text)
    if parent is not None:
        node.metadata_template = parent.metadata_template
        node.metadata_separator = parent.metadata_separator
        node.excluded_llm_metadata_keys = list(parent.excluded_llm_metadata_keys)
        node.excluded_embed_metadata_keys = list(parent.excluded_embed_metadata_keys)
        if parent.source_node is not None:
            node.relationships[NodeRelationship.SOURCE] = parent.source_node
    if unit.parent_id is not None:
        node.relationships[NodeRelationship.PARENT] = RelatedNodeInfo(node_id=unit.parent_id)
    annotate_node(node, unit, unit.metadata)  # a new node: nothing to keep hash-equal
    return node


def units_to_nodes(units: Sequence[Unit],
                   originals: Sequence[NodeWithScore | BaseNode] | Mapping[str, BaseNode] = (),
                   annotate: bool = True) -> list[NodeWithScore]:
    """Convert units back to ``NodeWithScore`` (see :func:`unit_to_node`); ``originals`` are
    nodes to copy for units that carry no node (looked up by id, and by ``parent_id`` for units
    cut from them): a sequence of nodes, or a retriever's own ``{node_id: node}`` mapping, which
    is used as it is (no per-query copy of the whole corpus)."""
    by_id: dict[str, BaseNode] = {}
    if not isinstance(originals, Mapping):
        for o in originals:
            node = o.node if isinstance(o, NodeWithScore) else o
            by_id[node.node_id] = node
    for u in units:  # parents that came through the stages themselves
        if isinstance(u.source, BaseNode):
            by_id.setdefault(u.id, u.source)
    lookup: Mapping[str, BaseNode] = by_id
    if isinstance(originals, Mapping):  # read-only view: ours first, then the retriever's dict
        lookup = ChainMap(by_id, originals)  # type: ignore[arg-type]  # ChainMap only reads it
    return [NodeWithScore(node=unit_to_node(u, lookup, annotate), score=u.score) for u in units]


@dataclass
class Handoff:
    """Units a funnel hands one of our objects (``owner``), and takes back (``out``), while it runs
    the object through LlamaIndex only so that its events and spans fire (see :func:`handing`):
    the nodes LlamaIndex passes are for the events' payload, the work is done on ``units``."""

    owner: Any
    units: Optional[list[Unit]] = None
    out: Optional[list[Unit]] = None


_HANDOFF: ContextVar[Optional[Handoff]] = ContextVar("funnel_handoff", default=None)


@contextmanager
def handing(owner: Any, units: Optional[list[Unit]] = None) -> Iterator[Handoff]:
    """While the block runs, ``owner`` (a :class:`StagePostprocessor` or
    :class:`UnitRetriever`) works on ``units`` instead of reading them back from the nodes it
    is given, and leaves the units it returns in the yielded :class:`Handoff`."""
    token = _HANDOFF.set(hand := Handoff(owner, units))
    try:
        yield hand
    finally:
        _HANDOFF.reset(token)


def _handoff(owner: Any) -> Optional[Handoff]:
    hand = _HANDOFF.get()
    return hand if hand is not None and hand.owner is owner else None


def _hand_back(owner: Any, units: list[Unit]) -> list[Unit]:
    """``units`` (what ``owner`` returns), also left for the funnel that handed it work."""
    if (hand := _handoff(owner)) is not None:
        hand.out = units
    return units


class StagePostprocessor(StageAdapter, BaseNodePostprocessor):
    """A LlamaIndex node postprocessor that holds and runs one ``funnel_core`` stage.

    A subclass declares its fields (most come from the core's ``*Fields`` models) and names the
    stage class (``stage_class``); the fields named like the stage's settings build it, and an
    edit of one is forwarded to it (:class:`funnel_core.settings.StageAdapter`): honoured at the
    next call, the loaded model kept unless a load-time setting changed. Unknown keyword
    arguments raise, naming the accepted ones. Each call emits LlamaIndex's reranking events;
    an empty query scores nothing (:meth:`funnel_core.funnel.Stage.no_query`: the nodes keep
    their order, capped by ``top_n`` and a cut-off).
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    _stage: Optional[Stage] = PrivateAttr(default=None)

    def _model_name(self) -> str:
        return str(getattr(self, "model", None) or self.class_name())

    def _input(self, nodes: List[NodeWithScore],
               query_bundle: Optional[QueryBundle]) -> tuple[str, Optional[list[Unit]]]:
        """The query and the units to score (handed over by a funnel, else read from the nodes);
        ``None`` for no nodes or an empty query."""
        if query_bundle is None:
            raise ValueError(f"{self.class_name()} needs the query: pass query_bundle= or "
                             "query_str= to postprocess_nodes().")
        query = check_query(query_bundle.query_str)
        if not nodes or not query:
            return query, None
        hand = _handoff(self)
        return query, hand.units if hand and hand.units is not None else nodes_to_units(nodes)

    def _postprocess_nodes(self, nodes: List[NodeWithScore],
                           query_bundle: Optional[QueryBundle] = None) -> List[NodeWithScore]:
        query, units = self._input(nodes, query_bundle)
        if units is None:
            return self.stage.no_query(nodes)
        with self._reranking(nodes, query_bundle, query) as out:
            out.extend(units_to_nodes(_hand_back(self, self.stage(query, units)), nodes))
        return out

    async def _apostprocess_nodes(self, nodes: List[NodeWithScore],
                                  query_bundle: Optional[QueryBundle] = None) -> List[NodeWithScore]:
        query, units = self._input(nodes, query_bundle)
        if units is None:
            return self.stage.no_query(nodes)
        with self._reranking(nodes, query_bundle, query) as out:
            out.extend(units_to_nodes(_hand_back(self, await self.stage.acall(query, units)), nodes))
        return out

    @contextmanager
    def _reranking(self, nodes: List[NodeWithScore], query_bundle: Optional[QueryBundle],
                   query: str) -> Iterator[List[NodeWithScore]]:
        """LlamaIndex's reranking events around one call (as its own rerankers emit them): the
        dispatcher's ReRankStart/End and the callback manager's RERANKING; the caller fills the
        yielded list with the output nodes."""
        top_n, model = int(getattr(self, "top_n", None) or 0), self._model_name()
        dispatcher.event(ReRankStartEvent(query=query_bundle, nodes=nodes, top_n=top_n,
                                          model_name=model))
        out: List[NodeWithScore] = []
        payload: dict[str, Any] = {EventPayload.NODES: nodes, EventPayload.MODEL_NAME: model,
                   EventPayload.QUERY_STR: query, EventPayload.TOP_K: top_n}
        with self.callback_manager.event(CBEventType.RERANKING, payload=payload) as event:
            yield out
            event.on_end(payload={EventPayload.NODES: out})
        dispatcher.event(ReRankEndEvent(nodes=out))


class UnitRetriever(WarmUpMixin, BaseRetriever):
    """A LlamaIndex retriever whose subclasses implement :meth:`_search` over ``funnel_core``.

    An empty or whitespace query returns ``[]``; a non-string query raises ``TypeError``.
    ``_aretrieve`` runs the search in a worker thread so the event loop keeps running.

    ``annotate`` (class default, or set on the instance): add per-query bookkeeping as flat
    ``funnel_...`` metadata keys. The BM25 retrievers leave it off, as LlamaIndex's own retrievers do,
    so a returned node is the user's node with its hash unchanged.
    """

    annotate: bool = True

    @abstractmethod
    def _search(self, query: str) -> list[Unit]:
        """Return the units for a (non-empty, stripped) query."""

    async def _asearch(self, query: str) -> list[Unit]:
        """Async twin of :meth:`_search`; by default :meth:`_search` in a worker thread."""
        return await asyncio.to_thread(self._search, query)

    @staticmethod
    def _check_query_type(query: Any) -> None:
        if not isinstance(query, (str, QueryBundle)):
            raise TypeError(f"retrieve() takes a str or a QueryBundle, got {type(query).__name__} "
                            f"({query!r:.80}); decode bytes first, e.g. retrieve(data.decode('utf-8')).")

    def retrieve(self, str_or_query_bundle: Any) -> List[NodeWithScore]:
        self._check_query_type(str_or_query_bundle)  # LlamaIndex would fail on .query_str
        return super().retrieve(str_or_query_bundle)

    async def aretrieve(self, str_or_query_bundle: Any) -> List[NodeWithScore]:
        self._check_query_type(str_or_query_bundle)
        return await super().aretrieve(str_or_query_bundle)

    def _retrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        query = check_query(query_bundle.query_str)
        return self._to_nodes(self._search(query)) if query else []

    async def _aretrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        query = check_query(query_bundle.query_str)
        return self._to_nodes(await self._asearch(query)) if query else []

    def _to_nodes(self, units: list[Unit]) -> List[NodeWithScore]:
        """The nodes of what :meth:`_search` returned (and the units themselves to a funnel
        that hands them on, see :func:`handing`)."""
        return units_to_nodes(_hand_back(self, units), self._originals(), self.annotate)

    def _originals(self) -> Sequence[BaseNode] | Mapping[str, BaseNode]:
        """Original nodes to copy back (override when the retriever keeps them, e.g. its own
        ``{node_id: node}`` dict)."""
        return ()
