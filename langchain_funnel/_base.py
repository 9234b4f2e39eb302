"""``Document`` <-> :class:`funnel_core.Unit` (the metadata contract of ``docs/frameworks.md``)
and the base classes of this package's compressors and retrievers."""

from __future__ import annotations

import asyncio
import hashlib
from abc import abstractmethod
from typing import Any, ClassVar, Iterable, Mapping, Optional, Sequence

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
    Callbacks,
)
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableConfig
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from funnel_core.errors import check_positive_int, check_query
from funnel_core.funnel import WarmUpMixin
from funnel_core.settings import StageAdapter, check_accepted, check_kwargs, check_search_kwargs
from funnel_core.units import Unit, funnel_metadata, unit_of

__all__ = ["DEFAULT_K", "StageModel", "StageCompressor", "KRetriever", "UnitRetriever", "document_to_unit",
           "documents_to_units", "units_to_documents", "document_metadata", "checked_documents", "RELEVANCE_SCORE"]


def _doc_id(doc: Document) -> str:
    if doc.id:
        return str(doc.id)
    if "id" in doc.metadata:
        return str(doc.metadata["id"])
    return hashlib.sha1(doc.page_content.encode("utf-8")).hexdigest()[:16]


#: The float score key of LangChain's rerankers (Cohere, Jina, Flashrank); ours write it too.
RELEVANCE_SCORE = "relevance_score"


def document_to_unit(doc: Document) -> Unit:
    """A ``Document`` -> :class:`Unit` (:func:`funnel_core.units.unit_of`; id from ``doc.id``,
    ``metadata["id"]`` or a text hash; ``unit.source`` is the document); a prior score is read
    from ``relevance_score``, never from a user's ``score`` key."""
    if not isinstance(doc, Document):
        raise TypeError(f"expected a langchain Document, got {type(doc).__name__}.")
    score = doc.metadata.get(RELEVANCE_SCORE)
    return unit_of(_doc_id(doc), doc.page_content, doc.metadata, source=doc,
                   score=score if _is_score(score) else None)


def checked_documents(documents: Iterable[Document]) -> list[Document]:
    """``documents`` as a list; a single ``Document`` or anything else in it raises."""
    if isinstance(documents, Document):
        raise TypeError("pass a list of Documents, not a single Document; wrap it in a list.")
    docs = list(documents)
    for i, d in enumerate(docs):
        if not isinstance(d, Document):
            raise TypeError(f"expected langchain Documents, got {type(d).__name__} at position {i}.")
    return docs


def documents_to_units(docs: Sequence[Document]) -> list[Unit]:
    units = [document_to_unit(d) for d in docs]
    seen: dict[str, int] = {}
    for u in units:  # documents without ids and with equal text: keep them apart
        n = seen.get(u.id, 0)
        seen[u.id] = n + 1
        if n:
            u.id = f"{u.id}~{n}"
    return units


def document_metadata(unit: Unit, user: Mapping[str, Any]) -> dict[str, Any]:
    """The user's keys as they were, :func:`funnel_core.units.funnel_metadata`, and the unit's
    score as a float ``relevance_score``."""
    meta = {**user, **funnel_metadata(unit)}
    if unit.score is not None:
        meta[RELEVANCE_SCORE] = float(unit.score)
    elif _is_score(meta.get(RELEVANCE_SCORE)):
        # a numeric relevance_score would have become the unit's score: the unit has none now
        # (a stage reordered it without scoring, see funnel_core.units.foreign_output)
        del meta[RELEVANCE_SCORE]
    return meta


