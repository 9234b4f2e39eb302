"""FunnelRAG's clustered BM25 on Milvus (:class:`MilvusClusteredBM25Index`)."""


from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover
    pass  # typing.Self from Python 3.11


from funnel_core.backends.milvus.bm25 import BM25Common, bm25_schema, doc_rows, stored_config
from funnel_core.backends.milvus.client import FORMAT_VERSION, MAX_ID_BYTES, MAX_TOPK, MilvusError
from funnel_core.backends.milvus.collection import unit_from_row
from funnel_core.backends.milvus.expressions import and_expr, filter_expression, in_expr
from funnel_core.bm25.index import BM25_SETTINGS
from funnel_core.errors import check_positive_int, check_query
from funnel_core.funnelrag.clustered_index import CLUSTERING_SETTINGS
from funnel_core.settings import Settings
from funnel_core.units import Unit, check_unique_ids


# -- clustered BM25 ----------------------------------------------------------------------------------
class MilvusClusteredBM25Index(BM25Common, Settings):
    """FunnelRAG's clustered first stage on Milvus; same results as
    :class:`~funnel_core.funnelrag.clustered_index.ClusteredBM25Index`.

    Clusters are built by the existing funnel-rag code (Algorithm 1, :func:`build_clusters`) and
    uploaded: the clusters' tokenized texts go into a BM25 collection (``<collection>``), the
    member documents into a second collection keyed by id with their ``cluster_id``, position and
    metadata. A search is: BM25 top-``k`` clusters in Milvus -> their member documents fetched
    from Milvus -> each scored by its own BM25 score (the documents collection's statistics)
    and sorted by it, as the in-memory backend, with ``cluster_id``, ``cluster_score`` and
    ``cluster_rank`` in its bookkeeping (``Unit.funnel``). The query is tokenized once here;
    Milvus scores clusters and documents in two searches (two collections).

    ``uri``, ``collection``, ``token``, ``db_name``, ``timeout`` and ``show_progress`` are as
    for :class:`MilvusBM25Index`; ``max_tokens``, ``adjacency``, ``knn_k`` and ``knn_threshold``
    are the clustering settings of :class:`~funnel_core.funnelrag.clustered_index.ClusteredBM25Index`;
    ``**bm25_config`` the tokenizer/BM25 settings (``method="lucene"`` only).
    """

    kind = "funnel-rag.milvus-clustered-bm25"
    build_settings = frozenset(BM25_SETTINGS + CLUSTERING_SETTINGS) - {"engine"}

    def __init__(self, uri: str | os.PathLike = "funnel.db", collection: str = "funnel_clusters", *,
                 token: str | None = None, db_name: str | None = None, timeout: float | None = None,
                 show_progress: bool = False, max_tokens: int = 4096, adjacency: str = "auto",
                 knn_k: int = 20, knn_threshold: float = 0.1, **bm25_config: Any) -> None:
        from funnel_core.funnelrag.clustered_index import check_clustering_settings

        self.max_tokens, self.adjacency, self.knn_k, self.knn_threshold = check_clustering_settings(
            max_tokens, adjacency, knn_k, knn_threshold)  # before connecting: a typo costs no connection
        super().__init__(uri, collection, token, db_name, timeout, show_progress, bm25_config)

    # building ------------------------------------------------------------------------------
    def index(self, documents: Sequence[Unit], adjacency: Any = None) -> "MilvusClusteredBM25Index":
        """Cluster ``documents`` with funnel-rag's Algorithm 1 and upload clusters and documents."""
        from funnel_core.funnelrag.clustered_index import as_documents
        from funnel_core.funnelrag.clustering import build_clusters
        from funnel_core.persist import prepare_units

        documents = as_documents(prepare_units(list(documents), "MilvusClusteredBM25Index.index"))
        bm25_config = {k: v for k, v in self._tokenizer.config.items()}
        clusters, _ = build_clusters(
            documents, adjacency=self.adjacency if adjacency is None else adjacency,
            max_tokens=self.max_tokens, knn_k=self.knn_k, knn_threshold=self.knn_threshold,
            bm25_config=bm25_config)
        return self.upload(documents, clusters)

    def upload(self, documents: Sequence[Unit], clusters: Sequence[Unit]) -> "MilvusClusteredBM25Index":
        """Upload already built clusters (units with ``metadata["members"]``) and their documents."""
        documents, clusters = list(documents), list(clusters)
        if not documents or not clusters:
            raise ValueError("cannot build a clustered index without documents and clusters.")
        check_unique_ids(documents)
        check_unique_ids(clusters)
        by_id = {d.id: d for d in documents}
        cluster_of: dict[str, tuple[str, int]] = {}
        for c in clusters:
            members = c.metadata.get("members")
            if not members:
                raise ValueError(f"cluster {c.id!r} has no metadata['members']; build clusters "
                                 "with funnel_core.funnelrag.clustering.build_clusters.")
            for pos, m in enumerate(members):
                if m not in by_id:
                    raise ValueError(f"cluster {c.id!r} lists member {m!r}, which is not among "
                                     "the documents.")
                cluster_of[m] = (c.id, pos)
        missing = [d.id for d in documents if d.id not in cluster_of]
        if missing:
            raise ValueError(f"document {missing[0]!r} is in no cluster; pass the clusters built "
                             "from these documents.")
        config = stored_config(self._tokenizer)
        settings = {"bm25": config, "max_tokens": self.max_tokens,
                    "adjacency": self.adjacency if isinstance(self.adjacency, str) else "matrix",
                    "knn_k": self.knn_k, "knn_threshold": self.knn_threshold}

        def extra_fields(schema: Any) -> None:
            from pymilvus import DataType

            schema.add_field("cluster_id", DataType.VARCHAR, max_length=MAX_ID_BYTES)
            schema.add_field("position", DataType.INT64)

        def build(physical: str) -> dict[str, Any]:
            docs_name = f"{physical}_docs"
            meta = {"format": self.kind, "version": FORMAT_VERSION, "n_units": len(documents),
                    "n_clusters": len(clusters), "documents": docs_name,
                    "companions": [docs_name], "settings": settings}
            doc_meta = {"format": self.kind + ".documents", "version": FORMAT_VERSION,
                        "n_units": len(documents), "settings": {"bm25": config}}
            schema, params = bm25_schema(self.client, config, extra_fields)
            self._create(docs_name, schema, params, doc_meta)
            self._insert(docs_name, doc_rows(self, documents, lambda u: {
                "cluster_id": cluster_of[u.id][0], "position": cluster_of[u.id][1]}),
                len(documents), f"milvus insert {self.collection} documents")
            schema, params = bm25_schema(self.client, config, None)
            self._create(physical, schema, params, meta)
            self._insert(physical, doc_rows(self, clusters), len(clusters),
                         f"milvus insert {self.collection} clusters")
            return meta

        self._swap(build)
        self._explicit = dict(config)
        return self

    @classmethod
    def from_index(cls, index: Any, uri: str | os.PathLike = "funnel.db",
                   collection: str = "funnel_clusters", **kwargs: Any) -> "MilvusClusteredBM25Index":
        """Upload a built in-memory :class:`ClusteredBM25Index` (same clusters, same settings)."""
        cfg = {k: v for k, v in index.bm25_config.items() if k != "backend"}
        obj = cls(uri, collection, max_tokens=index.max_tokens,
                  adjacency=index.adjacency if isinstance(index.adjacency, str) else "auto",
                  knn_k=index.knn_k, knn_threshold=index.knn_threshold, **cfg, **kwargs)
        return obj.upload(index.documents, index.clusters)

    @property
    def n_clusters(self) -> int:
        return int(self._opened().get("n_clusters", 0))

    def _check_settings(self, meta: Mapping[str, Any]) -> None:
        super()._check_settings(meta)
        from funnel_core.funnelrag.clustered_index import check_clustering_settings

        s = meta.get("settings", {})
        stored = s.get("adjacency", self.adjacency)  # "matrix": built from a matrix; keep ours
        try:
            adopted = check_clustering_settings(
                s.get("max_tokens", self.max_tokens), self.adjacency if stored == "matrix" else stored,
                s.get("knn_k", self.knn_k), s.get("knn_threshold", self.knn_threshold))
            for name, value in zip(CLUSTERING_SETTINGS, adopted):  # the collection's (not an edit)
                object.__setattr__(self, name, value)
        except (TypeError, ValueError) as exc:
            raise MilvusError(f"collection {self.collection!r} stores clustering settings funnel-rag cannot "
                              f"use ({exc}); it was changed outside funnel-rag: rebuild it with index().") from exc

    # searching -------------------------------------------------------------------------------
    def _query_all(self, name: str, expr: str, fields: list[str]) -> list[dict]:
        """All rows of ``name`` matching ``expr`` (paged past Milvus's 16384-row window)."""
        rows = list(self.client.query(name, filter=expr, output_fields=fields, limit=MAX_TOPK))
        if len(rows) < MAX_TOPK:
            return rows
        out: list[dict] = []
        it = self.client.query_iterator(name, batch_size=MAX_TOPK // 2, filter=expr,
                                        output_fields=fields)
        try:
            while True:
                page = it.next()
                if not page:
                    break
                out.extend(page)
        finally:
            it.close()
        return out

    def search(self, query: str, k: int = 10, filter: Any = None, return_clusters: bool = False,
               max_documents: int | None = None, name: str = "bm25") -> list[Unit]:
        """Top-``k`` clusters for ``query``, opened into documents unless ``return_clusters``.

        ``filter`` applies to documents and is pushed down: only clusters holding at least one
        matching document are ranked (found with a filtered query on the documents collection),
        and only matching documents are returned (never padded).
        """
        try:
            return self._search(query, k, filter, return_clusters, max_documents, name)
        except MilvusError:
            raise
        except Exception:
            # another process may have rebuilt the collection (the alias moved, the documents
            # collection we knew was dropped): re-read the settings once and retry
            old = self._meta
            self.refresh()
            try:
                meta = self._opened()
            except Exception:
                meta = None
            if meta is None or old is None or meta.get("documents") == old.get("documents"):
                raise
            return self._search(query, k, filter, return_clusters, max_documents, name)

    def _search(self, query: str, k: int, filter: Any, return_clusters: bool,
                max_documents: int | None, name: str) -> list[Unit]:
        check_positive_int(k, "k")
        check_positive_int(max_documents, "max_documents", allow_none=True)
        query = check_query(query)
        meta = self._opened()
        docs_name = meta["documents"]
        doc_expr = filter_expression(filter)
        if doc_expr == "false" or not query:
            return []
        cluster_expr = None
        if doc_expr:
            rows = self._query_all(docs_name, doc_expr, ["cluster_id"])
            allowed = sorted({r["cluster_id"] for r in rows})
            if not allowed:
                return []
            cluster_expr = in_expr("id", allowed)
        fields = ["id", "metadata", "info"] + (["text"] if return_clusters else [])
        # the clusters of the same build as docs_name (pinned when opened), never the alias,
        # which a concurrent rebuild may already have moved to new clusters
        toks = self._query_tokens([query])  # one tokenization for both collections
        hits = self._bm25_search(meta.get("_physical", self.collection), [query], k, cluster_expr,
                                 fields, toks)[0]
        clusters: list[Unit] = []
        for score, entity in hits:
            info = entity.get("info") or {}
            c = Unit(id=entity["id"], text=entity.get("text", ""),
                     metadata=dict(entity.get("metadata") or {}), parent_id=info.get("parent_id"),
                     level=info.get("level", "cluster")).rescored(score, name)
            c.funnel["bm25_rank"] = len(clusters)
            c.funnel["cluster_rank"] = len(clusters)
            clusters.append(c)
        if return_clusters or not clusters:
            return clusters
        from funnel_core.funnelrag.clustered_index import rank_opened_documents

        rank = {c.id: r for r, c in enumerate(clusters)}
        member_expr = and_expr(in_expr("cluster_id", rank), doc_expr)
        rows = self._query_all(docs_name, member_expr,
                               ["id", "text", "metadata", "info", "cluster_id", "position"])
        rows.sort(key=lambda r: (rank[r["cluster_id"]], r["position"]))
        # each document's own BM25 score (documents collection statistics) orders a cluster
        own = {e["id"]: s for s, e in self._bm25_search(docs_name, [query], min(len(rows), MAX_TOPK),
                                                         member_expr, ["id"], toks)[0]}
        docs = []
        for r in rows:
            cluster = clusters[rank[r["cluster_id"]]]
            doc = unit_from_row(r)
            doc.parent_id = cluster.id
            doc.funnel.update(cluster_id=cluster.id, cluster_score=cluster.score,
                              cluster_rank=rank[cluster.id])
            docs.append(doc)
        docs = rank_opened_documents(docs, lambda d: own.get(d.id, 0.0), name)
        return docs[:max_documents] if max_documents else docs

    def search_many(self, queries: Sequence[str], k: int = 10, filter: Any = None,
                    **kwargs: Any) -> list[list[Unit]]:
        """:meth:`search` for each query."""
        if isinstance(queries, str):
            raise TypeError("search_many expects a list of queries; use search() for one query.")
        return [self.search(q, k=k, filter=filter, **kwargs) for q in queries]
