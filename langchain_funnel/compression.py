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

from typing import Any, Optional

from langchain_core.documents import BaseDocumentCompressor, BaseDocumentTransformer
from langchain_core.retrievers import BaseRetriever
from pydantic import Field

from funnel_core.funnel import Funnel
from langchain_funnel.funnel import FunnelRetriever, build_funnel

__all__ = ["CompressionRetriever"]


class CompressionRetriever(FunnelRetriever):
    """Retrieve with ``base_retriever``, then run ``compressors`` in order, then keep ``k``: a
    :class:`~langchain_funnel.funnel.FunnelRetriever` over ``[base_retriever, *compressors]``.

    Attributes:
        base_retriever: Any LangChain retriever (it should return more than ``k`` documents).
        base_compressor: One compressor, as LangChain's ``ContextualCompressionRetriever`` takes
            it (``CompressionRetriever(base_retriever=..., base_compressor=...)`` works as there);
            it runs before ``compressors``.
        compressors: ``BaseDocumentCompressor`` objects (called with the query) and
            ``BaseDocumentTransformer`` objects (documents only), applied in order.
        k: Documents returned (also ``invoke(query, k=3)``).

    Any other keyword raises, naming the accepted ones.
    """

    base_retriever: BaseRetriever
    base_compressor: Optional[Any] = Field(
        default=None, description="One compressor (ContextualCompressionRetriever's argument), "
                                  "run before compressors.")
    compressors: list[Any] = Field(default_factory=list)
    funnel: Optional[Funnel] = Field(default=None,  # type: ignore[assignment]
                                     description="Built from the fields above.")
    _k_optional = False

    def model_post_init(self, __context: Any) -> None:
        super().model_post_init(__context)
        steps = [*([] if self.base_compressor is None else [self.base_compressor]),
                 *self.compressors]
        for c in steps:
            if not isinstance(c, (BaseDocumentCompressor, BaseDocumentTransformer)):
                raise TypeError(f"compressors must be BaseDocumentCompressor or "
                                f"BaseDocumentTransformer objects, got {type(c).__name__}.")
        self.funnel = build_funnel([self.base_retriever, *steps])
