"""A FunnelRAG progressive funnel as a LangChain retriever.

:class:`FunnelRetriever` runs a :class:`funnel_core.Funnel` whose stages can be ``funnel_core``
stages *or* LangChain objects: any retriever (first stage), any ``BaseDocumentCompressor``, and
any runnable taking ``{"query", "documents"}`` and returning documents — wrapped by
:func:`as_stage`. The funnel runs on :class:`~funnel_core.units.Unit` objects: the documents a
LangChain object of another package returns are converted to units once, and the funnel's
output to Documents once; this package's own retrievers, compressors and transformers run as
their ``funnel_core`` work on the units (:class:`OwnStage`), so no Document is built between
them (callbacks still see each of them as a child run). The per-stage trace is not copied onto the documents (it would repeat ~1 KB
of JSON on each): :meth:`FunnelRetriever.search` returns ``(documents, trace)``, and the
retriever's run reports it to callbacks as the custom event ``"funnel_trace"``.

Scores belong to the order: a later stage that reorders documents without writing a
``relevance_score`` of its own (LangChain's ``CrossEncoderReranker``, ``LongContextReorder``)
leaves none (the earlier stage's score stays in ``funnel_score_<stage>``, and
``funnel_reordered_by`` names the stage); one that keeps the order keeps the scores
(:func:`funnel_core.units.foreign_output`). LlamaIndex's funnel does the same with
``NodeWithScore.score``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional, Sequence

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForRetrieverRun,
    CallbackManager,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import BaseDocumentCompressor, BaseDocumentTransformer, Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable
from langchain_core.runnables.config import ensure_config, set_config_context
from pydantic import Field

from funnel_core.errors import check_query
from funnel_core.funnel import Funnel, FunnelResult, Stage
from funnel_core.funnel import as_stage as core_as_stage
from funnel_core.settings import checked_keywords
from funnel_core.units import Trace, Unit, foreign_output, scored_by, settled
from langchain_funnel._base import (
    StageCompressor,
    UnitRetriever,
    documents_to_units,
    units_to_documents,
)
from langchain_funnel.rerank import TransformerBase

__all__ = ["rerank_chain", "FunnelRetriever", "LCRetrieverStage", "LCCompressorStage", "LCTransformerStage",
           "LCRunnableStage", "as_stage"]


def _scored(docs: Any, name: str, before: Optional[Sequence[Unit]] = None) -> list[Unit]:
    """A LangChain stage's documents -> units; for a later stage (``before``: its input) a score
    the stage did not write is dropped once it reorders the documents
    (:func:`funnel_core.units.foreign_output`)."""
    if not isinstance(docs, (list, tuple)) or not all(isinstance(d, Document) for d in docs):
        raise TypeError(f"funnel stage {name!r} must return a list of Documents, got "
                        f"{type(docs).__name__}.")
    units = documents_to_units(list(docs))
    if before is None:
        return [scored_by(u, name) for u in units]
    return foreign_output(before, units, name)


#: Name of the custom callback event that carries a funnel run's trace (``Trace.to_dict()``).
TRACE_EVENT = "funnel_trace"


def _report_trace(trace: Trace) -> None:
    """Send the trace to the callbacks of the retriever's run (``on_custom_event``, visible in
    ``astream_events`` as ``on_custom_event`` named ``"funnel_trace"``), not onto documents."""
    callbacks = _callbacks()
    if getattr(callbacks, "parent_run_id", None) is not None:
        from langchain_core.callbacks.manager import dispatch_custom_event

        dispatch_custom_event(TRACE_EVENT, trace.to_dict())


async def _areport_trace(trace: Trace) -> None:
    callbacks = _callbacks()
    if getattr(callbacks, "parent_run_id", None) is not None:
        from langchain_core.callbacks.manager import adispatch_custom_event

        await adispatch_custom_event(TRACE_EVENT, trace.to_dict())


def _callbacks() -> Any:
    """The callbacks of the run we are inside (FunnelRetriever sets them as the context)."""
    return ensure_config().get("callbacks")


class LCRetrieverStage(Stage):
    """A LangChain retriever (or any runnable ``query -> documents``) as a first funnel stage
    (incoming units are ignored)."""

    @checked_keywords
    def __init__(self, retriever: Runnable, name: Optional[str] = None) -> None:
        self.retriever = retriever
        self.name = name or type(retriever).__name__

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        return _scored(self.retriever.invoke(query), self.name)

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        return _scored(await self.retriever.ainvoke(query), self.name)


class LCCompressorStage(Stage):
    """A LangChain ``BaseDocumentCompressor`` (ours or any other) as a funnel stage; it runs as a
    child of the retriever's run."""

    @checked_keywords
    def __init__(self, compressor: BaseDocumentCompressor, name: Optional[str] = None) -> None:
        self.compressor = compressor
        self.name = name or getattr(compressor, "name", None) or type(compressor).__name__

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        docs = self.compressor.compress_documents(units_to_documents(units), query,
                                                  callbacks=_callbacks())
        return _scored(list(docs), self.name, units)

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        docs = await self.compressor.acompress_documents(units_to_documents(units), query,
                                                         callbacks=_callbacks())
        return _scored(list(docs), self.name, units)


