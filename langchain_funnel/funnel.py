"""A FunnelRAG progressive funnel as a LangChain retriever: :class:`FunnelRetriever` runs a
:class:`funnel_core.Funnel` of ``funnel_core`` stages and LangChain objects (:func:`as_stage`),
converting once each way; the trace goes to :meth:`FunnelRetriever.search` and to callbacks as
the custom event ``"funnel_trace"`` (see "Chaining" and "What comes back" in
``docs/frameworks.md``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional, Sequence

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForRetrieverRun,
    CallbackManager,
    CallbackManagerForRetrieverRun,
    adispatch_custom_event,
    dispatch_custom_event,
)
from langchain_core.documents import BaseDocumentCompressor, BaseDocumentTransformer, Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable
from langchain_core.runnables.config import ensure_config, set_config_context
from pydantic import Field

from funnel_core.errors import check_query
from funnel_core.funnel import CallStage, Funnel, FunnelResult, Stage, defined_by, runs_as
from funnel_core.funnel import as_stage as core_as_stage
from funnel_core.settings import checked_keywords
from funnel_core.units import Trace, Unit, adopted, foreign_output, scored_by, settled
from langchain_funnel._base import (
    DEFAULT_K,
    StageCompressor,
    UnitRetriever,
    documents_to_units,
    units_to_documents,
)
from langchain_funnel.rerank import TransformerBase

__all__ = ["rerank_chain", "FunnelRetriever", "LCRetrieverStage", "LCCompressorStage", "LCTransformerStage",
           "LCRunnableStage", "as_stage"]


def _scored(docs: Any, name: str, before: Optional[Sequence[Unit]] = None) -> list[Unit]:
    """A LangChain stage's documents -> units (:func:`funnel_core.units.adopted`)."""
    if not isinstance(docs, (list, tuple)) or not all(isinstance(d, Document) for d in docs):
        raise TypeError(f"funnel stage {name!r} must return a list of Documents, got "
                        f"{type(docs).__name__}.")
    return adopted(documents_to_units(list(docs)), name, before)


#: Name of the custom callback event that carries a funnel run's trace (``Trace.to_dict()``).
TRACE_EVENT = "funnel_trace"


def _callbacks() -> Any:
    """The callbacks of the run we are inside (FunnelRetriever sets them as the context)."""
    return ensure_config().get("callbacks")


def _listening() -> bool:
    """Whether the trace has a run to be reported to (``on_custom_event``)."""
    return getattr(_callbacks(), "parent_run_id", None) is not None


def _name(obj: Any, name: Optional[str]) -> str:
    return name or getattr(obj, "name", None) or type(obj).__name__


class _Wrapped(CallStage):
    """A LangChain object run through LangChain, converting only around it."""

    def _units(self, output: Any, before: list[Unit]) -> list[Unit]:
        return _scored(output, self.name, before)


class LCRetrieverStage(_Wrapped):
    """A LangChain retriever (or any runnable ``query -> documents``) as a first funnel stage
    (incoming units are ignored)."""

    @checked_keywords
    def __init__(self, retriever: Runnable, name: Optional[str] = None) -> None:
        self.retriever, self.name = retriever, name or type(retriever).__name__

    def _call(self, query: str, units: list[Unit], asynchronous: bool) -> Any:
        return (self.retriever.ainvoke if asynchronous else self.retriever.invoke)(query)

    def _units(self, output: Any, before: list[Unit]) -> list[Unit]:
        return _scored(output, self.name)


class LCCompressorStage(_Wrapped):
    """A LangChain ``BaseDocumentCompressor`` (ours or any other) as a funnel stage; it runs as a
    child of the retriever's run."""

    @checked_keywords
    def __init__(self, compressor: BaseDocumentCompressor, name: Optional[str] = None) -> None:
        self.compressor, self.name = compressor, _name(compressor, name)

    def _call(self, query: str, units: list[Unit], asynchronous: bool) -> Any:
        c = self.compressor
        return (c.acompress_documents if asynchronous else c.compress_documents)(
            units_to_documents(units), query, callbacks=_callbacks())

    def _units(self, output: Any, before: list[Unit]) -> list[Unit]:
        return _scored(list(output), self.name, before)


class LCTransformerStage(_Wrapped):
    """A LangChain ``BaseDocumentTransformer`` (documents -> documents) as a funnel stage."""

    @checked_keywords
    def __init__(self, transformer: BaseDocumentTransformer, name: Optional[str] = None) -> None:
        self.transformer, self.name = transformer, _name(transformer, name)

    def _call(self, query: str, units: list[Unit], asynchronous: bool) -> Any:
        t, docs = self.transformer, units_to_documents(units)
        if isinstance(t, Runnable):
            return (t.ainvoke if asynchronous else t.invoke)(docs)
        return (t.atransform_documents if asynchronous else t.transform_documents)(docs)

    def _units(self, output: Any, before: list[Unit]) -> list[Unit]:
        return _scored(output if isinstance(self.transformer, Runnable) else list(output),
                       self.name, before)


