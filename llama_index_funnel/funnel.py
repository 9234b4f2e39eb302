"""A FunnelRAG progressive funnel as a LlamaIndex retriever.

:class:`FunnelRetriever` runs a :class:`funnel_core.Funnel` whose stages can be ``funnel_core``
stages *or* LlamaIndex objects: any ``BaseRetriever`` (as a first stage) and any
``BaseNodePostprocessor`` (as a later stage), wrapped by :func:`as_stage`. It converts once each
way: this package's own retrievers and postprocessors run as their ``funnel_core`` work on the
units (:class:`OwnRetrieverStage`, :class:`OwnPostprocessorStage`; while an event or span
handler listens they still run through ``retrieve`` / ``postprocess_nodes``, so their events
and spans fire), any other object through LlamaIndex, converted only around it. The output is
copies of the user's own nodes (found through ``unit.source`` or by id among the nodes of the
funnel's retrievers). The per-stage trace is not copied onto the nodes:
:meth:`FunnelRetriever.search` returns it with them, and every query sends its own trace as a
:class:`FunnelTraceEvent` inside its retrieve span. Scores belong to the order: a postprocessor
that reorders without scoring leaves ``score=None``
(:func:`funnel_core.units.foreign_output`). See "Chaining" and "What comes back" in
``docs/frameworks.md``.
"""

from __future__ import annotations

from collections import ChainMap
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator, List, Mapping, Optional, Sequence

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import BaseNode, NodeWithScore, QueryBundle

from funnel_core.errors import check_query
from funnel_core.funnel import CallStage, Funnel, FunnelResult, Stage, runs_as
from funnel_core.funnel import as_stage as core_as_stage
from funnel_core.settings import checked_keywords
from funnel_core.units import Trace, Unit, adopted, foreign_output, scored_by, settled
from llama_index_funnel._base import (
    StagePostprocessor,
    UnitRetriever,
    handing,
    nodes_to_units,
    units_to_nodes,
)

__all__ = ["FunnelRetriever", "FunnelTraceEvent", "RetrieverStage", "PostprocessorStage", "as_stage"]

dispatcher = get_dispatcher(__name__)


class FunnelTraceEvent(BaseEvent):
    """One funnel query's per-stage trace (:meth:`funnel_core.units.Trace.to_dict`: the query, and
    units in/out and seconds per stage), sent to LlamaIndex's instrumentation (an event handler
    added to ``llama_index.core.instrumentation.get_dispatcher()`` receives it) in that query's
    retrieve span."""

    trace: dict[str, Any]

    @classmethod
    def class_name(cls) -> str:
        return "FunnelTraceEvent"


class _Seen:
    """One query's framework objects, for turning its units back into copies of the user's
    nodes: the sources of the units that entered from LlamaIndex objects, and the node maps of
    our retrievers in the funnel (their units carry no node)."""

    def __init__(self) -> None:
        self.nodes: dict[str, BaseNode] = {}
        self.corpora: list[Mapping[str, BaseNode]] = []

    def add(self, units: Sequence[Unit]) -> None:
        for u in units:
            if isinstance(u.source, BaseNode):
                self.nodes.setdefault(u.id, u.source)

    def lookup(self, *more: Mapping[str, BaseNode]) -> Mapping[str, BaseNode]:
        return ChainMap(self.nodes, *self.corpora, *more)  # type: ignore[arg-type]


_SEEN: ContextVar[Optional[_Seen]] = ContextVar("funnel_seen", default=None)


@contextmanager
def _query_scope() -> Iterator[None]:
    """A :class:`_Seen` for the query being run (a nested funnel shares its outer one's)."""
    token = _SEEN.set(_Seen()) if _SEEN.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            _SEEN.reset(token)


def _seen_lookup() -> Mapping[str, BaseNode]:
    seen = _SEEN.get()
    return seen.lookup() if seen is not None else {}


def _seen_add(units: list[Unit]) -> list[Unit]:
    seen = _SEEN.get()
    if seen is not None:
        seen.add(units)
    return units


def _scored(nodes: Sequence[NodeWithScore], name: str,
            before: Optional[Sequence[Unit]] = None) -> list[Unit]:
    """A LlamaIndex stage's nodes -> units (:func:`funnel_core.units.adopted`)."""
    return adopted(_seen_add(nodes_to_units(nodes)), name, before)


