"""FunnelRAG's retrieval stage (section 3.1.1): BM25 over document clusters.

:class:`ClusteredBM25Index` clusters the documents (Algorithm 1, :mod:`funnel_core.funnelrag.clustering`),
indexes the cluster texts with BM25, and at query time retrieves the top-``k`` clusters and
opens them into their member documents, or returns the clusters themselves.

The clusters decide *which* documents come back; each document's score is its *own* BM25 score
(a BM25 index over the documents, same settings), and the documents are sorted by it, best
first, so a document without a query term never ranks above one with it. The cluster's score
and rank stay in the bookkeeping (``funnel["cluster_id"]``, ``["cluster_score"]``,
``["cluster_rank"]``). The query is tokenized once for both indexes.
"""

from __future__ import annotations

import inspect
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from funnel_core.bm25 import FILTER_CACHE_SIZE, BM25Index, TermCounts
from funnel_core.bm25.index import BM25_SETTINGS
from funnel_core.cache import FreshOnCopy, LRUCache
from funnel_core.errors import PersistError, check_positive_int, check_query
from funnel_core.filters import MetadataFilter, metadata_mask
from funnel_core.funnel import Stage
from funnel_core.funnelrag.chunking import OpenClusters
from funnel_core.funnelrag.clustering import (
    Clustering,
    bm25_knn_adjacency,
    build_clusters,
    has_links,
    link_adjacency,
)
from funnel_core.index import restore_settings
from funnel_core.persist import check_number, load_snapshot, prepare_units, read_units, save_snapshot, write_units
from funnel_core.settings import Settings
from funnel_core.text import count_tokens
from funnel_core.units import SCORE_PREFIX, Unit, check_unique_ids

__all__ = ["ClusteredBM25Index", "ClusteredBM25Retrieve", "rank_opened_documents", "check_clustering_settings"]

FORMAT = "funnel-rag.clustered-bm25"
FORMAT_VERSION = 3  # 2: snapshot layout (funnel_core.persist), incremental cluster ids; 3: settings as to_dict()
ADJACENCY_MODES = ("auto", "links", "bm25")
#: The clustering settings (of the in-memory and the Milvus clustered index).
CLUSTERING_SETTINGS = ("max_tokens", "adjacency", "knn_k", "knn_threshold")
#: BM25Index's defaults, which the clustered index's BM25 settings take (written once, there).
_BM25: dict[str, Any] = {n: p.default for n, p in inspect.signature(BM25Index.__init__).parameters.items()
                         if n in BM25_SETTINGS}
_SEPARATOR = "\n\n"  # joins member texts into a cluster text (as build_clusters does)


def check_clustering_settings(max_tokens: Any, adjacency: Any, knn_k: Any,
                              knn_threshold: Any) -> tuple[int, str, int, float]:
    """The clustering settings of every clustered index (in memory and on Milvus), validated:
    ``(max_tokens, adjacency, knn_k, knn_threshold)``; a bad value raises naming it and the fix."""
    if not isinstance(adjacency, str) or adjacency not in ADJACENCY_MODES:
        raise ValueError(f"adjacency must be one of {ADJACENCY_MODES}, got {adjacency!r:.60}; "
                         "pass a precomputed matrix to index(documents, adjacency=matrix).")
    return (check_positive_int(max_tokens, "max_tokens"), adjacency, check_positive_int(knn_k, "knn_k"),
            float(check_number(knn_threshold, "knn_threshold", 0.0, 1e6)))


@dataclass(frozen=True)
class _ClusteredState:
    """Everything a built clustered index answers queries from, swapped in one assignment."""

    documents: tuple
    clusters: tuple
    cluster_index: BM25Index
    clustering: Clustering
    doc_pos: dict
    cluster_docs: tuple
    opener: OpenClusters
    next_cluster: int
    document_index: BM25Index  # BM25 over the documents themselves (same order): in-cluster order
    columns: LRUCache = field(default_factory=lambda: LRUCache(FILTER_CACHE_SIZE))


