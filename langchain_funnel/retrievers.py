"""LangChain retrievers over the ``funnel_core`` BM25 engine: :class:`BM25Retriever` (scores in
metadata, tokenizer settings persisted) and :class:`ClusteredBM25Retriever` (FunnelRAG's first
stage). Both take ``k`` and a ``filter`` floor ANDed with a per-call one ("Arguments" in
``docs/frameworks.md``), and keep their data in memory or in Milvus (``backend=``: a
``MilvusBackend`` or a URI; ``from_backend`` re-opens it; see ``docs/scaling_out.md``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Optional, Sequence, Union

from langchain_core.documents import Document
from pydantic import Field

from funnel_core.backends.milvus import (
    MilvusBackend,
    MilvusBM25Index,
    MilvusClusteredBM25Index,
    build_bm25,
    require_backend,
)
from funnel_core.backends.persist import load_retriever_or_index, retriever_settings, save_retriever
from funnel_core.bm25 import BM25Index
from funnel_core.errors import check_positive_int
from funnel_core.filters import MetadataFilter
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
from funnel_core.funnelrag.fields import (
    CLUSTERED_DEFAULTS,
    ClusteredRetrieverFields,
    check_clustered_setting,
    clustered_search,
)
from funnel_core.settings import check_kwargs
from funnel_core.units import FUNNEL_PREFIX, Unit, check_unique_ids, units_from_texts
from langchain_funnel._base import DEFAULT_K, UnitRetriever, checked_documents
from langchain_funnel.milvus import push_down, search_filter

Backend = Union[MilvusBackend, str, None]

__all__ = ["BM25Retriever", "ClusteredBM25Retriever"]


def units_from_documents(documents: Iterable[Document], level: str) -> list[Unit]:
    """Documents -> index units: ``Document.id`` (else the position; a duplicate raises), the
    whole metadata, a splitter's ``funnel_level`` as the level."""
    units = [Unit(id=str(d.id) if d.id else str(i), text=d.page_content, metadata=dict(d.metadata),
                  level=str(d.metadata.get(FUNNEL_PREFIX + "level", level)))
             for i, d in enumerate(checked_documents(documents))]
    check_unique_ids(units)
    return units


class IndexRetriever(UnitRetriever):
    """A retriever over an ``index`` (BM25, clustered, dense), searched with ``k`` and the
    ``filter`` floor ANDed with a per-call one."""

    index: Any
    filter: Any = Field(default=None, description="Metadata filter (dict or predicate), a floor: a per-call filter is ANDed with it.")

    def _search(self, query: str, k: int, filter: MetadataFilter = None) -> list[Unit]:
        return self.index.search(query, k=k, filter=search_filter(self.index, self.filter, filter))

    #: The retriever's own settings (what ``from_backend``, ``save`` and ``load`` take).
    _settings: ClassVar[tuple[str, ...]] = ("k", "filter")

    @classmethod
    def _reopen(cls, backend: Any, open_index: Callable[[MilvusBackend], Any],
                settings: dict[str, Any]) -> Any:
        """``from_backend``, the settings checked before the collection is opened."""
        check_kwargs(f"{cls.__name__}.from_backend", settings, cls._settings)
        return cls(index=open_index(require_backend(backend, f"{cls.__name__}.from_backend")),
                   **settings)


class _BM25Base(IndexRetriever):
    """Building, ``save`` and ``load`` of the two BM25 retrievers."""

    _index_cls: ClassVar[Any] = BM25Index

    @classmethod
    def _built(cls, units: list[Unit], backend: Backend, config: dict[str, Any],
               **settings: Any) -> Any:
        clustered = cls._index_cls is ClusteredBM25Index
        return cls(index=build_bm25(cls.__name__, backend, config, clustered=clustered).index(units),
                   **settings)

    def save(self, path: str | Path) -> None:
        """Save the index and this retriever's settings (:func:`funnel_core.backends.persist.save_retriever`);
        a filter that cannot be saved (a predicate) refuses; a structured-query one over Milvus
        is saved as its expression."""
        settings = retriever_settings(self, self._settings, f"{type(self).__name__}.save",
                                      lambda flt: _saved_filter(self.index, flt))
        save_retriever(path, f"funnel-rag.langchain.{type(self).__name__}", self.index, settings)

    @classmethod
    def load(cls, path: str | Path, **overrides: Any) -> Any:
        """Load what :meth:`save` wrote (or a bare index folder); ``overrides`` win. Over Milvus
        pass ``backend=`` (and ``token=``): the folder records neither."""
        backend, token = overrides.pop("backend", None), overrides.pop("token", None)
        index, settings = load_retriever_or_index(
            path, f"funnel-rag.langchain.{cls.__name__}", cls._index_cls, f"saved {cls.__name__}",
            backend=backend, token=token)
        check_kwargs(f"{cls.__name__}.load", overrides, cls._settings)
        return cls(index=index, **{**settings, **overrides})