class RetrieverStage(CallStage):
    """A LlamaIndex ``BaseRetriever`` as a first funnel stage (incoming units are ignored)."""

    @checked_keywords
    def __init__(self, retriever: BaseRetriever, name: Optional[str] = None) -> None:
        self.retriever, self.name = retriever, name or type(retriever).__name__

    def _call(self, query: str, units: list[Unit], asynchronous: bool) -> Any:
        return (self.retriever.aretrieve if asynchronous else self.retriever.retrieve)(query)

    def _units(self, output: Any, before: list[Unit]) -> list[Unit]:
        return _scored(output, self.name)


class PostprocessorStage(CallStage):
    """A LlamaIndex ``BaseNodePostprocessor`` (ours or any other: reranker, filter, reorder...)
    as a funnel stage; it runs through ``postprocess_nodes``, so its events and spans fire."""

    @checked_keywords
    def __init__(self, postprocessor: BaseNodePostprocessor, name: Optional[str] = None) -> None:
        self.postprocessor, self.name = postprocessor, name or postprocessor.class_name()

    def _call(self, query: str, units: list[Unit], asynchronous: bool) -> Any:
        p = self.postprocessor
        return (p.apostprocess_nodes if asynchronous else p.postprocess_nodes)(
            units_to_nodes(units, _seen_lookup()), query_bundle=QueryBundle(query))

    def _units(self, output: Any, before: list[Unit]) -> list[Unit]:
        return _scored(output, self.name, before)


def _listened(obj: Any) -> bool:
    """Whether anything would see ``obj``'s events or spans: a handler on its callback manager,
    or an event or span handler (other than LlamaIndex's null ones) on any dispatcher."""
    from llama_index.core.instrumentation.event_handlers import NullEventHandler
    from llama_index.core.instrumentation.span_handlers import NullSpanHandler

    cm = getattr(obj, "callback_manager", None)
    if cm is not None and cm.handlers:
        return True
    manager = dispatcher.manager
    dispatchers = manager.dispatchers.values() if manager is not None else [dispatcher.root]
    return any(not isinstance(h, NullEventHandler) for d in dispatchers for h in d.event_handlers) \
        or any(not isinstance(h, NullSpanHandler) for d in dispatchers for h in d.span_handlers)


class OwnRetrieverStage(Stage):
    """One of our retrievers (:class:`~llama_index_funnel._base.UnitRetriever`) as a first
    stage: its ``_search`` (its own ``similarity_top_k`` and ``filters``), whose units go on
    as they are: no node is built. While a handler listens (:func:`_listened`) it runs through
    ``retrieve``, so its events and spans fire as before, with nodes built for their payload
    only; the units it found are handed back (:func:`~llama_index_funnel._base.handing`)."""

    def __init__(self, retriever: Any, name: Optional[str] = None) -> None:
        self.retriever = retriever
        self.name = name or type(retriever).__name__

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        if not _listened(self.retriever):
            return self._done(self.retriever._search(query))
        with handing(self.retriever) as hand:
            self.retriever.retrieve(query)
        return self._done(hand.out or [])

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        if not _listened(self.retriever):
            return self._done(await self.retriever._asearch(query))
        with handing(self.retriever) as hand:
            await self.retriever.aretrieve(query)
        return self._done(hand.out or [])

    def _done(self, out: list[Unit]) -> list[Unit]:
        seen = _SEEN.get()
        if seen is not None:
            originals = self.retriever._originals()
            seen.corpora.append(originals if isinstance(originals, Mapping)
                                else {n.node_id: n for n in originals})
        return [scored_by(settled(u), self.name) for u in out]


