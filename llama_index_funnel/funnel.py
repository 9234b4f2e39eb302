"""A FunnelRAG progressive funnel as a LlamaIndex retriever.

:class:`FunnelRetriever` runs a :class:`funnel_core.Funnel` whose stages can be ``funnel_core``
stages *or* LlamaIndex's own objects: any ``BaseRetriever`` (as a first stage) and any
``BaseNodePostprocessor`` (as a later stage), wrapped by :func:`as_stage`. Every returned node
carries the whole trace in ``metadata["funnel_trace"]``.

Nodes that come from LlamaIndex components keep their identity across stages: each wrapper
registers the nodes it sees in a per-call registry (a ``ContextVar``, so concurrent and async
calls never mix), and the final units are converted back into copies of those nodes with their
relationships intact.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Dict, List, Optional, Sequence

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import BaseNode, NodeWithScore, QueryBundle

from funnel_core.errors import check_query
from funnel_core.funnel import Funnel, FunnelResult, Stage
from funnel_core.funnel import as_stage as core_as_stage
from funnel_core.units import Unit
from llama_index_funnel._base import UnitRetriever, nodes_to_units, units_to_nodes

__all__ = ["FunnelRetriever", "RetrieverStage", "PostprocessorStage", "as_stage"]

_REGISTRY: ContextVar[Optional[Dict[str, BaseNode]]] = ContextVar("funnel_node_registry", default=None)


def _register(nodes: Sequence[NodeWithScore]) -> None:
    reg = _REGISTRY.get()
    if reg is not None:
        for n in nodes:
            reg[n.node.node_id] = n.node


def _originals() -> list[BaseNode]:
    return list((_REGISTRY.get() or {}).values())


class RetrieverStage(Stage):
    """A LlamaIndex ``BaseRetriever`` as a first funnel stage (incoming units are ignored)."""

    def __init__(self, retriever: BaseRetriever, name: Optional[str] = None) -> None:
        self.retriever = retriever
        self.name = name or type(retriever).__name__

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        nodes = self.retriever.retrieve(query)
        _register(nodes)
        return [u.rescored(u.score if u.score is not None else 0.0, self.name) for u in nodes_to_units(nodes)]

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        nodes = await self.retriever.aretrieve(query)
        _register(nodes)
        return [u.rescored(u.score if u.score is not None else 0.0, self.name) for u in nodes_to_units(nodes)]


class PostprocessorStage(Stage):
    """A LlamaIndex ``BaseNodePostprocessor`` (reranker, filter, reorder...) as a funnel stage."""

    def __init__(self, postprocessor: BaseNodePostprocessor, name: Optional[str] = None) -> None:
        self.postprocessor = postprocessor
        self.name = name or postprocessor.class_name()

    def _out(self, nodes: Sequence[NodeWithScore]) -> list[Unit]:
        _register(nodes)
        units = nodes_to_units(nodes)
        return [u.rescored(u.score, self.name) if u.score is not None else u for u in units]

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        nodes = units_to_nodes(units, _originals())
        return self._out(self.postprocessor.postprocess_nodes(nodes, query_bundle=QueryBundle(query)))

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        nodes = units_to_nodes(units, _originals())
        return self._out(await self.postprocessor.apostprocess_nodes(nodes, query_bundle=QueryBundle(query)))


def as_stage(obj: Any) -> Stage:
    """A ``funnel_core`` stage, LlamaIndex retriever, node postprocessor, or callable -> Stage."""
    if isinstance(obj, BaseRetriever):
        return RetrieverStage(obj)
    if isinstance(obj, BaseNodePostprocessor):
        stage = getattr(obj, "stage", None)  # our own postprocessors: use the core stage directly
        return stage if isinstance(stage, Stage) else PostprocessorStage(obj)
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

    def __init__(self, stages: Sequence[Any] | Funnel, nodes: Optional[Sequence[BaseNode]] = None,
                 callback_manager: Optional[CallbackManager] = None, verbose: bool = False) -> None:
        self.funnel = stages if isinstance(stages, Funnel) else Funnel([as_stage(s) for s in stages])
        self._nodes = {n.node_id: n for n in nodes or ()}
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    def _search(self, query: str) -> list[Unit]:
        return self.funnel.search(query).units

    async def _asearch(self, query: str) -> list[Unit]:
        return (await self.funnel.asearch(query)).units

    def _with_registry(self, fn, *args):
        token = _REGISTRY.set(dict(self._nodes))
        try:
            out = fn(*args)
            return out, _originals()
        finally:
            _REGISTRY.reset(token)

    def _retrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        query = check_query(query_bundle.query_str)
        if not query:
            return []
        units, originals = self._with_registry(self._search, query)
        return units_to_nodes(units, originals)

    async def _aretrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        query = check_query(query_bundle.query_str)
        if not query:
            return []
        token = _REGISTRY.set(dict(self._nodes))
        try:
            units = await self._asearch(query)
            return units_to_nodes(units, _originals())
        finally:
            _REGISTRY.reset(token)

    def search(self, query: str, answers: Optional[Sequence[str]] = None) -> tuple[List[NodeWithScore], Any]:
        """Run the funnel and return ``(nodes, trace)``; with ``answers`` the trace records the
        answer recall that survives each stage."""
        query = check_query(query)
        result: FunnelResult
        result, originals = self._with_registry(self.funnel.search, query, None, answers)
        return units_to_nodes(result.units, originals), result.trace