class BM25Retriever(_BM25Base):
    """Flat BM25 over LangChain documents (bm25s engine, scores in metadata)."""

    index: Union[BM25Index, MilvusBM25Index]

    @classmethod
    def from_texts(cls, texts: Iterable[str], metadatas: Optional[Sequence[dict]] = None,
                   ids: Optional[Sequence[str]] = None, k: int = DEFAULT_K, backend: Backend = None,
                   filter: Any = None, **bm25_config: Any) -> "BM25Retriever":
        """Index ``texts``; ``bm25_config`` goes to the index, ``k`` and ``filter`` to the retriever."""
        units = units_from_texts(texts, ids, metadatas, "passage")
        return cls._built(units, backend, bm25_config, k=k, filter=filter)

    @classmethod
    def from_documents(cls, documents: Iterable[Document], k: int = DEFAULT_K, backend: Backend = None,
                       filter: Any = None, **bm25_config: Any) -> "BM25Retriever":
        """Index ``documents``; the settings as in :meth:`from_texts`."""
        units = units_from_documents(documents, "passage")
        return cls._built(units, backend, bm25_config, k=k, filter=filter)

    @classmethod
    def from_backend(cls, backend: Union[MilvusBackend, str], **settings: Any) -> "BM25Retriever":
        """Re-open a BM25 collection (no re-indexing); ``settings``: ``k``, ``filter``."""
        return cls._reopen(backend, lambda b: b.bm25().open(), settings)


class ClusteredBM25Retriever(ClusteredRetrieverFields, _BM25Base):
    """FunnelRAG's retrieval stage: BM25 over document clusters
    (:class:`~funnel_core.funnelrag.clustered_index.ClusteredBM25Index`), opened into their
    documents (``k`` caps them; with ``return_clusters=True``, the clusters; both settings:
    :class:`~funnel_core.funnelrag.fields.ClusteredRetrieverFields`)."""

    _index_cls = ClusteredBM25Index
    _settings = ("k", "k_clusters", "return_clusters", "filter")
    index: Union[ClusteredBM25Index, MilvusClusteredBM25Index]
    filter: Any = Field(default=None, description="Metadata filter on documents, a floor: a per-call filter is ANDed with it.")

    @classmethod
    def from_texts(cls, texts: Iterable[str], metadatas: Optional[Sequence[dict]] = None,
                   ids: Optional[Sequence[str]] = None, k: int = DEFAULT_K, backend: Backend = None,
                   filter: Any = None, k_clusters: int = CLUSTERED_DEFAULTS["k_clusters"],
                   return_clusters: bool = CLUSTERED_DEFAULTS["return_clusters"],
                   **index_settings: Any) -> "ClusteredBM25Retriever":
        """Cluster the texts (by metadata ``funnel_links`` when present, else BM25 kNN) and index
        them; ``index_settings`` go to the index (``max_tokens``, ``knn_k``, BM25 settings, ...)."""
        return cls._clustered(units_from_texts(texts, ids, metadatas, "document"), backend, index_settings,
                              k=k, filter=filter, k_clusters=k_clusters, return_clusters=return_clusters)

    @classmethod
    def from_documents(cls, documents: Iterable[Document], k: int = DEFAULT_K, backend: Backend = None,
                       filter: Any = None, k_clusters: int = CLUSTERED_DEFAULTS["k_clusters"],
                       return_clusters: bool = CLUSTERED_DEFAULTS["return_clusters"],
                       **index_settings: Any) -> "ClusteredBM25Retriever":
        """Cluster and index ``documents``; the settings as in :meth:`from_texts`."""
        return cls._clustered(units_from_documents(documents, "document"), backend, index_settings,
                              k=k, filter=filter, k_clusters=k_clusters, return_clusters=return_clusters)

    @classmethod
    def _clustered(cls, units: list[Unit], backend: Backend, index_settings: dict[str, Any],
                   **fields: Any) -> "ClusteredBM25Retriever":
        """Built after the retriever's own settings are checked (before any indexing)."""
        for name in CLUSTERED_DEFAULTS:
            check_clustered_setting(name, fields[name])
        return cls._built(units, backend, index_settings, **fields)

    @classmethod
    def from_backend(cls, backend: Union[MilvusBackend, str],
                     **settings: Any) -> "ClusteredBM25Retriever":
        """Re-open a clustered collection (no re-indexing); ``settings``: this retriever's fields."""
        return cls._reopen(backend, lambda b: b.clustered().open(), settings)

    def _search(self, query: str, k: int, filter: MetadataFilter = None,
                k_clusters: Optional[int] = None) -> list[Unit]:
        n = self.k_clusters if k_clusters is None else check_positive_int(k_clusters, "k_clusters")
        flt = search_filter(self.index, self.filter, filter)
        return clustered_search(self.index, query, k, n, self.return_clusters, flt)


def _saved_filter(index: Any, flt: Any) -> Any:
    """A structured-query filter over a Milvus index -> its expression; anything else as is."""
    from langchain_core.structured_query import FilterDirective

    if not isinstance(flt, FilterDirective):
        return flt
    try:
        expr = push_down(index, flt)
    except Exception:  # not translatable for this index: left as is (the save refuses it)
        return flt
    return "" if expr is None else expr  # "": no constraint
