"""Dense retrieval for LangChain: :class:`DenseRetriever`."""

from __future__ import annotations

from typing import Any, Iterable, Union

from langchain_core.documents import Document

from funnel_core.backends.milvus import MilvusBackend, MilvusDenseIndex, as_backend, build_dense
from funnel_core.embeddings import DenseIndex
from langchain_funnel._base import DEFAULT_K
from langchain_funnel.retrievers import IndexRetriever, units_from_documents

__all__ = ["DenseRetriever"]


class DenseRetriever(IndexRetriever):
    """Dense retrieval over a :class:`~funnel_core.embeddings.DenseIndex` or (``backend=``) a
    :class:`~funnel_core.backends.milvus.MilvusDenseIndex`; ``filter`` as for the BM25
    retrievers, plus a predicate in memory."""

    index: Union[MilvusDenseIndex, DenseIndex]
    _settings = ("name", "tags", "metadata", "k", "filter")

    @classmethod
    def from_documents(cls, documents: Iterable[Document], embedder: Any = None,
                       backend: Union[MilvusBackend, str, None] = None, k: int = DEFAULT_K,
                       filter: Any = None, **index_config: Any) -> "DenseRetriever":
        """Embed ``documents`` (``embedder``: a :class:`~funnel_core.embeddings.SentenceEmbedder`,
        default the packaged MiniLM) into memory or Milvus; ``index_config`` goes to the index."""
        index = build_dense(f"{cls.__name__}.from_documents", as_backend(backend), embedder, index_config)
        units = units_from_documents(documents, "passage")
        return cls(index=index.index(units), k=k, filter=filter)

    @classmethod
    def from_backend(cls, backend: Union[MilvusBackend, str], embedder: Any = None,
                     **settings: Any) -> "DenseRetriever":
        """Re-open a dense collection (no re-embedding) with the ``embedder`` it was built with."""
        return cls._reopen(backend, lambda b: b.dense(embedder).open(), settings)