class LCTransformerStage(Stage):
    """A LangChain ``BaseDocumentTransformer`` (documents -> documents) as a funnel stage."""

    @checked_keywords
    def __init__(self, transformer: BaseDocumentTransformer, name: Optional[str] = None) -> None:
        self.transformer = transformer
        self.name = name or getattr(transformer, "name", None) or type(transformer).__name__

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        docs = units_to_documents(units)
        if isinstance(self.transformer, Runnable):
            return _scored(self.transformer.invoke(docs), self.name, units)
        return _scored(list(self.transformer.transform_documents(docs)), self.name, units)

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        docs = units_to_documents(units)
        if isinstance(self.transformer, Runnable):
            return _scored(await self.transformer.ainvoke(docs), self.name, units)
        return _scored(list(await self.transformer.atransform_documents(docs)), self.name, units)


class LCRunnableStage(Stage):
    """A runnable ``{"query": str, "documents": list[Document]} -> list[Document]`` as a stage."""

    @checked_keywords
    def __init__(self, runnable: Runnable, name: Optional[str] = None) -> None:
        self.runnable = runnable
        self.name = name or getattr(runnable, "name", None) or type(runnable).__name__

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        return _scored(self.runnable.invoke({"query": query, "documents": units_to_documents(units)}),
                       self.name, units)

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        out = await self.runnable.ainvoke({"query": query, "documents": units_to_documents(units)})
        return _scored(out, self.name, units)


class OwnStage(Stage):
    """One of this package's LangChain objects run on units: its ``funnel_core`` work, with no
    ``Document`` built on either side (a funnel converts its input once and its output once).

    While callbacks listen (``config={"callbacks": ...}``, ``astream_events``, a tracer) the
    object is still a child run of the funnel's run, named as its own ``invoke`` names it, with
    Documents as its input and output: those are built for the callbacks only, from the units,
    and nothing is read back from them. With no callback nothing is built.
    """

    def __init__(self, obj: Any, name: str) -> None:
        self.obj = obj
        self.name = name

    # what the object does, on units (subclasses)
    def _work(self, query: str, units: list[Unit]) -> list[Unit]:
        raise NotImplementedError

    async def _awork(self, query: str, units: list[Unit]) -> list[Unit]:
        raise NotImplementedError

    def _done(self, before: list[Unit], out: list[Unit]) -> list[Unit]:
        """Scores as a foreign stage's (:func:`funnel_core.units.foreign_output`), exactly as
        when the object's Documents were read back."""
        return foreign_output(before, out, self.name)

    # the child run, as the object's own invoke reports it
    def _start(self, cm: Any, query: str, units: list[Unit]) -> Any:
        return cm.on_chain_start(None, {"query": query, "documents": units_to_documents(units)},
                                 name=self.obj.get_name())

    def _manager(self, cls: Any) -> Any:
        """The callback manager of the object's run under the funnel's, ``None`` when nobody
        listens."""
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


class OwnRetrieverStage(OwnStage):
    """One of our retrievers (:class:`~langchain_funnel._base.UnitRetriever`) as a first stage:
    its ``_search`` with its own ``k`` and ``filter`` (incoming units are ignored)."""

    def _work(self, query: str, units: list[Unit]) -> list[Unit]:
        query, k = self.obj._prepare(query, None, {})
        return self.obj._search(query, k) if query else []

    async def _awork(self, query: str, units: list[Unit]) -> list[Unit]:
        query, k = self.obj._prepare(query, None, {})
        return await self.obj._asearch(query, k) if query else []

    def _done(self, before: list[Unit], out: list[Unit]) -> list[Unit]:
        return [scored_by(settled(u), self.name) for u in out]

    def _start(self, cm: Any, query: str, units: list[Unit]) -> Any:
        return cm.on_retriever_start(None, query, name=self.obj.get_name())


class OwnCompressorStage(OwnStage):
    """One of our compressors (:class:`~langchain_funnel._base.StageCompressor`): its core
    stage on the units, as ``compress_documents`` runs it."""

    def _work(self, query: str, units: list[Unit]) -> list[Unit]:
        return self.obj.stage(query, units) if units else []

    async def _awork(self, query: str, units: list[Unit]) -> list[Unit]:
        return await self.obj.stage.acall(query, units) if units else []


