"""LlamaIndex retrievers over the ``funnel_core`` BM25 engine: :class:`BM25Retriever` and
:class:`ClusteredBM25Retriever` (FunnelRAG's first stage, Algorithm 1).

Both return copies of the caller's nodes, take per-query filters through ``search`` and persist
to a folder (nodes in a ``SimpleDocumentStore``). ``backend=`` (a ``MilvusBackend`` or a URI) in
``from_defaults`` keeps the data in Milvus, ``from_backend`` re-opens it (``docs/scaling_out.md``).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any, Callable, ClassVar, Dict, List, Mapping, Optional, Sequence, Union

from llama_index.core.callbacks import CallbackManager
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore
from llama_index.core.storage.docstore import BaseDocumentStore, SimpleDocumentStore
from llama_index.core.vector_stores.types import MetadataFilters

from funnel_core.backends.milvus import MilvusBackend, build_bm25, require_backend
from funnel_core.backends.persist import load_retriever, retriever_settings, save_retriever
from funnel_core.bm25 import BM25Index
from funnel_core.errors import check_positive_int, check_query
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
from funnel_core.funnelrag.fields import CLUSTERED_DEFAULTS, check_clustered_setting, clustered_search
from funnel_core.settings import checked_keywords
from funnel_core.units import Unit
from llama_index_funnel._base import TOP_K, UnitRetriever
from llama_index_funnel.milvus import is_milvus, restore_nodes, search_filter, with_shells

__all__ = ["BM25Retriever", "ClusteredBM25Retriever"]

Filter = Union[MetadataFilters, Dict[str, Any], Callable[[dict], bool], str, None]
Backend = Union[MilvusBackend, str, None]


def nodes_from(nodes: Optional[Sequence[BaseNode]], docstore: Optional[BaseDocumentStore]) -> list[BaseNode]:
    """The nodes a factory indexes: ``nodes``, or the docstore's (one of them, not empty)."""
    if nodes is None and docstore is None:
        raise ValueError("pass nodes=[...] or docstore=...; there is nothing to index.")
    nodes = list(nodes) if nodes is not None else list(docstore.docs.values())  # type: ignore[union-attr]
    if not nodes:
        raise ValueError("cannot build a retriever over an empty corpus: nodes/docstore is empty.")
    for n in nodes:
        if not isinstance(n, BaseNode):
            raise TypeError(f"expected LlamaIndex nodes, got {type(n).__name__}; parse documents "
                            "into nodes first (e.g. SentenceSplitter().get_nodes_from_documents).")
    return nodes


def units_of(nodes: Sequence[BaseNode], level: str) -> list[Unit]:
    """The user's nodes as index units (their whole metadata, which filters see)."""
    return [Unit(id=n.node_id, text=n.get_content(metadata_mode=MetadataMode.NONE),
                 metadata=dict(n.metadata), level=level) for n in nodes]


class IndexRetriever(UnitRetriever):
    """What the index retrievers share (also :class:`~llama_index_funnel.dense.DenseRetriever`):
    the caller's nodes, ``similarity_top_k``, the ``filters`` floor and :meth:`search`."""

    def __init__(self, index: Any, nodes: Optional[Sequence[BaseNode]], similarity_top_k: int,
                 filters: Any, callback_manager: Optional[CallbackManager], verbose: bool) -> None:
        self.index = index
        self._nodes = {n.node_id: n for n in nodes or ()}
        self.similarity_top_k = check_positive_int(similarity_top_k, "similarity_top_k")
        self.filters = filters
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    def _originals(self) -> Mapping[str, BaseNode]:
        return self._nodes

    def _k(self, k: Optional[int]) -> int:
        return self.similarity_top_k if k is None else check_positive_int(k, "k")

    def _restore(self, units: list[Unit]) -> list[Unit]:
        """Over Milvus: the node structure stored with each unit (:func:`restore_nodes`)."""
        return restore_nodes(units, self._nodes) if is_milvus(self.index) else units

    def search(self, query: str, filters: Filter = None, **kwargs: Any) -> List[NodeWithScore]:
        """Retrieve with a per-query filter (MetadataFilters, dict or predicate), ANDed with
        :attr:`filters` (a floor it narrows, never widens), and options (``k``, ...)."""
        query = check_query(query)
        return self._to_nodes(self._search(query, filters=filters, **kwargs)) if query else []  # type: ignore[call-arg]

    @classmethod
    def _build(cls, index: Any, nodes: Sequence[BaseNode], level: str) -> Any:
        """``index`` built over ``nodes`` (with their structure when it is on Milvus)."""
        units = units_of(nodes, level)
        return index.index(with_shells(units, nodes) if is_milvus(index) else units)


