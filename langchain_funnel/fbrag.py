"""FB-RAG forward lookup for LangChain: :class:`ForwardLookupRetriever`, Stages I-III over a long
context or over the documents of any base retriever; ``k`` chunks (constructor or
``invoke(q, k=3)``), their forward/backward scores and the LLM samples in ``Document.metadata``.

The LLM can be a LangChain chat model or LLM, a ``funnel_core`` provider, or a hub name /
folder of a local causal LM.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import Field, PrivateAttr

from funnel_core.fbrag import ForwardLookup
from funnel_core.fbrag_fields import ForwardLookupFields
from funnel_core.llm import LLM
from funnel_core.settings import StageAdapter
from funnel_core.units import Unit
from langchain_funnel._base import UnitRetriever, documents_to_units, units_to_documents
from langchain_funnel.llm import stage_llm

__all__ = ["ForwardLookupRetriever"]


class ForwardLookupRetriever(ForwardLookupFields, StageAdapter, UnitRetriever):
    """FB-RAG Stages I-III as a LangChain retriever (``k`` = chunks returned): a
    :class:`~funnel_core.fbrag.ForwardLookup`.

    Candidates are the ``chunk_words``-word chunks of ``context`` or the documents that
    ``retriever`` returns. ``metadata`` holds ``relevance_score`` (S_FB), ``funnel_backward_score``,
    ``funnel_forward_scores_json``, ``funnel_samples_json`` and ``funnel_position``; documents
    come in their original order unless ``order_preserving=False``. ``variant`` picks the weights
    (``"FB"``, ``"F"``, ``"B"``); ``eta_backward``/``eta_forward`` override them. The settings are
    the fields of :class:`~funnel_core.fbrag_fields.ForwardLookupFields` (shared with the
    LlamaIndex twin); edits are honoured at the next call.

    Example::

        retriever = ForwardLookupRetriever(llm=chat_model, context=long_text, variant="FB", k=3)
        docs = retriever.invoke("Who wrote Hamlet?")
    """

    stage_class: ClassVar[type] = ForwardLookup

    llm: Any = Field(description="LangChain chat model/LLM, funnel_core LLM, or a causal-LM name/folder.")
    retriever: Optional[BaseRetriever] = Field(default=None, description="Base retriever instead of context.")

    _stage: Optional[ForwardLookup] = PrivateAttr(default=None)

    def _stage_value(self, name: str, value: Any) -> Any:
        return stage_llm(value, self.timeout) if name == "llm" else super()._stage_value(name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "timeout" and not isinstance(self.llm, (str, LLM)):
            self.stage.llm = stage_llm(self.llm, self.timeout)

    @property
    def forward(self) -> ForwardLookup:
        """The ``funnel_core`` stage doing the work."""
        return self.stage

    def _search(self, query: str, k: int) -> list[Unit]:
        units = self.units
        if units is None:
            assert self.retriever is not None
            units = documents_to_units(self.retriever.invoke(query))
        return self.forward.search(query, units, k=k).units

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun,
                                       k: int | None = None, **kwargs: Any) -> list[Document]:
        query, k = self._prepare(query, k, kwargs)
        if not query:
            return []
        units = self.units
        if units is None:
            assert self.retriever is not None
            units = documents_to_units(await self.retriever.ainvoke(query))
        return units_to_documents((await self.forward.asearch(query, units, k=k)).units)