def rank_opened_documents(docs: list[Unit], document_score: Callable[[Unit], float],
                          name: str) -> list[Unit]:
    """Opened documents scored by their own relevance and sorted by it, best first.

    ``docs`` come in cluster order (from :class:`~funnel_core.funnelrag.chunking.OpenClusters`,
    carrying ``funnel["cluster_rank"]``); each gets ``score = document_score(doc)``, recorded as
    stage ``name``. Equal scores keep cluster order, then member order (the sort is stable), so
    documents without a query term (score 0) come last, in cluster order. Shared by every
    clustered backend.
    """
    out = []
    for d in docs:
        s = float(document_score(d))
        d.score = s
        d.funnel = {k: v for k, v in d.funnel.items() if not k.startswith(SCORE_PREFIX)}
        d.record_score(name, s)
        out.append(d)
    out.sort(key=lambda d: -(d.score or 0.0))
    for rank, d in enumerate(out):
        d.funnel["bm25_rank"] = rank
    return out


def _cluster_number(cluster_id: str) -> int:
    tail = cluster_id.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


class ClusteredBM25Index(FreshOnCopy, Settings):
    """Documents clustered into ~``max_tokens`` units, with a BM25 index over the clusters.

    Args:
        max_tokens: Maximum cluster size S (whitespace tokens; the paper uses ~4K).
        adjacency: ``"auto"`` (links under our ``metadata["funnel_links"]`` if any document has
            them, else BM25 kNN), ``"links"``, ``"bm25"``; or pass a precomputed scipy sparse
            (n, n) matrix to :meth:`index` (e.g. ``link_adjacency(documents, key="links")`` to
            cluster by a key of your own). A user's ``links`` key is never read.
        knn_k: Neighbours per document in the BM25 kNN graph.
        knn_threshold: Minimum normalised BM25 similarity of an edge.

    The BM25 settings ``method``, ``k1``, ``b``, ``delta``, ``stemmer``, ``stopwords``,
    ``token_pattern``, ``lower``, ``engine`` and ``cjk`` configure the BM25 indexes over the
    clusters and the documents, as for :class:`~funnel_core.bm25.BM25Index` (same defaults).

    The whole built state (documents, clusters, cluster BM25 index, lookups) is one immutable
    object swapped in a single assignment by :meth:`index`, :meth:`add` and :meth:`delete`, so
    concurrent searches never see clusters of one version with documents of another.

    Re-clustering policy: :meth:`index` runs Algorithm 1 over the whole corpus. :meth:`add`
    places each new document by Algorithm 1's rule against the existing clusters (join the
    neighbouring cluster closest to it that still has room; otherwise start a new cluster), and
    :meth:`delete` removes documents from their clusters (dropping emptied clusters) without
    merging clusters again. After many updates, call :meth:`index` again to re-cluster.
    """

    #: every setting but BM25's scoring engine shapes the clusters or their index
    build_settings = frozenset(CLUSTERING_SETTINGS + BM25_SETTINGS) - {"engine"}

    def __init__(self, *, max_tokens: int = 4096, adjacency: str = "auto", knn_k: int = 20,
                 knn_threshold: float = 0.1, method: str = _BM25["method"], k1: float = _BM25["k1"],
                 b: float = _BM25["b"], delta: float = _BM25["delta"],
                 stemmer: str | None = _BM25["stemmer"], stopwords: str | list[str] | None = _BM25["stopwords"],
                 token_pattern: str = _BM25["token_pattern"], lower: bool = _BM25["lower"],
                 engine: str = _BM25["engine"], cjk: str | None = _BM25["cjk"]) -> None:
        self.max_tokens, self.adjacency, self.knn_k, self.knn_threshold = check_clustering_settings(
            max_tokens, adjacency, knn_k, knn_threshold)
        config = BM25Index(method=method, k1=k1, b=b, delta=delta, stemmer=stemmer, stopwords=stopwords,
                           token_pattern=token_pattern, lower=lower, engine=engine, cjk=cjk).config
        for name in BM25_SETTINGS:  # validated, as the BM25 index stores them
            setattr(self, name, config[name])
        self._state: _ClusteredState | None = None
        self._write_lock = threading.Lock()

    @property
    def bm25_config(self) -> dict[str, Any]:
        """The settings of the BM25 indexes over the clusters and the documents."""
        return {n: getattr(self, n) for n in BM25_SETTINGS}

    def built(self) -> bool:
        return self.__dict__.get("_state") is not None

    # -- state views -----------------------------------------------------------------------

    @property
    def documents(self) -> list[Unit]:
        st = self._state
        return [] if st is None else list(st.documents)

    @property
    def clusters(self) -> list[Unit]:
        st = self._state
        return [] if st is None else list(st.clusters)

    @property
    def cluster_index(self) -> BM25Index | None:
        st = self._state
        return None if st is None else st.cluster_index

    @property
    def clustering(self) -> Clustering | None:
        st = self._state
        return None if st is None else st.clustering

    def _document_index(self, documents: list[Unit]) -> tuple[BM25Index, TermCounts]:
        """The BM25 index over the documents, and their term counts (the clusters' are sums)."""
        index = BM25Index(**self.bm25_config)
        counts = index.term_counts([d.text for d in documents])
        return index.index_counts(documents, counts, copy=False), counts  # our own copies

    def _make_state(self, documents: list[Unit], clusters: list[Unit], clustering: Clustering | None,
                    next_cluster: int | None = None,
                    document_index: tuple[BM25Index, TermCounts] | None = None) -> _ClusteredState:
        doc_pos = {d.id: i for i, d in enumerate(documents)}
        cluster_docs = tuple(np.array([doc_pos[m] for m in c.metadata["members"]], dtype=np.int64)
                             for c in clusters)
        doc_index, counts = document_index or self._document_index(documents)
        if clustering is None:
            clustering = Clustering(members=[cd.tolist() for cd in cluster_docs],
                                    sizes=[int(c.metadata["n_tokens"]) for c in clusters],
                                    stats={"n_documents": len(documents), "n_clusters": len(clusters),
                                           "max_tokens": self.max_tokens, "incremental": True})
        cluster_index = BM25Index(**self.bm25_config)
        if cluster_index.splits_at(_SEPARATOR):  # a cluster's counts = its members' summed
            cluster_index.index_counts(clusters, counts.grouped(cluster_docs))
        else:
            cluster_index.index(clusters)
        if next_cluster is None:
            next_cluster = 1 + max((_cluster_number(c.id) for c in clusters), default=-1)
        return _ClusteredState(tuple(documents), tuple(clusters), cluster_index, clustering, doc_pos,
                               cluster_docs, OpenClusters({d.id: d for d in documents}), next_cluster,
                               doc_index)

    # -- building --------------------------------------------------------------------------
    def index(self, documents: Sequence[Unit], adjacency: sp.spmatrix | None = None) -> "ClusteredBM25Index":
        """Cluster ``documents`` and index the clusters (replaces previous content atomically)."""
        if isinstance(documents, (str, Unit)):
            raise TypeError("index expects a list of Unit objects; wrap a single unit in a list.")
        documents = as_documents(prepare_units(list(documents), "ClusteredBM25Index.index"))
        if not documents:
            raise ValueError("cannot cluster an empty corpus; pass at least one document.")
        document_index = self._document_index(documents)
        if adjacency is None:
            mode = self.adjacency
            if mode == "auto":
                mode = "links" if has_links(documents) else "bm25"
            # the BM25 kNN graph is built over the same document index the search orders by
            adjacency = (bm25_knn_adjacency(document_index[0], k=self.knn_k, threshold=self.knn_threshold)
                         if mode == "bm25" else link_adjacency(documents))
        clusters, clustering = build_clusters(
            documents, adjacency=adjacency, max_tokens=self.max_tokens, knn_k=self.knn_k,
            knn_threshold=self.knn_threshold, bm25_config=self.bm25_config)
        state = self._make_state(documents, clusters, clustering, document_index=document_index)
        with self._write_lock:
            self._state = state
        return self

    def _neighbours(self, documents: list[Unit], n_old: int, adjacency: sp.spmatrix | None,
                    document_index: BM25Index) -> sp.csr_matrix:
        n = len(documents)
        if adjacency is not None:
            adj = sp.csr_matrix(adjacency, dtype=np.float64)
            if adj.shape == (n - n_old, n):
                return adj
            if adj.shape == (n, n):
                return adj[n_old:]
            raise ValueError(f"adjacency for add() must have shape ({n - n_old}, {n}) or ({n}, {n}) "
                             f"(rows: new documents; columns: existing then new), got {adj.shape}.")
        mode = self.adjacency
        if mode == "auto":
            mode = "links" if has_links(documents) else "bm25"
        if mode == "links":
            return link_adjacency(documents)[n_old:]
        return bm25_knn_adjacency(document_index, k=self.knn_k,
                                  threshold=self.knn_threshold)[n_old:].tocsr()

    def add(self, documents: Sequence[Unit], adjacency: sp.spmatrix | None = None) -> "ClusteredBM25Index":
        """Add documents (new ids), each placed by Algorithm 1's rule against existing clusters.

        For each new document ``d`` (in the given order): find the clusters holding its
        neighbours (the same graph :meth:`index` uses: metadata links or the BM25 kNN graph over
        old + new documents; or rows of ``adjacency``), rank them by closeness to ``d`` (summed
        edge weight to the cluster's members divided by its member count, ties by cluster order)
        and add ``d`` to the closest one whose size stays within ``max_tokens``; with no such
        cluster ``d`` starts a new cluster. The cluster BM25 index is then rebuilt (IDF changes).
        """
        if isinstance(documents, (str, Unit)):
            raise TypeError("add expects a list of Unit objects; wrap a single unit in a list.")
        new = as_documents(prepare_units(list(documents), "ClusteredBM25Index.add"))
        if not new:
            return self
        check_unique_ids(new)
        with self._write_lock:
            st = self._state
            if st is None:
                state = None
            else:
                for d in new:
                    if d.id in st.doc_pos:
                        raise ValueError(f"document id {d.id!r} is already in the index; delete it "
                                         "first (delete([id])) or use a new id.")
                docs = list(st.documents) + new
                n_old = len(st.documents)
                document_index = self._document_index(docs)
                rows = self._neighbours(docs, n_old, adjacency, document_index[0])
                members = [list(c.metadata["members"]) for c in st.clusters]
                sizes = [int(c.metadata["n_tokens"]) for c in st.clusters]
                ids = [c.id for c in st.clusters]
                cluster_of = {m: ci for ci, mem in enumerate(members) for m in mem}
                next_cluster = st.next_cluster
                changed: set[int] = set()
                for j, d in enumerate(new):
                    i = n_old + j
                    tok = count_tokens(d.text)
                    row = rows.getrow(j)
                    strength: dict[int, float] = {}
                    for col, w in zip(row.indices.tolist(), row.data.tolist()):
                        if col >= i or w <= 0:  # only documents placed before d
                            continue
                        ci = cluster_of[docs[col].id]
                        strength[ci] = strength.get(ci, 0.0) + float(w)
                    ranked = sorted(strength, key=lambda ci: (-strength[ci] / len(members[ci]), ci))
                    target = next((ci for ci in ranked if sizes[ci] + tok <= self.max_tokens), None)
                    if target is None:
                        members.append([d.id])
                        sizes.append(tok)
                        ids.append(f"cluster-{next_cluster}")
                        next_cluster += 1
                        target = len(members) - 1
                    else:
                        members[target].append(d.id)
                        sizes[target] += tok
                    cluster_of[d.id] = target
                    changed.add(target)
                state = self._make_state(docs, self._cluster_units(docs, members, sizes, ids, st, changed),
                                         None, next_cluster, document_index)
            if state is not None:
                self._state = state
        if state is None:  # nothing indexed yet: cluster from scratch
            return self.index(documents, adjacency=adjacency)
        return self

    def delete(self, ids: Sequence[str]) -> int:
        """Remove documents by id (unknown ids ignored) from their clusters; return how many.

        Emptied clusters are dropped; the others keep their ids and are not re-merged.
        """
        if isinstance(ids, str):
            raise TypeError("delete expects a list of ids; wrap a single id in a list.")
        drop = {str(i) for i in ids}
        with self._write_lock:
            st = self._state
            if st is None:
                return 0
            docs = [d for d in st.documents if d.id not in drop]
            removed = len(st.documents) - len(docs)
            if removed == 0:
                return 0
            if not docs:
                raise ValueError("delete would remove every document; build a new index instead.")
            members: list[list[str]] = []
            sizes: list[int] = []
            cids: list[str] = []
            changed: set[int] = set()
            tokens = {d.id: count_tokens(d.text) for d in docs}
            for c in st.clusters:
                mem = [m for m in c.metadata["members"] if m not in drop]
                if not mem:
                    continue
                if len(mem) != len(c.metadata["members"]):
                    changed.add(len(members))
                members.append(mem)
                sizes.append(sum(tokens[m] for m in mem))
                cids.append(c.id)
            old = {c.id: c for c in st.clusters}
            by_id = {d.id: d for d in docs}
            clusters = [old[cid] if k not in changed else
                        Unit(id=cid, text=_SEPARATOR.join(by_id[m].text for m in members[k]),
                             metadata={"members": members[k], "n_tokens": sizes[k]}, level="cluster")
                        for k, cid in enumerate(cids)]
            self._state = self._make_state(docs, clusters, None, st.next_cluster)
        return removed

    @staticmethod
    def _cluster_units(docs: list[Unit], members: list[list[str]], sizes: list[int], ids: list[str],
                       st: _ClusteredState, changed: set[int]) -> list[Unit]:
        by_id = {d.id: d for d in docs}
        out = []
        for k, mem in enumerate(members):
            if k < len(st.clusters) and k not in changed:
                out.append(st.clusters[k])
            else:
                out.append(Unit(id=ids[k], text=_SEPARATOR.join(by_id[m].text for m in mem),
                                metadata={"members": list(mem), "n_tokens": sizes[k]}, level="cluster"))
        return out

    def __len__(self) -> int:
        st = self._state
        return 0 if st is None else len(st.documents)

    def _require_built(self) -> _ClusteredState:
        st = self._state
        if st is None:
            raise RuntimeError("this ClusteredBM25Index is empty; call index(documents) or load(path).")
        return st

    def search(self, query: str, k: int = 10, filter: MetadataFilter = None,
               return_clusters: bool = False, max_documents: int | None = None,
               name: str = "bm25") -> list[Unit]:
        """Top-``k`` clusters for ``query``, opened into documents unless ``return_clusters``.

        ``filter`` applies to documents: only clusters holding at least one matching document
        are ranked, and only matching documents are returned (never padded). ``max_documents``
        caps the number of documents returned.
        """
        return self.search_many([query], k=k, filter=filter, return_clusters=return_clusters,
                                max_documents=max_documents, name=name)[0]

    def search_many(self, queries: Sequence[str], k: int = 10, filter: MetadataFilter = None,
                    return_clusters: bool = False, max_documents: int | None = None,
                    name: str = "bm25") -> list[list[Unit]]:
        """:meth:`search` for each query, in order: the filter is compiled into a document mask
        once and the queries are tokenized together (the results equal one :meth:`search` per
        query)."""
        if isinstance(queries, str):
            raise TypeError("search_many expects a list of queries; use search() for one query.")
        st = self._require_built()
        check_positive_int(k, "k")
        check_positive_int(max_documents, "max_documents", allow_none=True)
        queries = [check_query(q) for q in queries]
        doc_mask = None if filter is None else metadata_mask(st.documents, filter, st.columns)
        cluster_filter: np.ndarray | None = None
        if doc_mask is not None:
            cluster_filter = np.array([bool(doc_mask[docs].any()) for docs in st.cluster_docs],
                                      dtype=bool)
        live = [i for i, q in enumerate(queries) if q]
        results: list[list[Unit]] = [[] for _ in queries]
        # one tokenization for both indexes (same settings: checked at build and load)
        for i, tokens in zip(live, st.cluster_index.tokenize([queries[i] for i in live])):
            results[i] = self._search_tokens(st, queries[i], tokens, k, doc_mask, cluster_filter,
                                             return_clusters, max_documents, name)
        return results

    @staticmethod
    def _search_tokens(st: _ClusteredState, query: str, tokens: list[str], k: int,
                       doc_mask: np.ndarray | None, cluster_filter: np.ndarray | None,
                       return_clusters: bool, max_documents: int | None, name: str) -> list[Unit]:
        clusters = st.cluster_index.hits(st.cluster_index.token_scores(tokens), k,
                                         cluster_filter, name)
        for rank, c in enumerate(clusters):
            c.funnel["cluster_rank"] = rank
        if return_clusters:
            return clusters
        docs = st.opener(query, clusters)
        if doc_mask is not None:
            docs = [d for d in docs if doc_mask[st.doc_pos[d.id]]]
        if docs:
            own = st.document_index.token_scores(tokens)
            docs = rank_opened_documents(docs, lambda d: own[st.doc_pos[d.id]], name)
        return docs[:max_documents] if max_documents else docs

    # -- persistence -----------------------------------------------------------------------
    def _write(self, folder: Path, st: _ClusteredState | None = None) -> dict[str, Any]:
        st = st or self._require_built()
        folder.mkdir(parents=True, exist_ok=True)
        write_units(folder / "documents.jsonl", st.documents)
        cluster_meta = st.cluster_index._write(folder / "clusters")
        document_meta = st.document_index._write(folder / "documents_bm25")
        return dict(settings=self.to_dict(), n_documents=len(st.documents), n_clusters=len(st.clusters),
                    next_cluster=st.next_cluster, clusters=cluster_meta, documents_bm25=document_meta)

    def save(self, path: str | os.PathLike) -> None:
        """Commit documents, clusters and the cluster BM25 index to the persist folder ``path``
        (see :mod:`funnel_core.persist`)."""
        st = self._require_built()
        save_snapshot(path, FORMAT, FORMAT_VERSION, lambda folder: self._write(folder, st))

    @classmethod
    def _legacy_settings(cls, m: Mapping[str, Any]) -> dict[str, Any]:
        """The settings of a manifest written before they were ``to_dict()``: the clustering
        settings as keys of their own and the BM25 ones in ``bm25_config`` (whose scoring engine
        may still be called ``backend``)."""
        bm25_config = m["bm25_config"]
        if not isinstance(bm25_config, dict):
            raise TypeError("bm25_config must be a dict")
        # saved before BM25's scoring engine was called engine= (it was backend=)
        bm25_config = {("engine" if k == "backend" else k): v for k, v in bm25_config.items()}
        return {**{n: m[n] for n in CLUSTERING_SETTINGS}, **bm25_config}

    @classmethod
    def _read(cls, folder: Path, m: Mapping[str, Any]) -> "ClusteredBM25Index":
        obj: ClusteredBM25Index = restore_settings(cls, folder, m, "clustered BM25 index")
        try:
            next_cluster = check_number(m["next_cluster"], "next_cluster", 0, 1e12, integer=True)
        except (KeyError, TypeError, ValueError) as exc:
            raise PersistError(f"the clustered BM25 index in {str(folder)!r} has an invalid or missing "
                               f"setting ({type(exc).__name__}: {exc}); rebuild it.") from exc
        documents = read_units(folder / "documents.jsonl")
        cluster_index = BM25Index._read(folder / "clusters", m.get("clusters") or {})
        clusters = cluster_index.units
        if (len(documents) != m.get("n_documents") or len(clusters) != m.get("n_clusters")
                or cluster_index.config != obj.bm25_config):
            raise PersistError(f"the clustered BM25 index in {str(folder)!r} is inconsistent; rebuild it.")
        check_unique_ids(documents)
        ids = {d.id for d in documents}
        seen: list[str] = []
        for c in clusters:
            mem = c.metadata.get("members")
            if not isinstance(mem, list) or not mem or not all(isinstance(x, str) and x in ids for x in mem):
                raise PersistError(f"cluster {c.id!r} in {str(folder)!r} lists unknown members; rebuild it.")
            seen.extend(mem)
        if len(seen) != len(ids) or set(seen) != ids:
            raise PersistError(f"the clusters in {str(folder)!r} do not cover every document exactly "
                               "once; rebuild the index.")
        doc_pos = {d.id: i for i, d in enumerate(documents)}
        cluster_docs = tuple(np.array([doc_pos[x] for x in c.metadata["members"]], dtype=np.int64)
                             for c in clusters)
        clustering = Clustering(members=[cd.tolist() for cd in cluster_docs],
                                sizes=[int(c.metadata.get("n_tokens", 0)) for c in clusters],
                                stats={"n_documents": len(documents), "n_clusters": len(clusters),
                                       "max_tokens": obj.max_tokens, "loaded": True})
        if m.get("documents_bm25") is None:  # saved before documents were scored: index them now
            document_index = BM25Index(**obj.bm25_config).index(documents)
        else:
            document_index = BM25Index._read(folder / "documents_bm25", m["documents_bm25"])
            if (document_index.config != obj.bm25_config
                    or [u.id for u in document_index.units] != [d.id for d in documents]):
                raise PersistError(f"the document BM25 index in {str(folder)!r} does not match the "
                                   "documents; rebuild the clustered index.")
        obj._state = _ClusteredState(tuple(documents), tuple(clusters), cluster_index, clustering,
                                     doc_pos, cluster_docs, OpenClusters({d.id: d for d in documents}),
                                     int(next_cluster), document_index)
        return obj

    @classmethod
    def load(cls, path: str | os.PathLike, verify: bool = True) -> "ClusteredBM25Index":
        """Load an index written by :meth:`save` (``verify=False`` skips the SHA-256 checks)."""
        return load_snapshot(path, FORMAT, FORMAT_VERSION, "clustered BM25 index",
                             lambda folder, m: cls._read(folder, m["meta"]), verify=verify)


def as_documents(units: list[Unit]) -> list[Unit]:
    """Set ``level="document"`` on the index's own copies (from ``prepare_units``)."""
    for u in units:
        u.level = "document"
    return units


class ClusteredBM25Retrieve(Stage):
    """First funnel stage: top-``k`` clusters by BM25, opened into documents.

    ``stage % n`` caps the number of *documents* returned. Set ``return_clusters=True`` to emit
    the clusters (then open them later with :class:`~funnel_core.funnelrag.chunking.OpenClusters`).
    """

    def __init__(self, index: ClusteredBM25Index, k: int = 10, return_clusters: bool = False,
                 filter: MetadataFilter = None, name: str = "clustered_bm25") -> None:
        self.index = index
        self.k = check_positive_int(k, "k")
        self.return_clusters = return_clusters
        self.filter = filter
        self.name = name
        self.level = "cluster" if return_clusters else "document"

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        return self.index.search(query, k=self.k, filter=self.filter,
                                 return_clusters=self.return_clusters, name=self.name)
