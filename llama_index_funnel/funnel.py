"""A FunnelRAG progressive funnel as a LlamaIndex retriever.

:class:`FunnelRetriever` runs a :class:`funnel_core.Funnel` whose stages can be ``funnel_core``
stages *or* LlamaIndex's own objects: any ``BaseRetriever`` (as a first stage) and any
``BaseNodePostprocessor`` (as a later stage), wrapped by :func:`as_stage`. The per-stage trace
is not copied onto the nodes: :meth:`FunnelRetriever.search` returns it with them, and every
query sends its own trace to LlamaIndex's instrumentation as a :class:`FunnelTraceEvent` (inside
the retrieve span of that query, so concurrent queries never mix their traces).

Nodes keep their identity across stages: every :class:`~funnel_core.units.Unit` carries the
node it came from (``unit.source``), so each stage hands the next one copies of the user's own
nodes (relationships, excluded keys and hash intact). Our postprocessors run through
``postprocess_nodes`` like any other, so rerank events and instrumentation spans are emitted
inside the funnel too.

Scores belong to the order: a postprocessor that reorders nodes without scoring them
(``LongContextReorder``, a reranker that keeps the incoming scores) leaves ``score=None`` (the
earlier stage's score stays in ``funnel_score_<stage>``, and ``funnel_reordered_by`` names the
postprocessor); one that keeps the order (``SimilarityPostprocessor``, a cut) keeps the scores
(:func:`funnel_core.units.foreign_output`). LangChain's funnel does the same with
``relevance_score``.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import BaseNode, NodeWithScore, QueryBundle

from funnel_core.errors import check_query
from funnel_core.funnel import Funnel, FunnelResult, Stage
from funnel_core.funnel import as_stage as core_as_stage
from funnel_core.settings import checked_keywords
from funnel_core.units import Trace, Unit, foreign_output, scored_by
from llama_index_funnel._base import UnitRetriever, nodes_to_units, units_to_nodes

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


def _scored(nodes: Sequence[NodeWithScore], name: str,
            before: Optional[Sequence[Unit]] = None) -> list[Unit]:
    """A LlamaIndex stage's nodes -> units; for a postprocessor (``before``: its input) a score
    it did not write is dropped once it reorders the nodes
    (:func:`funnel_core.units.foreign_output`)."""
    units = nodes_to_units(nodes)
    if before is None:
        return [scored_by(u, name) for u in units]
    return foreign_output(before, units, name)


class RetrieverStage(Stage):
    """A LlamaIndex ``BaseRetriever`` as a first funnel stage (incoming units are ignored)."""

    @checked_keywords
    def __init__(self, retriever: BaseRetriever, name: Optional[str] = None) -> None:
        self.retriever = retriever
        self.name = name or type(retriever).__name__

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        return _scored(self.retriever.retrieve(query), self.name)

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        return _scored(await self.retriever.aretrieve(query), self.name)


class PostprocessorStage(Stage):
    """A LlamaIndex ``BaseNodePostprocessor`` (ours or any other: reranker, filter, reorder...)
    as a funnel stage; it runs through ``postprocess_nodes``, so its events and spans fire."""

    @checked_keywords
    def __init__(self, postprocessor: BaseNodePostprocessor, name: Optional[str] = None) -> None:
        self.postprocessor = postprocessor
        self.name = name or postprocessor.class_name()

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        nodes = units_to_nodes(units)
        return _scored(self.postprocessor.postprocess_nodes(nodes, query_bundle=QueryBundle(query)),
                       self.name, units)

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        nodes = units_to_nodes(units)
        out = await self.postprocessor.apostprocess_nodes(nodes, query_bundle=QueryBundle(query))
        return _scored(out, self.name, units)


@checked_keywords
def as_stage(obj: Any) -> Stage:
    """A ``funnel_core`` stage, LlamaIndex retriever, node postprocessor, or callable -> Stage."""
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
        return self._nodes

    def _search(self, query: str) -> list[Unit]:
        result = self.funnel.search(query)
        dispatcher.event(FunnelTraceEvent(trace=result.trace.to_dict()))
        return result.units

    async def _asearch(self, query: str) -> list[Unit]:
        result = await self.funnel.asearch(query)
        dispatcher.event(FunnelTraceEvent(trace=result.trace.to_dict()))
        return result.units

    def search(self, query: str, answers: Optional[Sequence[str]] = None) -> tuple[List[NodeWithScore], Trace]:
        """Run the funnel and return ``(nodes, trace)``; with ``answers`` the trace records the
        answer recall that survives each stage."""
        query = check_query(query)
        result: FunnelResult = self.funnel.search(query, None, answers)
        dispatcher.event(FunnelTraceEvent(trace=result.trace.to_dict()))
        return units_to_nodes(result.units, self._originals(), self.annotate), result.trace