class _PersistedRetriever(IndexRetriever):
    """Persistence of the two BM25 retrievers."""

    annotate = False  # the user's nodes, hash unchanged (QueryFusionRetriever dedups by hash)

    #: The index class and the sub-folder of a persist dir this retriever owns (our files live
    #: only there, so a StorageContext persisted into the same folder is never touched).
    _index_cls: ClassVar[Any] = None
    _index_dir: ClassVar[str] = ""
    #: Who persisted the folder this retriever persists into (see :meth:`persist`).
    _owner_id: Optional[str] = None
    #: Constructor settings saved by :meth:`persist` (set by subclasses).
    _settings: ClassVar[tuple[str, ...]] = ()

    def persist(self, path: str, overwrite: bool = False) -> None:
        """Commit the index, the nodes and this retriever's settings to ``path/<_index_dir>``
        (:func:`funnel_core.backends.persist.save_retriever`; a filter that cannot be saved
        refuses it). Another retriever of the same class already persisted in ``path`` is
        refused unless ``overwrite=True``."""
        nodes = list(self._nodes.values())

        def write_nodes(folder: Path, on_milvus: bool) -> dict:
            if on_milvus:  # over Milvus: a manifest entry only, no data, no nodes
                return {"n_nodes": 0}
            store = SimpleDocumentStore()
            store.add_documents(nodes)
            store.persist(str(folder / "nodes.json"))
            return {"n_nodes": len(nodes)}

        settings = retriever_settings(self, self._settings, f"{type(self).__name__}.persist",
                                      _saved_filters)
        if self._owner_id is None:  # who persisted a folder: this object, or its source
            self._owner_id = secrets.token_hex(8)
        save_retriever(Path(path) / self._index_dir, f"funnel-rag.llama-index.{self._index_dir}",
                       self.index, settings, files=write_nodes, owner=self._owner_id,
                       overwrite=overwrite)

    @classmethod
    def from_persist_dir(cls, path: str, verify: bool = True, token: Optional[str] = None,
                         backend: Any = None, **kwargs: Any) -> Any:
        """Load a retriever written by :meth:`persist`; ``kwargs`` override its saved settings.
        One persisted over Milvus re-opens its collection at ``backend=`` (with ``token=`` for a
        server), which must match the URI's fingerprint the folder records."""
        def read_nodes(folder: Path, meta: Mapping[str, Any]) -> list:
            return list(SimpleDocumentStore.from_persist_path(str(folder / "nodes.json")).docs.values())

        index, settings, nodes, owner = load_retriever(
            Path(path) / cls._index_dir, f"funnel-rag.llama-index.{cls._index_dir}", cls._index_cls,
            f"{cls.__name__} (in {cls._index_dir}/)", files=read_nodes, backend=backend, token=token,
            verify=verify)
        if "max_documents" in settings:  # saved before it was removed: it capped the nodes
            cap = settings.pop("max_documents")
            if cap is not None:
                settings["similarity_top_k"] = min(cap, settings.get("similarity_top_k", cap))
        flt = settings.get("filters")
        if isinstance(flt, dict) and set(flt) == {"metadata_filters"}:
            settings["filters"] = MetadataFilters.model_validate(flt["metadata_filters"])
        loaded = cls(index, nodes or [], **{**settings, **kwargs})  # type: ignore[call-arg, arg-type]
        loaded._owner_id = owner  # it may persist back into the folder it came from
        return loaded


def _saved_filters(flt: Any) -> Any:
    """``MetadataFilters`` as a persist saves them (a dict or an expression is saved as it is)."""
    if isinstance(flt, MetadataFilters):
        return {"metadata_filters": flt.model_dump(mode="json")}
    return flt


class BM25Retriever(_PersistedRetriever):
    """Flat BM25 over LlamaIndex nodes: a built :class:`funnel_core.bm25.BM25Index` (``index``)
    over ``nodes``, returning ``similarity_top_k`` of them, filtered by ``filters``."""

    _index_cls = BM25Index
    _index_dir = "funnel_rag_bm25"
    _settings = ("similarity_top_k", "filters")

    @checked_keywords
    def __init__(self, index: Any, nodes: Sequence[BaseNode], similarity_top_k: int = TOP_K,
                 filters: Filter = None, callback_manager: Optional[CallbackManager] = None,
                 verbose: bool = False) -> None:
        super().__init__(index, nodes, similarity_top_k, filters, callback_manager, verbose)

    @classmethod
    def from_defaults(cls, nodes: Optional[Sequence[BaseNode]] = None,
                      docstore: Optional[BaseDocumentStore] = None, similarity_top_k: int = TOP_K,
                      filters: Filter = None, backend: Backend = None,
                      **bm25_config: Any) -> "BM25Retriever":
        """Build from nodes or a docstore; ``bm25_config`` goes to :class:`BM25Index`
        (``backend=``: build into Milvus instead, see :class:`funnel_core.backends.milvus.MilvusBackend`)."""
        nodes = nodes_from(nodes, docstore)
        index = cls._build(build_bm25(cls.__name__, backend, bm25_config), nodes, "passage")
        return cls(index, nodes, similarity_top_k=similarity_top_k, filters=filters)

    @classmethod
    @checked_keywords
    def from_backend(cls, backend: Union[MilvusBackend, str], similarity_top_k: int = TOP_K,
                     filters: Filter = None) -> "BM25Retriever":
        """Re-open a BM25 collection built before (no re-indexing; its tokenizer settings are
        read from Milvus); results are ``TextNode``s rebuilt from the collection."""
        index = require_backend(backend, f"{cls.__name__}.from_backend").bm25().open()
        return cls(index, [], similarity_top_k=similarity_top_k, filters=filters)

    def _search(self, query: str, filters: Filter = None, k: Optional[int] = None) -> list[Unit]:
        flt = search_filter(self.index, self.filters, filters)
        return self._restore(self.index.search(query, k=self._k(k), filter=flt))


