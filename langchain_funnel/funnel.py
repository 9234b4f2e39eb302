"""A FunnelRAG progressive funnel as a LangChain retriever.

:class:`FunnelRetriever` runs a :class:`funnel_core.Funnel` whose stages can be ``funnel_core``
stages *or* LangChain objects: any retriever (first stage), any ``BaseDocumentCompressor``, and
any runnable taking ``{"query", "documents"}`` and returning documents — wrapped by
:func:`as_stage`. Every returned ``Document`` carries the trace in ``metadata["funnel_trace"]``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from langchain_core.documents import BaseDocumentCompressor, BaseDocumentTransformer, Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable
from pydantic import Field

from funnel_core.errors import check_query
from funnel_core.funnel import Funnel, FunnelResult, Stage
from funnel_core.funnel import as_stage as core_as_stage
from funnel_core.units import Trace, Unit
from langchain_funnel._base import StageCompressor, UnitRetriever, documents_to_units, units_to_documents

__all__ = ["FunnelRetriever", "LCRetrieverStage", "LCCompressorStage", "LCRunnableStage", "as_stage"]


def _scored(units: list[Unit], name: str) -> list[Unit]:
    return [u.rescored(u.score, name) if u.score is not None else u for u in units]


class LCRetrieverStage(Stage):
    """A LangChain retriever as a first funnel stage (incoming units are ignored)."""

    def __init__(self, retriever: BaseRetriever, name: Optional[str] = None) -> None:
        self.retriever = retriever
        self.name = name or type(retriever).__name__

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        return _scored(documents_to_units(self.retriever.invoke(query)), self.name)

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        return _scored(documents_to_units(await self.retriever.ainvoke(query)), self.name)


class LCCompressorStage(Stage):
    """A LangChain ``BaseDocumentCompressor`` as a funnel stage."""

    def __init__(self, compressor: BaseDocumentCompressor, name: Optional[str] = None) -> None:
        self.compressor = compressor
        self.name = name or type(compressor).__name__

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        docs = self.compressor.compress_documents(units_to_documents(units), query)
        return _scored(documents_to_units(list(docs)), self.name)

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        docs = await self.compressor.acompress_documents(units_to_documents(units), query)
        return _scored(documents_to_units(list(docs)), self.name)


class LCRunnableStage(Stage):
    """A runnable ``{"query": str, "documents": list[Document]} -> list[Document]`` as a stage."""

    def __init__(self, runnable: Runnable, name: Optional[str] = None) -> None:
        self.runnable = runnable
        self.name = name or getattr(runnable, "name", None) or type(runnable).__name__

    def _out(self, docs: Any) -> list[Unit]:
        if not isinstance(docs, list) or not all(isinstance(d, Document) for d in docs):
            raise TypeError(f"funnel stage {self.name!r} must return a list of Documents, got "
                            f"{type(docs).__name__}.")
        return _scored(documents_to_units(docs), self.name)

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        return self._out(self.runnable.invoke({"query": query, "documents": units_to_documents(units)}))

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        return self._out(await self.runnable.ainvoke({"query": query, "documents": units_to_documents(units)}))


def as_stage(obj: Any) -> Stage:
    """A ``funnel_core`` stage, LangChain retriever, compressor, runnable or callable -> Stage."""
    stage = getattr(obj, "stage", None)
    if isinstance(obj, (StageCompressor, BaseDocumentTransformer)) and isinstance(stage, Stage):
        return stage  # our own compressors and transformers: run the core stage directly
    if isinstance(obj, BaseRetriever):
        return LCRetrieverStage(obj)
    if isinstance(obj, BaseDocumentCompressor):
        return LCCompressorStage(obj)
    if isinstance(obj, Runnable):
        return LCRunnableStage(obj)
    return core_as_stage(obj)


class FunnelRetriever(UnitRetriever):
    """FunnelRAG's coarse-to-fine funnel as a LangChain retriever (``k`` caps the output).

    Build with :meth:`from_stages`; compose in LCEL like any retriever::

        funnel = FunnelRetriever.from_stages(clustered_retriever, CrossEncoderReranker(...),
                                             LaterChunkingTransformer(...), k=4)
        chain = {"context": funnel | format_docs, "question": RunnablePassthrough()} | prompt | llm
    """

    funnel: Funnel = Field(description="The funnel_core Funnel this retriever runs.")

    @classmethod
    def from_stages(cls, *stages: Any, k: int = 4) -> "FunnelRetriever":
        if len(stages) == 1 and isinstance(stages[0], Funnel):
            return cls(funnel=stages[0], k=k)
        return cls(funnel=Funnel([as_stage(s) for s in stages]), k=k)

    def _search(self, query: str, k: int, **kwargs: Any) -> list[Unit]:
        return self.funnel.search(query).units[:k]

    async def _asearch(self, query: str, k: int, **kwargs: Any) -> list[Unit]:
        return (await self.funnel.asearch(query)).units[:k]

    def search(self, query: str, answers: Optional[Sequence[str]] = None) -> tuple[list[Document], Trace]:
        """Run the funnel and return ``(documents, trace)`` (answer recall per stage with answers)."""
        query = check_query(query)
        result: FunnelResult = self.funnel.search(query, answers=answers)
        return units_to_documents(result.units[: self.k]), result.trace
