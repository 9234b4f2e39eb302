"""Conversion between LlamaIndex nodes and :class:`funnel_core.Unit`, and the two thin base
classes every LlamaIndex object of this package builds on:

* :class:`StagePostprocessor` — a ``BaseNodePostprocessor`` that runs one ``funnel_core`` stage
  (sync and async, ``ReRankStartEvent``/``ReRankEndEvent``, nodes copied, scores in metadata);
* :class:`UnitRetriever` — a ``BaseRetriever`` whose search returns units (sync and a real async
  path that does not block the event loop).
"""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from typing import Any, List, Optional, Sequence

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.bridge.pydantic import PrivateAttr
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

from funnel_core.config import ConfiguredAdapter
from funnel_core.errors import check_query
from funnel_core.funnel import Stage
from funnel_core.units import Unit

dispatcher = get_dispatcher(__name__)

__all__ = ["StagePostprocessor", "UnitRetriever", "node_to_unit", "nodes_to_units",
           "units_to_nodes", "INTERNAL_METADATA_KEYS"]

#: Metadata keys funnel-rag writes; hidden from the LLM and the embedder.
INTERNAL_METADATA_KEYS = (
    "scores", "funnel_trace", "bm25_rank", "cluster_id", "cluster_score", "cluster_rank",
    "parent_score", "parent_level", "position", "members", "level", "router_weights",
    "chosen_level", "forward_scores", "backward_scores", "samples",
)


def node_to_unit(nws: NodeWithScore | BaseNode) -> Unit:
    """Convert a ``NodeWithScore`` (or a bare node) into a :class:`Unit` (metadata copied)."""
    if isinstance(nws, BaseNode):
        nws = NodeWithScore(node=nws, score=None)
    if not isinstance(nws, NodeWithScore):
        raise TypeError(f"expected a NodeWithScore or a node, got {type(nws).__name__}.")
    node = nws.node
    if not hasattr(node, "text") or not isinstance(getattr(node, "text", None), str):
        raise TypeError(f"node {node.node_id!r} ({type(node).__name__}) has no text to score; "
                        "funnel-rag stages work on text nodes only.")
    parent = node.relationships.get(NodeRelationship.PARENT)
    meta = dict(node.metadata)
    return Unit(id=node.node_id, text=node.get_content(metadata_mode=MetadataMode.NONE),
                score=nws.score, metadata=meta,
                parent_id=parent.node_id if isinstance(parent, RelatedNodeInfo) else None,
                level=str(meta.get("level", "passage")))


def nodes_to_units(nodes: Sequence[NodeWithScore | BaseNode]) -> list[Unit]:
    return [node_to_unit(n) for n in nodes]


def _hide_internal(node: BaseNode) -> None:
    for key in INTERNAL_METADATA_KEYS:
        if key in node.metadata:
            if key not in node.excluded_llm_metadata_keys:
                node.excluded_llm_metadata_keys.append(key)
            if key not in node.excluded_embed_metadata_keys:
                node.excluded_embed_metadata_keys.append(key)


def units_to_nodes(units: Sequence[Unit],
                   originals: Sequence[NodeWithScore | BaseNode] = ()) -> list[NodeWithScore]:
    """Convert units back to ``NodeWithScore``.

    A unit whose id matches an original node becomes a *copy* of that node (its class, text,
    relationships kept) with the unit's metadata; a new unit (for example a passage cut by later
    chunking) becomes a ``TextNode`` with a ``PARENT`` relationship to ``parent_id``.
    """
    by_id: dict[str, BaseNode] = {}
    for o in originals:
        node = o.node if isinstance(o, NodeWithScore) else o
        by_id[node.node_id] = node
    out = []
    for unit in units:
        meta = dict(unit.metadata)
        meta["level"] = unit.level  # a child of later chunking must not keep its parent's level
        original = by_id.get(unit.id)
        if original is not None and original.get_content(MetadataMode.NONE) == unit.text:
            node = original.model_copy(deep=False)
            node.metadata = meta
            node.excluded_llm_metadata_keys = list(original.excluded_llm_metadata_keys)
            node.excluded_embed_metadata_keys = list(original.excluded_embed_metadata_keys)
            node.relationships = dict(original.relationships)
        else:
            node = TextNode(id_=unit.id, text=unit.text, metadata=meta)
            if unit.parent_id is not None:
                node.relationships[NodeRelationship.PARENT] = RelatedNodeInfo(node_id=unit.parent_id)
                parent = by_id.get(unit.parent_id)
                if parent is not None and parent.source_node is not None:
                    node.relationships[NodeRelationship.SOURCE] = parent.source_node
        _hide_internal(node)
        out.append(NodeWithScore(node=node, score=unit.score))
    return out


