"""LlamaIndex nodes <-> :class:`funnel_core.Unit` (the metadata contract of ``docs/frameworks.md``)
and the base classes of this package: :class:`StagePostprocessor`, :class:`UnitRetriever`."""

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
from llama_index.core.indices.query.query_transform.base import BaseQueryTransform
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.prompts.mixin import PromptDictType
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

#: ``similarity_top_k`` of this package's retrievers when none is given.
TOP_K = 10

__all__ = ["TOP_K", "StagePostprocessor", "UnitRetriever", "PromptlessTransform", "node_to_unit", "nodes_to_units",
           "units_to_nodes", "annotate_node", "hide_keys", "Handoff", "handing"]


def _node_text(node: BaseNode) -> str:
    return node.get_content(metadata_mode=MetadataMode.NONE)


def node_to_unit(nws: NodeWithScore | BaseNode) -> Unit:
    """A ``NodeWithScore`` (or a bare node) as a :class:`Unit` (:func:`funnel_core.units.unit_of`)
    whose ``source`` is the node, so that :func:`units_to_nodes` hands back a copy of it."""
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
    """``node.metadata`` = ``metadata`` (the user's) plus the unit's flat ``funnel_...`` keys
    (:func:`funnel_core.units.funnel_metadata`), hidden from the LLM and embedding text."""
    ours = funnel_metadata(unit)
    node.metadata = {**metadata, **ours}
    hide_keys(node, ours)


def unit_to_node(unit: Unit, by_id: Mapping[str, BaseNode] | None = None,
                 annotate: bool = True) -> BaseNode:
    """One unit -> a copy of the node it came from (``unit.source`` or ``by_id``; with the unit's
    text if a stage shortened it), or, for a unit cut from a node, a ``TextNode`` with its
    parent's excluded keys, templates and ``SOURCE``, and ``PARENT`` pointing to it. Without
    ``annotate`` (retrievers) a copied node's metadata is unchanged, so is ``node.hash``
    (``QueryFusionRetriever`` recognises the node); with it, :func:`annotate_node`."""
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
    """Units -> ``NodeWithScore`` (:func:`unit_to_node`); ``originals``: nodes to copy for units
    that carry none (by id, or ``parent_id``), a sequence or a retriever's ``{node_id: node}``
    mapping (read as it is, not copied per query)."""
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
    """Units a funnel hands ``owner`` and takes back (``out``) while it runs ``owner`` through
    LlamaIndex only for its events and spans (:func:`handing`)."""

    owner: Any
    units: Optional[list[Unit]] = None
    out: Optional[list[Unit]] = None


_HANDOFF: ContextVar[Optional[Handoff]] = ContextVar("funnel_handoff", default=None)


@contextmanager
def handing(owner: Any, units: Optional[list[Unit]] = None) -> Iterator[Handoff]:
    """While the block runs, ``owner`` works on ``units`` instead of the nodes it is given, and
    leaves the units it returns in the yielded :class:`Handoff`."""
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

    Fields and their forwarding: :class:`funnel_core.settings.StageAdapter`. Each call emits
    LlamaIndex's reranking events; an empty query: :meth:`funnel_core.funnel.Stage.no_query`.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    _stage: Optional[Stage] = PrivateAttr(default=None)

    @classmethod
    def class_name(cls) -> str:
        return cls.__name__

    def _model_name(self) -> str:
        """The model the reranking events name (a live model or LLM: its type)."""
        model = getattr(self._stage, "model_name", None) or getattr(self, "model", None) \
            or getattr(self, "llm", None) or self.class_name()
        return model if isinstance(model, str) else type(model).__name__

    def _input(self, nodes: List[NodeWithScore],
               query_bundle: Optional[QueryBundle]) -> tuple[str, Optional[list[Unit]]]:
        """The query and the units to score (handed over by a funnel, else read from the nodes;
        ``None`` for no nodes or an empty query)."""
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
        """LlamaIndex's reranking events (ReRankStart/End, the callback manager's RERANKING)
        around one call; the caller fills the yielded list with the output nodes."""
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

    An empty query returns ``[]``, a non-string one raises ``TypeError``; ``_aretrieve`` searches
    in a worker thread. ``annotate``: add flat ``funnel_...`` metadata keys (the BM25 retrievers
    leave it off, as LlamaIndex's own do, so a node's hash is unchanged).
    """

    annotate: bool = True

    @classmethod
    def class_name(cls) -> str:
        return cls.__name__

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
        """The nodes of :meth:`_search`'s units (the units go to a funnel, :func:`handing`)."""
        return units_to_nodes(_hand_back(self, units), self._originals(), self.annotate)

    def _originals(self) -> Sequence[BaseNode] | Mapping[str, BaseNode]:
        """Original nodes to copy back (a retriever that keeps them overrides it)."""
        return ()


class PromptlessTransform(BaseQueryTransform):
    """A LlamaIndex query transform whose prompts live in its ``funnel_core`` stage (none here)."""

    def _get_prompts(self) -> PromptDictType:
        return {}

    def _update_prompts(self, prompts: PromptDictType) -> None:
        return None
