"""A small compression retriever: any LangChain retriever followed by any of our compressors.

``ContextualCompressionRetriever`` lives in langchain-classic; this package depends on
langchain-core only, so it ships its own::

    retriever = CompressionRetriever(
        base_retriever=bm25_retriever,                    # any BaseRetriever
        compressors=[LaterChunkingTransformer(words=100),  # transformers: documents -> documents
                     CrossEncoderReranker(model=path, top_n=8)],  # compressors: (documents, query)
        k=4,
    )
    docs = retriever.invoke("what does BM25 rank?", k=3)

``k`` caps the final list (constructor default, overridable per call).
"""

from __future__ import annotations

from typing import Any, Sequence, Union

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import BaseDocumentCompressor, BaseDocumentTransformer, Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field

from funnel_core.errors import check_positive_int, check_query

__all__ = ["CompressionRetriever"]

Compressor = Union[BaseDocumentCompressor, BaseDocumentTransformer]


class CompressionRetriever(BaseRetriever):
    """Retrieve with ``base_retriever``, then run ``compressors`` in order, then keep ``k``.

    Attributes:
        base_retriever: Any LangChain retriever (it should return more than ``k`` documents).
        compressors: ``BaseDocumentCompressor`` objects (called with the query) and
            ``BaseDocumentTransformer`` objects (documents only), applied in order.
        k: Documents returned (also ``invoke(query, k=3)``).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)
    base_retriever: BaseRetriever
    compressors: list[Any] = Field(default_factory=list)
    k: int = Field(default=4, description="Number of documents to return.")

    def model_post_init(self, __context: Any) -> None:
        check_positive_int(self.k, "k")
        for c in self.compressors:
            if not isinstance(c, (BaseDocumentCompressor, BaseDocumentTransformer)):
                raise TypeError(f"compressors must be BaseDocumentCompressor or "
                                f"BaseDocumentTransformer objects, got {type(c).__name__}.")

    def _k(self, k: int | None) -> int:
        return self.k if k is None else check_positive_int(k, "k")

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                k: int | None = None, **kwargs: Any) -> list[Document]:
        query, k = check_query(query), self._k(k)
        if not query:
            return []
        docs: Sequence[Document] = self.base_retriever.invoke(
            query, config={"callbacks": run_manager.get_child()})
        for c in self.compressors:
            if not docs:
                break
            if isinstance(c, BaseDocumentCompressor):
                docs = c.compress_documents(docs, query, callbacks=run_manager.get_child())
            else:
                docs = c.transform_documents(docs)
        return list(docs)[:k]

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun,
                                       k: int | None = None, **kwargs: Any) -> list[Document]:
        query, k = check_query(query), self._k(k)
        if not query:
            return []
        docs: Sequence[Document] = await self.base_retriever.ainvoke(
            query, config={"callbacks": run_manager.get_child()})
        for c in self.compressors:
            if not docs:
                break
            if isinstance(c, BaseDocumentCompressor):
                docs = await c.acompress_documents(docs, query, callbacks=run_manager.get_child())
            else:
                docs = await c.atransform_documents(docs)
        return list(docs)[:k]