class StagePostprocessor(ConfiguredAdapter, BaseNodePostprocessor):
    """A LlamaIndex node postprocessor that runs one ``funnel_core`` stage.

    A configured postprocessor subclasses ``adapter_base(SomeConfig, StagePostprocessor)``: its
    fields are the core config's, and :attr:`stage` is built from their *current* values (a
    changed field is honoured at the next call; the loaded model is kept when only cheap
    settings changed). Other subclasses implement :meth:`_build_stage`, rebuilt when a field
    changes.
    """

    _stage: Optional[Stage] = PrivateAttr(default=None)
    _stage_key: Any = PrivateAttr(default=None)

    def model_post_init(self, __context: Any) -> None:
        self.stage  # validates every setting now; models still load lazily, on first use

    def _top_n(self) -> int:
        return int(getattr(self, "top_n", None) or 0)

    def _model_name(self) -> str:
        return str(getattr(self, "model", None) or self.class_name())

    def _query(self, query_bundle: Optional[QueryBundle]) -> str:
        if query_bundle is None:
            raise ValueError(f"{self.class_name()} needs the query: pass query_bundle= or "
                             "query_str= to postprocess_nodes().")
        return check_query(query_bundle.query_str)

    def _postprocess_nodes(self, nodes: List[NodeWithScore],
                           query_bundle: Optional[QueryBundle] = None) -> List[NodeWithScore]:
        query = self._query(query_bundle)
        if not nodes or not query:
            return list(nodes)
        dispatcher.event(ReRankStartEvent(query=query_bundle, nodes=nodes, top_n=self._top_n(),
                                          model_name=self._model_name()))
        units = self.stage(query, nodes_to_units(nodes))
        out = units_to_nodes(units, nodes)
        dispatcher.event(ReRankEndEvent(nodes=out))
        return out

    async def _apostprocess_nodes(self, nodes: List[NodeWithScore],
                                  query_bundle: Optional[QueryBundle] = None) -> List[NodeWithScore]:
        query = self._query(query_bundle)
        if not nodes or not query:
            return list(nodes)
        dispatcher.event(ReRankStartEvent(query=query_bundle, nodes=nodes, top_n=self._top_n(),
                                          model_name=self._model_name()))
        units = await self.stage.acall(query, nodes_to_units(nodes))
        out = units_to_nodes(units, nodes)
        dispatcher.event(ReRankEndEvent(nodes=out))
        return out


class UnitRetriever(BaseRetriever):
    """A LlamaIndex retriever whose subclasses implement :meth:`_search` over ``funnel_core``.

    An empty or whitespace query returns ``[]``; a non-string query raises ``TypeError``.
    ``_aretrieve`` runs the search in a worker thread so the event loop keeps running.
    """

    @abstractmethod
    def _search(self, query: str) -> list[Unit]:
        """Return the units for a (non-empty, stripped) query."""

    def _retrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        query = check_query(query_bundle.query_str)
        if not query:
            return []
        return units_to_nodes(self._search(query), self._originals())

    async def _asearch(self, query: str) -> list[Unit]:
        """Async twin of :meth:`_search`; by default :meth:`_search` in a worker thread."""
        return await asyncio.to_thread(self._search, query)

    async def _aretrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        query = check_query(query_bundle.query_str)
        if not query:
            return []
        units = await self._asearch(query)
        return units_to_nodes(units, self._originals())

    def _originals(self) -> Sequence[BaseNode]:
        """Original nodes to copy back (override when the retriever keeps them)."""
        return ()


def as_query_str(query: Any) -> str:
    """A ``str`` or ``QueryBundle`` -> the query text."""
    return query.query_str if isinstance(query, QueryBundle) else query
