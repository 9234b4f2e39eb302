"""FunnelRAG's retrieval stage (section 3.1.1): BM25 over document clusters.

:class:`ClusteredBM25Index` clusters the documents (Algorithm 1, :mod:`funnel_core.cluster`),
indexes the cluster texts with BM25, and at query time retrieves the top-``k`` clusters and
opens them into their member documents (each keeping ``cluster_id``, ``cluster_score`` and
``cluster_rank`` in metadata), or returns the clusters themselves.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from funnel_core.bm25 import BM25Index, MetadataFilter, metadata_mask
from funnel_core.cluster import Clustering, build_clusters
from funnel_core.errors import PersistError, check_positive_int
from funnel_core.funnel import Stage
from funnel_core.persist import atomic_dir, read_manifest, read_units, write_manifest, write_units
from funnel_core.text import OpenClusters
from funnel_core.units import Unit

__all__ = ["ClusteredBM25Index", "ClusteredBM25Retrieve"]

FORMAT = "funnel-rag.clustered-bm25"


class ClusteredBM25Index:
    """Documents clustered into ~``max_tokens`` units, with a BM25 index over the clusters.

    Args:
        max_tokens: Maximum cluster size S (whitespace tokens; the paper uses ~4K).
        adjacency: ``"auto"`` (metadata links if present, else BM25 kNN), ``"links"``, ``"bm25"``,
            or a precomputed scipy sparse (n, n) matrix passed to :meth:`index`.
        knn_k: Neighbours per document in the BM25 kNN graph.
        knn_threshold: Minimum normalised BM25 similarity of an edge.
        **bm25_config: Settings of the BM25 index over clusters (method, k1, b, stemmer,
            stopwords, token_pattern, backend...).
    """

    def __init__(self, *, max_tokens: int = 4096, adjacency: str = "auto", knn_k: int = 20,
                 knn_threshold: float = 0.1, **bm25_config: Any) -> None:
        self.max_tokens = check_positive_int(max_tokens, "max_tokens")
        self.adjacency = adjacency
        self.knn_k = check_positive_int(knn_k, "knn_k")
        self.knn_threshold = float(knn_threshold)
        self.bm25_config = bm25_config
        BM25Index(**bm25_config)  # validate settings now, not at first search
        self.documents: list[Unit] = []
        self.clusters: list[Unit] = []
        self.cluster_index: BM25Index | None = None
        self.clustering: Clustering | None = None
        self._doc_pos: dict[str, int] = {}
        self._cluster_docs: list[np.ndarray] = []

    def index(self, documents: Sequence[Unit], adjacency: sp.spmatrix | None = None) -> "ClusteredBM25Index":
        """Cluster ``documents`` and index the clusters (replaces previous content atomically)."""
        documents = [_as_document(d) for d in documents]
        clusters, clustering = build_clusters(
            documents, adjacency=self.adjacency if adjacency is None else adjacency,
            max_tokens=self.max_tokens, knn_k=self.knn_k, knn_threshold=self.knn_threshold,
            bm25_config=self.bm25_config)
        cluster_index = BM25Index(**self.bm25_config).index(clusters)
        self.documents, self.clusters, self.cluster_index = documents, clusters, cluster_index
        self.clustering = clustering
        self._build_lookup()
        return self

    def _build_lookup(self) -> None:
        self._doc_pos = {d.id: i for i, d in enumerate(self.documents)}
        self._cluster_docs = [np.array([self._doc_pos[m] for m in c.metadata["members"]], dtype=np.int64)
                              for c in self.clusters]
        self._opener = OpenClusters({d.id: d for d in self.documents})
        self._columns: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.documents)

    def _require_built(self) -> BM25Index:
        if self.cluster_index is None:
            raise RuntimeError("this ClusteredBM25Index is empty; call index(documents) or load(path).")
        return self.cluster_index

    def search(self, query: str, k: int = 10, filter: MetadataFilter = None,
               return_clusters: bool = False, max_documents: int | None = None,
               name: str = "bm25") -> list[Unit]:
        """Top-``k`` clusters for ``query``, opened into documents unless ``return_clusters``.

        ``filter`` applies to documents: only clusters holding at least one matching document
        are ranked, and only matching documents are returned (never padded). ``max_documents``
        caps the number of documents returned.
        """
        index = self._require_built()
        check_positive_int(k, "k")
        check_positive_int(max_documents, "max_documents", allow_none=True)
        cluster_filter = doc_mask = None
        if filter is not None:
            doc_mask = metadata_mask(self.documents, filter, self._columns)
            cluster_filter = np.fromiter((doc_mask[docs].any() for docs in self._cluster_docs),
                                         dtype=bool, count=len(self._cluster_docs))
        clusters = index.search(query, k=k, filter=cluster_filter, name=name)
        for rank, c in enumerate(clusters):
            c.metadata["cluster_rank"] = rank
        if return_clusters:
            return clusters
        docs = self._opener(query, clusters)
        if doc_mask is not None:
            docs = [d for d in docs if doc_mask[self._doc_pos[d.id]]]
        return docs[:max_documents] if max_documents else docs

    # -- persistence -----------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write documents, clusters and the cluster BM25 index to ``path`` atomically."""
        index = self._require_built()
        with atomic_dir(path) as tmp:
            write_units(tmp / "documents.jsonl", self.documents)
            index.save(tmp / "clusters")
            write_manifest(tmp, FORMAT, 1, max_tokens=self.max_tokens,
                           adjacency=self.adjacency if isinstance(self.adjacency, str) else "matrix",
                           knn_k=self.knn_k, knn_threshold=self.knn_threshold,
                           bm25_config=self.bm25_config, n_documents=len(self.documents),
                           n_clusters=len(self.clusters))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ClusteredBM25Index":
        """Load an index written by :meth:`save`."""
        path = Path(path)
        m = read_manifest(path, FORMAT, "clustered BM25 index")
        try:
            obj = cls(max_tokens=m["max_tokens"], adjacency=m["adjacency"], knn_k=m["knn_k"],
                      knn_threshold=m["knn_threshold"], **m["bm25_config"])
            obj.documents = read_units(path / "documents.jsonl")
        except Exception as exc:
            raise PersistError(f"the clustered BM25 index at {str(path)!r} is corrupt ({exc}); "
                               "rebuild it and save it again.") from exc
        obj.cluster_index = BM25Index.load(path / "clusters")
        obj.clusters = obj.cluster_index.units
        if len(obj.documents) != m["n_documents"] or len(obj.clusters) != m["n_clusters"]:
            raise PersistError(f"the clustered BM25 index at {str(path)!r} is inconsistent; rebuild it.")
        obj._build_lookup()
        return obj


def _as_document(unit: Unit) -> Unit:
    if not isinstance(unit, Unit):
        raise TypeError(f"ClusteredBM25Index.index expects Unit objects, got {type(unit).__name__}.")
    new = unit.copy()
    new.level = "document"
    return new


class ClusteredBM25Retrieve(Stage):
    """First funnel stage: top-``k`` clusters by BM25, opened into documents.

    ``stage % n`` caps the number of *documents* returned. Set ``return_clusters=True`` to emit
    the clusters (then open them later with :class:`~funnel_core.text.OpenClusters`).
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
