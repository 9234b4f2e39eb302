"""Dense retrieval for LangChain: :class:`DenseRetriever` over a
:class:`~funnel_core.embeddings.DenseIndex` (in memory) or a
:class:`~funnel_core.backends.milvus.MilvusDenseIndex` (``backend=``), e.g. the dense side of
:class:`~langchain_funnel.best_practices.HybridRetriever`."""

from __future__ import annotations

from typing import Any, Iterable, Union

from langchain_core.documents import Document

from funnel_core.backends.milvus import MilvusBackend, MilvusDenseIndex, as_backend, build_dense
from funnel_core.embeddings import DenseIndex
from langchain_funnel.retrievers import IndexRetriever, units_from_documents

__all__ = ["DenseRetriever"]


class DenseRetriever(IndexRetriever):
    """Dense retrieval over an in-memory or Milvus dense index; ``k`` and ``filter`` per call.

    Build with :meth:`from_documents` (``backend=`` picks Milvus), re-open a built collection
    with :meth:`from_backend`. ``filter`` is a dict (``{"source": "a.md"}``), with the same
    meaning in memory and on Milvus; on Milvus also an expression string or a structured-query
    ``Comparison``/``Operation`` (pushed down), in memory also a predicate. A per-call filter is
    ANDed with ``filter``. Scores (inner product of normalised embeddings) are in
    ``metadata["relevance_score"]``.
    """

    index: Union[MilvusDenseIndex, DenseIndex]
    _settings = ("name", "tags", "metadata", "k", "filter")

    @classmethod
    def from_documents(cls, documents: Iterable[Document], embedder: Any = None,
                       backend: Union[MilvusBackend, str, None] = None, k: int = 4,
                       filter: Any = None, **index_config: Any) -> "DenseRetriever":
        """Embed ``documents`` (``embedder``: a :class:`~funnel_core.embeddings.SentenceEmbedder`,
        default the packaged all-MiniLM-L6-v2) into Milvus (``backend=``) or memory. ``k`` and
        ``filter`` are the retriever's; ``index_config`` goes to the index (an unknown key
        raises, naming this method and the accepted ones)."""
        index = build_dense(f"{cls.__name__}.from_documents", as_backend(backend), embedder, index_config)
        units = units_from_documents(documents, "passage")
        return cls(index=index.index(units), k=k, filter=filter)

    @classmethod
    def from_backend(cls, backend: Union[MilvusBackend, str], embedder: Any = None,
                     **settings: Any) -> "DenseRetriever":
        """Re-open a dense collection built before (no re-embedding); pass the ``embedder`` it
        was built with (default: the packaged all-MiniLM-L6-v2)."""
        return cls._reopen(backend, lambda b: b.dense(embedder).open(), settings)