class LCRunnableStage(_Wrapped):
    """A runnable ``{"query": str, "documents": list[Document]} -> list[Document]`` as a stage."""

    @checked_keywords
    def __init__(self, runnable: Runnable, name: Optional[str] = None) -> None:
        self.runnable, self.name = runnable, _name(runnable, name)

    def _call(self, query: str, units: list[Unit], asynchronous: bool) -> Any:
        r = self.runnable
        return (r.ainvoke if asynchronous else r.invoke)({"query": query,
                                                          "documents": units_to_documents(units)})


class OwnStage(Stage):
    """One of this package's objects (``kind``: ``"retriever"``, ``"compressor"`` or
    ``"transformer"``) run as its ``funnel_core`` work on units, building no ``Document``;
    while callbacks listen it is still a child run with Documents as its input and output
    (built for the callbacks only)."""

    def __init__(self, obj: Any, name: str, kind: str) -> None:
        self.obj, self.name, self.kind = obj, name, kind

    def _work(self, query: str, units: list[Unit]) -> list[Unit]:
        """A retriever's ``_search`` (its own ``k`` and ``filter``), or the core stage's call."""
        obj = self.obj
        if self.kind == "retriever":
            return obj._search(*obj._prepare(query, None, {}))
        if self.kind == "compressor":
            return obj.stage(query, units) if units else []
        return obj.stage.run(query, units)

    async def _awork(self, query: str, units: list[Unit]) -> list[Unit]:
        obj = self.obj
        if self.kind == "retriever":
            return await obj._asearch(*obj._prepare(query, None, {}))
        if self.kind == "compressor":
            return await obj.stage.acall(query, units) if units else []
        return await asyncio.to_thread(obj.stage.run, query, units)

    def _done(self, before: list[Unit], out: list[Unit]) -> list[Unit]:
        if self.kind == "retriever":
            return [scored_by(settled(u), self.name) for u in out]
        return foreign_output(before, out, self.name)

    def _start(self, cm: Any, query: str, units: list[Unit]) -> Any:
        """Start the child run, as the object's own ``invoke`` reports it."""
        if self.kind == "retriever":
            return cm.on_retriever_start(None, query, name=self.obj.get_name())
        docs = units_to_documents(units)
        return cm.on_chain_start(None, docs if self.kind == "transformer" else
                                 {"query": query, "documents": docs}, name=self.obj.get_name())

    def _manager(self, cls: Any) -> Any:
        """The callback manager of the object's run, ``None`` when nobody listens."""
        callbacks = _callbacks()
        if callbacks is None:
            return None
        cm = cls.configure(callbacks, None, local_tags=getattr(self.obj, "tags", None),
                           local_metadata=getattr(self.obj, "metadata", None))
        return cm if cm.handlers else None

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        cm = self._manager(CallbackManager)
        if cm is None:
            return self._done(units, self._work(query, units))
        run = self._start(cm, query, units)
        try:
            with set_config_context({"callbacks": run.get_child()}) as ctx:
                out = self._done(units, ctx.run(self._work, query, units))
        except BaseException as e:
            _end(run, error=e)
            raise
        _end(run, out)
        return out

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        cm = self._manager(AsyncCallbackManager)
        if cm is None:
            return self._done(units, await self._awork(query, units))
        run = await self._start(cm, query, units)
        try:
            with set_config_context({"callbacks": run.get_child()}) as ctx:
                out = self._done(units, await asyncio.create_task(self._awork(query, units),
                                                                  context=ctx))
        except BaseException as e:
            await _end(run, error=e)
            raise
        await _end(run, out)
        return out


def _end(run: Any, units: Optional[list[Unit]] = None, error: Optional[BaseException] = None) -> Any:
    """End a child run (retriever or chain) with the units as Documents, or with ``error``."""
    retriever = isinstance(run, (CallbackManagerForRetrieverRun, AsyncCallbackManagerForRetrieverRun))
    if error is not None:
        return run.on_retriever_error(error) if retriever else run.on_chain_error(error)
    docs = units_to_documents(units or [])
    return run.on_retriever_end(docs) if retriever else run.on_chain_end(docs)