def _is_score(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def units_to_documents(units: Sequence[Unit], originals: Sequence[Document] = ()) -> list[Document]:
    """Units -> copies of the user's ``Document`` objects with :func:`document_metadata`
    (``originals``: documents to copy, by id, for units that carry none); a unit cut from a
    document becomes a new ``Document`` with the unit's metadata."""
    by_id: dict[str, Document] = {_doc_id(d): d for d in originals}
    for u in units:
        if isinstance(u.source, Document):
            by_id.setdefault(u.id, u.source)
    docs = []
    for u in units:
        src = u.source if isinstance(u.source, Document) else by_id.get(u.id)
        if src is not None and _doc_id(src) != u.id and u.source is not src:
            src = None
        if src is not None:
            doc = src.model_copy(update={"page_content": u.text,
                                         "metadata": document_metadata(u, src.metadata)})
            if doc.id is None:
                doc.id = u.id
        else:
            doc = Document(id=u.id, page_content=u.text, metadata=document_metadata(u, u.metadata))
        docs.append(doc)
    return docs


class StageModel(StageAdapter, BaseModel):
    """A LangChain object holding one ``funnel_core`` stage (:class:`funnel_core.settings.StageAdapter`):
    the base of this package's compressors, document transformers and text splitters."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")
    # Runnable annotates ``name: str | None`` without a default; pydantic would make it required.
    name: Optional[str] = None
    _stage: Any = PrivateAttr(default=None)


class StageCompressor(StageModel, BaseDocumentCompressor, Runnable[dict, list[Document]]):
    """A document compressor holding one ``funnel_core`` stage; as a ``Runnable`` it takes
    ``{"query": ..., "documents": [...]}``."""

    def compress_documents(self, documents: Sequence[Document], query: str,
                           callbacks: Callbacks | None = None) -> Sequence[Document]:
        """Run the stage as a run of its own (a child of ``callbacks``' run when given)."""
        return self.invoke({"query": query, "documents": list(documents)},
                           config={"callbacks": callbacks} if callbacks is not None else None)

    async def acompress_documents(self, documents: Sequence[Document], query: str,
                                  callbacks: Callbacks | None = None) -> Sequence[Document]:
        return await self.ainvoke({"query": query, "documents": list(documents)},
                                  config={"callbacks": callbacks} if callbacks is not None else None)

    def _compress(self, input: Any) -> list[Document]:
        documents, query = self._unpack(input)
        if not documents or not query:
            return self.stage.no_query(documents)  # an empty query: top_n still caps them
        return units_to_documents(self.stage(query, documents_to_units(documents)), documents)

    async def _acompress(self, input: Any) -> list[Document]:
        documents, query = self._unpack(input)
        if not documents or not query:
            return self.stage.no_query(documents)
        units = await self.stage.acall(query, documents_to_units(documents))
        return units_to_documents(units, documents)

    # -- Runnable --------------------------------------------------------------------------
    @staticmethod
    def _unpack(input: Any) -> tuple[Sequence[Document], str]:
        if not isinstance(input, dict) or "query" not in input or "documents" not in input:
            raise TypeError("as a Runnable, a compressor takes {'query': str, 'documents': "
                            f"list[Document]}}, got {type(input).__name__}; or use "
                            "FunnelRetriever.from_stages(retriever, compressor).")
        return input["documents"], check_query(input["query"])

    def invoke(self, input: dict, config: RunnableConfig | None = None,
               **kwargs: Any) -> list[Document]:
        return self._call_with_config(self._compress, input, config)

    async def ainvoke(self, input: dict, config: RunnableConfig | None = None,
                      **kwargs: Any) -> list[Document]:
        return await self._acall_with_config(self._acompress, input, config)


#: ``k`` of this package's retrievers when none is given (LangChain's vector store default).
DEFAULT_K = 4


class KRetriever(WarmUpMixin, BaseRetriever):
    """A LangChain retriever with ``k`` in the constructor and per call (``invoke(q, k=3)``;
    ``k=0`` is an error). A keyword it does not take raises ``TypeError`` naming the accepted
    ones, in the constructor and per call (:attr:`_call_kwargs`)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")
    k: Optional[int] = Field(default=DEFAULT_K, description="Number of documents to return.")

    def __init__(self, **data: Any) -> None:
        check_accepted(type(self), data)  # a typo raises, naming the accepted fields
        super().__init__(**data)

    #: Whether ``k=None`` (no cap) is allowed.
    _k_optional: ClassVar[bool] = False
    #: The per-call keyword arguments besides ``k``.
    _call_kwargs: ClassVar[tuple[str, ...]] = ()

    def model_post_init(self, __context: Any) -> None:
        super().model_post_init(__context)
        if self.k is not None or not self._k_optional:
            check_positive_int(self.k, "k")

    def _prepare(self, query: str, k: int | None, kwargs: dict[str, Any]) -> tuple[str, Any]:
        """The stripped query and ``k`` (the retriever's own when not given per call)."""
        check_kwargs(type(self).__name__, kwargs, ("k", *self._call_kwargs))
        return check_query(query), self.k if k is None else check_positive_int(k, "k")


class UnitRetriever(KRetriever):
    """A :class:`KRetriever` whose subclasses implement :meth:`_search` over ``funnel_core``.

    The per-call keyword arguments besides ``k`` are those of :meth:`_search` (e.g.
    ``filter=``). An empty or whitespace query returns ``[]``; a non-string query raises
    ``TypeError``.
    """

    @abstractmethod
    def _search(self, query: str, k: int) -> list[Unit]:
        """Up to ``k`` units for a non-empty, stripped query; further keyword parameters are the
        per-call options of ``invoke`` (e.g. ``filter``)."""

    def _prepare(self, query: str, k: int | None, kwargs: dict[str, Any]) -> tuple[str, Any]:
        check_search_kwargs(self, self._search, kwargs)  # a typo raises, naming the accepted ones
        return super()._prepare(query, k, {})

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                k: int | None = None, **kwargs: Any) -> list[Document]:
        query, k = self._prepare(query, k, kwargs)
        return units_to_documents(self._search(query, k, **kwargs)) if query else []

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun,
                                       k: int | None = None, **kwargs: Any) -> list[Document]:
        query, k = self._prepare(query, k, kwargs)
        return units_to_documents(await self._asearch(query, k, **kwargs)) if query else []

    async def _asearch(self, query: str, k: int, **kwargs: Any) -> list[Unit]:
        """Async twin of :meth:`_search`; by default :meth:`_search` in a worker thread."""
        return await asyncio.to_thread(self._search, query, k, **kwargs)
