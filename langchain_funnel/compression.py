"""A compression retriever of our own (``ContextualCompressionRetriever`` lives in
langchain-classic, which this package does not depend on)::

    retriever = CompressionRetriever(
        base_retriever=bm25_retriever,                    # any BaseRetriever
        compressors=[LaterChunkingTransformer(words=100),  # transformers: documents -> documents
                     CrossEncoderReranker(model=path, top_n=8)],  # compressors: (documents, query)
        k=4,
    )
    docs = retriever.invoke("what does BM25 rank?", k=3)  # k caps the final list
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
    """A :class:`~langchain_funnel.funnel.FunnelRetriever` over ``[base_retriever,
    *compressors]`` (document compressors and transformers), then ``k``.

    ``base_compressor`` (``ContextualCompressionRetriever``'s argument) is ``compressors[0]``:
    given, it is put first; set, it replaces that one. An edit of these fields is checked and
    is what the next query runs.
    """

    base_retriever: BaseRetriever
    base_compressor: Optional[Any] = Field(
        default=None, description="One compressor (ContextualCompressionRetriever's argument): "
                                  "the first of compressors.")
    compressors: list[Any] = Field(default_factory=list)
    funnel: Optional[Funnel] = Field(default=None,  # type: ignore[assignment]
                                     description="Built from the fields above.")
    _k_optional = False

    def model_post_init(self, __context: Any) -> None:
        super().model_post_init(__context)
        steps = [*([] if self.base_compressor is None else [self.base_compressor]),
                 *self.compressors]
        self._rebuild(self.base_retriever, steps)

    def _rebuild(self, retriever: Any, steps: list[Any]) -> None:
        """Check, then set the fields and the funnel together (a refused edit changes nothing)."""
        steps = list(steps)
        for c in steps:
            if not isinstance(c, (BaseDocumentCompressor, BaseDocumentTransformer)):
                raise TypeError(f"compressors must be BaseDocumentCompressor or "
                                f"BaseDocumentTransformer objects, got {type(c).__name__}.")
        funnel = build_funnel([retriever, *steps])
        set_field = super().__setattr__
        set_field("base_retriever", retriever)
        set_field("compressors", steps)
        set_field("base_compressor", steps[0] if steps else None)
        set_field("funnel", funnel)

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("funnel") is None:  # still being built
            super().__setattr__(name, value)
        elif name == "base_retriever":
            self._rebuild(value, self.compressors)
        elif name == "compressors":
            if not isinstance(value, (list, tuple)):
                raise TypeError(f"compressors must be a list, got {type(value).__name__}.")
            self._rebuild(self.base_retriever, list(value))
        elif name == "base_compressor":
            rest = self.compressors[1:]
            self._rebuild(self.base_retriever, rest if value is None else [value, *rest])
        else:
            super().__setattr__(name, value)