def _own(obj: Any) -> Optional[Stage]:
    """The :class:`OwnStage` of one of our objects (not overriding their run), else ``None``."""
    if isinstance(obj, UnitRetriever) and runs_as(
            obj, (UnitRetriever, FunnelRetriever), "_get_relevant_documents",
            "_aget_relevant_documents"):
        return OwnStage(obj, type(obj).__name__, "retriever")
    name = _name(obj, None)
    if isinstance(obj, StageCompressor) and runs_as(
            obj, (StageCompressor,), "compress_documents", "acompress_documents", "invoke",
            "ainvoke", "_compress", "_acompress"):
        return OwnStage(obj, name, "compressor")
    if isinstance(obj, TransformerBase) and all(
            (defined_by(type(obj), m) or object).__module__.startswith("langchain_funnel.")
            # the defaults: atransform_documents and ainvoke run the sync method in a thread
            or defined_by(type(obj), m) in (Runnable, BaseDocumentTransformer)
            for m in ("transform_documents", "atransform_documents", "invoke", "ainvoke")):
        return OwnStage(obj, name, "transformer")  # each of ours is its stage's run
    return None


@checked_keywords
def as_stage(obj: Any, first: bool = False) -> Stage:
    """A ``funnel_core`` stage, LangChain retriever, compressor, transformer, runnable or
    callable -> Stage (ours: :class:`OwnStage`; others run through LangChain, converted around
    them). With ``first``, a plain runnable is read as ``query -> documents``."""
    own = _own(obj)
    if own is not None:
        return own
    if isinstance(obj, BaseRetriever):
        return LCRetrieverStage(obj)
    if isinstance(obj, BaseDocumentCompressor):
        return LCCompressorStage(obj)
    if isinstance(obj, BaseDocumentTransformer):
        return LCTransformerStage(obj)
    if isinstance(obj, Runnable):
        return LCRetrieverStage(obj) if first else LCRunnableStage(obj)
    return core_as_stage(obj)


class FunnelRetriever(UnitRetriever):
    """FunnelRAG's coarse-to-fine funnel as a LangChain retriever (``k=None``: no cap); each
    stage is a child run. :class:`~langchain_funnel.compression.CompressionRetriever` and
    :func:`rerank_chain` build one too. Build with :meth:`from_stages`::

        funnel = FunnelRetriever.from_stages(clustered_retriever, CrossEncoderReranker(...),
                                             LaterChunkingTransformer(...), k=4)
        chain = {"context": funnel | format_docs, "question": RunnablePassthrough()} | prompt | llm
    """

    funnel: Funnel = Field(description="The funnel_core Funnel this retriever runs.")
    _k_optional = True

    @classmethod
    @checked_keywords
    def from_stages(cls, *stages: Any, k: Optional[int] = DEFAULT_K) -> "FunnelRetriever":
        one = len(stages) == 1 and isinstance(stages[0], Funnel)
        return cls(funnel=stages[0] if one else build_funnel(stages), k=k)

    def _search(self, query: str, k: Optional[int]) -> list[Unit]:
        result = self.funnel.search(query)
        if _listening():
            dispatch_custom_event(TRACE_EVENT, result.trace.to_dict())
        return result.units[:k]

    async def _asearch(self, query: str, k: Optional[int], **kwargs: Any) -> list[Unit]:
        result = await self.funnel.asearch(query)
        if _listening():
            await adispatch_custom_event(TRACE_EVENT, result.trace.to_dict())
        return result.units[:k]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                k: int | None = None, **kwargs: Any) -> list[Document]:
        with set_config_context({"callbacks": run_manager.get_child()}) as ctx:
            return ctx.run(super()._get_relevant_documents, query, run_manager=run_manager, k=k,
                           **kwargs)

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun,
                                       k: int | None = None, **kwargs: Any) -> list[Document]:
        parent = super()._aget_relevant_documents
        with set_config_context({"callbacks": run_manager.get_child()}) as ctx:
            return await asyncio.create_task(parent(query, run_manager=run_manager, k=k, **kwargs),
                                             context=ctx)

    def search(self, query: str, answers: Optional[Sequence[str]] = None) -> tuple[list[Document], Trace]:
        """Run the funnel and return ``(documents, trace)`` (answer recall per stage with answers)."""
        query = check_query(query)
        result: FunnelResult = self.funnel.search(query, answers=answers)
        return units_to_documents(result.units[: self.k]), result.trace


def build_funnel(stages: Sequence[Any]) -> Funnel:
    """Stages (LangChain objects or ``funnel_core`` stages) -> a ``Funnel``."""
    return Funnel([as_stage(s, first=(i == 0)) for i, s in enumerate(stages)])


@checked_keywords
def rerank_chain(retriever: Runnable, *compressors: Any) -> Any:
    """``retriever`` then ``compressors`` as one :class:`FunnelRetriever` (no ``k`` cap)."""
    return FunnelRetriever.from_stages(retriever, *compressors, k=None)