class OwnTransformerStage(OwnStage):
    """One of our document transformers (later chunking, repacking): its core stage's ``run``
    on the units, as ``transform_documents`` runs it (the query is not read)."""

    def _work(self, query: str, units: list[Unit]) -> list[Unit]:
        return self.obj.stage.run(query, units)

    async def _awork(self, query: str, units: list[Unit]) -> list[Unit]:
        return await asyncio.to_thread(self.obj.stage.run, query, units)

    def _start(self, cm: Any, query: str, units: list[Unit]) -> Any:
        return cm.on_chain_start(None, units_to_documents(units), name=self.obj.get_name())


def _same_methods(obj: Any, bases: Sequence[type], *methods: str) -> bool:
    """Whether ``obj`` runs each of ``methods`` as one of ``bases`` defines it (a subclass that
    overrides one is run through LangChain, converting around it, like any other object)."""
    return all(_defined_by(type(obj), m) in bases for m in methods)


def _defined_by(cls: type, method: str) -> Optional[type]:
    """The class of ``cls``'s MRO whose body defines ``method``."""
    return next((k for k in cls.__mro__ if method in vars(k)), None)


def _own(obj: Any) -> Optional[Stage]:
    """The units-level stage of one of our objects, or ``None`` for any other."""
    if isinstance(obj, UnitRetriever) and _same_methods(
            obj, (UnitRetriever, FunnelRetriever), "_get_relevant_documents",
            "_aget_relevant_documents"):
        return OwnRetrieverStage(obj, type(obj).__name__)
    name = getattr(obj, "name", None) or type(obj).__name__
    if isinstance(obj, StageCompressor) and _same_methods(
            obj, (StageCompressor,), "compress_documents", "acompress_documents", "invoke",
            "ainvoke", "_compress", "_acompress"):
        return OwnCompressorStage(obj, name)
    if isinstance(obj, TransformerBase) and all(
            (_defined_by(type(obj), m) or object).__module__.startswith("langchain_funnel.")
            or _defined_by(type(obj), m) is Runnable  # ainvoke: invoke in a thread
            for m in ("transform_documents", "atransform_documents", "invoke", "ainvoke")):
        return OwnTransformerStage(obj, name)  # each of ours is its stage's run
    return None


@checked_keywords
def as_stage(obj: Any, first: bool = False) -> Stage:
    """A ``funnel_core`` stage, LangChain retriever, compressor, transformer, runnable or
    callable -> Stage. This package's own retrievers, compressors and transformers become their
    units-level work (:class:`OwnStage`: no Document is built between stages); any other
    LangChain object is run through LangChain, converting only around it. With ``first``, a
    plain runnable is read as ``query -> documents``."""
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
    """FunnelRAG's coarse-to-fine funnel as a LangChain retriever (``k`` caps the output;
    ``k=None``: everything the last stage returns).

    The one way to chain stages in LangChain: :class:`~langchain_funnel.compression.CompressionRetriever`
    and :func:`~langchain_funnel._base.rerank_chain` are thin constructors of it. Every stage runs
    as a child run of the retriever's run, so callbacks, ``astream_events`` and
    ``with_config(run_name=...)`` see each one. Build with :meth:`from_stages`::

        funnel = FunnelRetriever.from_stages(clustered_retriever, CrossEncoderReranker(...),
                                             LaterChunkingTransformer(...), k=4)
        chain = {"context": funnel | format_docs, "question": RunnablePassthrough()} | prompt | llm
    """

    funnel: Funnel = Field(description="The funnel_core Funnel this retriever runs.")
    _k_optional = True

    @classmethod
    @checked_keywords
    def from_stages(cls, *stages: Any, k: Optional[int] = 4) -> "FunnelRetriever":
        if len(stages) == 1 and isinstance(stages[0], Funnel):
            return cls(funnel=stages[0], k=k)
        return cls(funnel=build_funnel(stages), k=k)

    def _search(self, query: str, k: Optional[int]) -> list[Unit]:
        result = self.funnel.search(query)
        _report_trace(result.trace)
        return result.units[:k]

    async def _asearch(self, query: str, k: Optional[int], **kwargs: Any) -> list[Unit]:
        result = await self.funnel.asearch(query)
        await _areport_trace(result.trace)
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
    """Stages (LangChain objects or ``funnel_core`` stages) -> a ``Funnel``; the first one may be
    any runnable ``query -> documents``."""
    return Funnel([as_stage(s, first=(i == 0)) for i, s in enumerate(stages)])


@checked_keywords
def rerank_chain(retriever: Runnable, *compressors: Any) -> Any:
    """``retriever`` then ``compressors``, as one retriever: a thin constructor of
    :class:`~langchain_funnel.funnel.FunnelRetriever` (no cap on the number of documents)."""
    return FunnelRetriever.from_stages(retriever, *compressors, k=None)
