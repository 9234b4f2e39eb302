"""A FunnelRAG progressive funnel as a LlamaIndex retriever: :class:`FunnelRetriever` runs a
:class:`funnel_core.Funnel` of ``funnel_core`` stages and LlamaIndex retrievers and node
postprocessors (:func:`as_stage`), converting once each way: our own objects run on the units,
any other through LlamaIndex. The output is copies of the user's nodes; each query's trace goes
out as a :class:`FunnelTraceEvent`. See "Chaining" and "What comes back" in ``docs/frameworks.md``.
"""

from __future__ import annotations

from collections import ChainMap
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator, List, Mapping, Optional, Sequence

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
    """One funnel query's trace (:meth:`funnel_core.units.Trace.to_dict`), sent to LlamaIndex's
    instrumentation (an event handler on ``get_dispatcher()`` receives it) in its retrieve span."""

    trace: dict[str, Any]

    @classmethod
    def class_name(cls) -> str:
        return "FunnelTraceEvent"


class _Seen:
    """One query's nodes, to turn its units back into copies of the user's nodes: the sources
    of units from LlamaIndex objects and the node maps of our retrievers in the funnel."""

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


def _seen_lookup(*more: Mapping[str, BaseNode]) -> Mapping[str, BaseNode]:
    """The nodes seen in the query being run, then ``more``."""
    seen = _SEEN.get()
    return seen.lookup(*more) if seen is not None else ChainMap({}, *more)  # type: ignore[arg-type]


def _scored(nodes: Sequence[NodeWithScore], name: str,
            before: Optional[Sequence[Unit]] = None) -> list[Unit]:
    """A LlamaIndex stage's nodes -> units (:func:`funnel_core.units.adopted`), their nodes seen."""
    units = nodes_to_units(nodes)
    if (seen := _SEEN.get()) is not None:
        seen.add(units)
    return adopted(units, name, before)


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


def _handed(owner: Any, units: Optional[list[Unit]], call: Callable[[], Any], asynchronous: bool) -> Any:
    """The units ``owner`` returns when ``call()`` (its LlamaIndex method, run so that its events
    and spans fire, the nodes built for their payload only) works on ``units``
    (:func:`~llama_index_funnel._base.handing`); with ``asynchronous``, an awaitable of them."""
    async def arun() -> list[Unit]:
        with handing(owner, units) as hand:
            await call()
        return hand.out or []

    if asynchronous:
        return arun()
    with handing(owner, units) as hand:
        call()
    return hand.out or []


class OwnRetrieverStage(RetrieverStage):
    """One of our retrievers (:class:`~llama_index_funnel._base.UnitRetriever`) as a first
    stage: its ``_search``, whose units go on as they are (no node is built), or, while a
    handler listens (:func:`_listened`), its ``retrieve``."""

    retriever: UnitRetriever

    def _call(self, query: str, units: list[Unit], asynchronous: bool) -> Any:
        r = self.retriever
        if not _listened(r):
            return (r._asearch if asynchronous else r._search)(query)
        return _handed(r, None, lambda: (r.aretrieve if asynchronous else r.retrieve)(query), asynchronous)

    def _units(self, output: Any, before: list[Unit]) -> list[Unit]:
        seen = _SEEN.get()
        if seen is not None:
            originals = self.retriever._originals()
            seen.corpora.append(originals if isinstance(originals, Mapping)
                                else {n.node_id: n for n in originals})
        return [scored_by(settled(u), self.name) for u in output]


class OwnPostprocessorStage(PostprocessorStage):
    """One of our postprocessors (:class:`~llama_index_funnel._base.StagePostprocessor`): its
    core stage on the units (no node is built), or, while a handler listens, its
    ``postprocess_nodes`` working on the units handed to it."""

    postprocessor: StagePostprocessor

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        return super().run(query, units) if units else []  # nothing to postprocess, no event

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        return await super().arun(query, units) if units else []

    def _call(self, query: str, units: list[Unit], asynchronous: bool) -> Any:
        p = self.postprocessor
        if not _listened(p):
            return (p.stage.acall if asynchronous else p.stage)(query, units)
        run = p.apostprocess_nodes if asynchronous else p.postprocess_nodes
        return _handed(p, units, lambda: run(units_to_nodes(units, _seen_lookup()),
                                             query_bundle=QueryBundle(query)), asynchronous)

    def _units(self, output: Any, before: list[Unit]) -> list[Unit]:
        return foreign_output(before, output, self.name)


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
        return _seen_lookup(self._nodes)

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