class OwnPostprocessorStage(Stage):
    """One of our postprocessors (:class:`~llama_index_funnel._base.StagePostprocessor`): its
    core stage on the units, as ``postprocess_nodes`` runs it, with no node built. While a
    handler listens it runs through ``postprocess_nodes`` (rerank events, callback events and
    spans as before, nodes built for their payload only) and works on the units handed to it."""

    def __init__(self, postprocessor: Any, name: Optional[str] = None) -> None:
        self.postprocessor = postprocessor
        self.name = name or postprocessor.class_name()

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        if not units:
            return []
        if not _listened(self.postprocessor):
            return foreign_output(units, self.postprocessor.stage(query, units), self.name)
        with handing(self.postprocessor, units) as hand:
            self.postprocessor.postprocess_nodes(units_to_nodes(units, _seen_lookup()),
                                                 query_bundle=QueryBundle(query))
        return foreign_output(units, hand.out or [], self.name)

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        if not units:
            return []
        if not _listened(self.postprocessor):
            out = await self.postprocessor.stage.acall(query, units)
            return foreign_output(units, out, self.name)
        with handing(self.postprocessor, units) as hand:
            await self.postprocessor.apostprocess_nodes(units_to_nodes(units, _seen_lookup()),
                                                        query_bundle=QueryBundle(query))
        return foreign_output(units, hand.out or [], self.name)


@checked_keywords
def as_stage(obj: Any) -> Stage:
    """A ``funnel_core`` stage, LlamaIndex retriever, node postprocessor, or callable -> Stage.
    This package's own retrievers and postprocessors become their units-level work
    (:class:`OwnRetrieverStage`, :class:`OwnPostprocessorStage`: no node is built between
    stages); any other LlamaIndex object runs through LlamaIndex, converting only around it."""
    if isinstance(obj, UnitRetriever) and runs_as(
            obj, (UnitRetriever, FunnelRetriever), "_retrieve", "_aretrieve"):
        return OwnRetrieverStage(obj)
    if isinstance(obj, StagePostprocessor) and runs_as(
            obj, (StagePostprocessor,), "_postprocess_nodes", "_apostprocess_nodes"):
        return OwnPostprocessorStage(obj)
    if isinstance(obj, BaseRetriever):
        return RetrieverStage(obj)
    if isinstance(obj, BaseNodePostprocessor):
        return PostprocessorStage(obj)
    return core_as_stage(obj)


class FunnelRetriever(UnitRetriever):
    """FunnelRAG's coarse-to-fine funnel as a LlamaIndex retriever.

    Args:
        stages: ``funnel_core`` stages (``stage % k`` for cut-offs, :class:`LaterChunking` for
            granularity changes) and/or LlamaIndex retrievers and node postprocessors.
        nodes: Nodes your stages return by id (optional): results become copies of them.

    Example::

        funnel = FunnelRetriever([ClusteredBM25Retriever.from_defaults(nodes=nodes),
                                  CrossEncoderRerank(model=path, top_n=8),
                                  LaterChunkingPostprocessor(words=100),
                                  CrossEncoderRerank(model=path, top_n=4)])
        engine = RetrieverQueryEngine.from_args(funnel, llm=llm)
    """

    @checked_keywords
    def __init__(self, stages: Sequence[Any] | Funnel, nodes: Optional[Sequence[BaseNode]] = None,
                 callback_manager: Optional[CallbackManager] = None, verbose: bool = False) -> None:
        self.funnel = stages if isinstance(stages, Funnel) else Funnel([as_stage(s) for s in stages])
        self._nodes = {n.node_id: n for n in nodes or ()}
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    def _originals(self) -> Mapping[str, BaseNode]:
        """The given nodes, and (inside a query) the nodes its stages brought in."""
        seen = _SEEN.get()
        return seen.lookup(self._nodes) if seen is not None else self._nodes

    def _retrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        with _query_scope():
            return super()._retrieve(query_bundle)

    async def _aretrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        with _query_scope():
            return await super()._aretrieve(query_bundle)

    def _search(self, query: str) -> list[Unit]:
        with _query_scope():
            return _traced(self.funnel.search(query)).units

    async def _asearch(self, query: str) -> list[Unit]:
        with _query_scope():
            return _traced(await self.funnel.asearch(query)).units

    def search(self, query: str, answers: Optional[Sequence[str]] = None) -> tuple[List[NodeWithScore], Trace]:
        """Run the funnel and return ``(nodes, trace)``; with ``answers`` the trace records the
        answer recall that survives each stage."""
        query = check_query(query)
        with _query_scope():
            result = _traced(self.funnel.search(query, None, answers))
            return units_to_nodes(result.units, self._originals(), self.annotate), result.trace


def _traced(result: FunnelResult) -> FunnelResult:
    """Send the query's trace to LlamaIndex's instrumentation (in its retrieve span)."""
    dispatcher.event(FunnelTraceEvent(trace=result.trace.to_dict()))
    return result