class ClusteredBM25Retriever(_PersistedRetriever):
    """FunnelRAG's retrieval stage for LlamaIndex: BM25 over ~4K-token document clusters (a
    :class:`funnel_core.funnelrag.clustered_index.ClusteredBM25Index`).

    The top ``k_clusters`` clusters are opened into their member nodes, at most
    ``similarity_top_k`` returned; with ``return_clusters=True`` the clusters themselves, as new
    ``TextNode``s (both settings: :class:`~funnel_core.funnelrag.fields.ClusteredRetrieverFields`).
    With ``annotate=True``, ``funnel_cluster_...`` metadata keys. The other arguments are
    :class:`BM25Retriever`'s.
    """

    _index_cls = ClusteredBM25Index
    _index_dir = "funnel_rag_clustered_bm25"
    _settings = ("similarity_top_k", "k_clusters", "return_clusters", "filters")

    @checked_keywords
    def __init__(self, index: Any, nodes: Sequence[BaseNode], similarity_top_k: int = TOP_K,
                 filters: Filter = None, callback_manager: Optional[CallbackManager] = None,
                 verbose: bool = False, *, k_clusters: int = CLUSTERED_DEFAULTS["k_clusters"],
                 return_clusters: bool = CLUSTERED_DEFAULTS["return_clusters"]) -> None:
        self.k_clusters, self.return_clusters = k_clusters, return_clusters
        super().__init__(index, nodes, similarity_top_k, filters, callback_manager, verbose)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, check_clustered_setting(name, value))

    @classmethod
    def from_defaults(cls, nodes: Optional[Sequence[BaseNode]] = None,
                      docstore: Optional[BaseDocumentStore] = None, similarity_top_k: int = TOP_K,
                      filters: Filter = None, backend: Backend = None, *,
                      k_clusters: int = CLUSTERED_DEFAULTS["k_clusters"],
                      return_clusters: bool = CLUSTERED_DEFAULTS["return_clusters"],
                      **index_settings: Any) -> "ClusteredBM25Retriever":
        """Cluster the nodes (Algorithm 1) and index the clusters, in memory or in Milvus with
        ``backend=``; ``index_settings``: those of
        :class:`~funnel_core.funnelrag.clustered_index.ClusteredBM25Index`."""
        nodes = nodes_from(nodes, docstore)
        check_positive_int(similarity_top_k, "similarity_top_k")
        ours = {n: check_clustered_setting(n, v) for n, v in (("k_clusters", k_clusters),
                                                              ("return_clusters", return_clusters))}
        index = cls._build(build_bm25(cls.__name__, backend, index_settings, clustered=True), nodes, "document")
        return cls(index, nodes, similarity_top_k=similarity_top_k, filters=filters, **ours)

    @classmethod
    @checked_keywords
    def from_backend(cls, backend: Union[MilvusBackend, str], similarity_top_k: int = TOP_K,
                     filters: Filter = None, *, k_clusters: int = CLUSTERED_DEFAULTS["k_clusters"],
                     return_clusters: bool = CLUSTERED_DEFAULTS["return_clusters"]) -> "ClusteredBM25Retriever":
        """Re-open a clustered collection built before (no re-clustering, no re-indexing);
        results are ``TextNode``s rebuilt from the collection."""
        index = require_backend(backend, f"{cls.__name__}.from_backend").clustered().open()
        return cls(index, [], similarity_top_k=similarity_top_k, filters=filters,
                   k_clusters=k_clusters, return_clusters=return_clusters)

    def _search(self, query: str, filters: Filter = None, k: Optional[int] = None,
                k_clusters: Optional[int] = None) -> list[Unit]:
        n = self.k_clusters if k_clusters is None else check_positive_int(k_clusters, "k_clusters")
        flt = search_filter(self.index, self.filters, filters)
        return self._restore(clustered_search(self.index, query, self._k(k), n, self.return_clusters, flt))
