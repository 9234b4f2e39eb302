"""FB-RAG forward lookup for LangChain: :class:`ForwardLookupRetriever`."""

from __future__ import annotations

from typing import Any, Callable, ClassVar, Optional

from langchain_core.retrievers import BaseRetriever
from pydantic import Field, PrivateAttr

from funnel_core.fbrag import ForwardLookup
from funnel_core.fbrag_fields import ForwardLookupFields
from funnel_core.settings import StageAdapter
from funnel_core.units import Unit
from langchain_funnel._base import UnitRetriever, documents_to_units
from langchain_funnel.llm import stage_llm

__all__ = ["ForwardLookupRetriever"]


class ForwardLookupRetriever(ForwardLookupFields, StageAdapter, UnitRetriever):
    """FB-RAG Stages I-III as a LangChain retriever (``k`` chunks): a
    :class:`~funnel_core.fbrag.ForwardLookup` (settings:
    :class:`~funnel_core.fbrag_fields.ForwardLookupFields`) over the chunks of ``context`` or
    the documents of ``retriever``; ``llm`` may also be a LangChain model.

    Example::

        retriever = ForwardLookupRetriever(llm=chat_model, context=long_text, variant="FB", k=3)
        docs = retriever.invoke("Who wrote Hamlet?")
    """

    wrap_llm: ClassVar[Callable[[Any, Any], Any]] = staticmethod(stage_llm)
    retriever: Optional[BaseRetriever] = Field(default=None, description="Base retriever instead of context.")

    _stage: Optional[ForwardLookup] = PrivateAttr(default=None)

    @property
    def forward(self) -> ForwardLookup:
        """The ``funnel_core`` stage doing the work."""
        return self.stage

    def _search(self, query: str, k: int) -> list[Unit]:
        units = self.units or documents_to_units(self.retriever.invoke(query))  # type: ignore[union-attr]
        return self.forward.search(query, units, k=k).units

    async def _asearch(self, query: str, k: int) -> list[Unit]:  # type: ignore[override]
        units = self.units or documents_to_units(await self.retriever.ainvoke(query))  # type: ignore[union-attr]
        return (await self.forward.asearch(query, units, k=k)).units
