"""Dense retrieval for LangChain: :class:`DenseRetriever` over a
:class:`~funnel_core.embeddings.DenseIndex` (in memory) or a
:class:`~funnel_core.backends.milvus.MilvusDenseIndex` (``backend=``), e.g. the dense side of
:class:`~langchain_funnel.best_practices.HybridRetriever`."""

from __future__ import annotations

from typing import Any, Iterable, Union

from langchain_core.documents import Document
from pydantic import Field

from funnel_core.backends.milvus import MilvusBackend, MilvusDenseIndex, as_backend, build_dense, require_backend
from funnel_core.embeddings import DenseIndex
from funnel_core.settings import check_kwargs
from funnel_core.units import Unit
from langchain_funnel._base import UnitRetriever
from langchain_funnel.corpus import units_from_documents
from langchain_funnel.milvus import search_filter

__all__ = ["DenseRetriever"]


class DenseRetriever(UnitRetriever):
    """Dense retrieval over an in-memory or Milvus dense index; ``k`` and ``filter`` per call.

    Build with :meth:`from_documents` (``backend=`` picks Milvus), re-open a built collection
    with :meth:`from_backend`. ``filter`` is a dict (``{"source": "a.md"}``), with the same
    meaning in memory and on Milvus; on Milvus also an expression string or a structured-query
    ``Comparison``/``Operation`` (pushed down), in memory also a predicate. A per-call filter is
    ANDed with ``filter``. Scores (inner product of normalised embeddings) are in
    ``metadata["relevance_score"]``.
    """

    index: Union[MilvusDenseIndex, DenseIndex]
    filter: Any = Field(default=None,
                        description="Metadata filter, a floor: a per-call filter is ANDed with it.")

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
        check_kwargs(f"{cls.__name__}.from_backend", settings,
                     [n for n in cls.model_fields if n != "index"])  # before opening the collection
        b = require_backend(backend, "DenseRetriever.from_backend")
        return cls(index=b.dense(embedder).open(), **settings)

    def _search(self, query: str, k: int, filter: Any = None) -> list[Unit]:
        return self.index.search(query, k=k, filter=search_filter(self.index, self.filter, filter))
