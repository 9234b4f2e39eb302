"""FunnelRAG document clustering (Algorithm 1, Appendix D) and the adjacency builders it needs.

Related documents are merged into retrieval units of at most ``max_tokens`` tokens (~4K in the
paper), so the first, recall-oriented BM25 stage searches a corpus ~30x smaller.

Algorithm 1, as implemented in :func:`cluster_documents`:

1. compute every document's local clustering coefficient in the adjacency graph and visit the
   documents from the highest to the lowest coefficient (ties: input order);
2. every document starts as its own (singleton) cluster;
3. for each visited document ``d`` that is still a singleton: remove its singleton, find the
   clusters that hold its neighbours, sort them by closeness to ``d`` (high to low), and merge
   them one by one into a new cluster that starts as ``{d}``, skipping a cluster whenever the
   merge would exceed ``max_tokens``; add the new cluster back.

*Closeness to d.* The paper sorts neighbouring clusters by closeness centrality to the document.
Exact closeness centrality needs all-pairs shortest paths (O(n*m)), which does not scale to
100k documents in minutes; we use the local, weighted form: the summed edge weight between
``d`` and the cluster's members divided by the cluster's member count (average linkage). For
an unweighted link graph this is the share of the cluster that is directly linked to ``d``.
A document that is no longer a singleton when visited was already absorbed by a more central
document and is skipped. The result is deterministic for the same input.

Adjacency builders (all return a symmetric ``scipy.sparse.csr_matrix`` of edge weights):

* :func:`link_adjacency` — explicit links in metadata (ids or titles, like Wikipedia links);
* :func:`bm25_knn_adjacency` — each document queries the BM25 index with its top-``m``
  highest-weighted terms, as one sparse matrix product; neighbours are the top ``k`` with a
  score normalised by the self-score above ``threshold``;
* :func:`embedding_knn_adjacency` — cosine k-nearest neighbours above a threshold.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from funnel_core.errors import check_positive_int
from funnel_core.text import count_tokens
from funnel_core.units import Unit, check_unique_ids

__all__ = [
    "Clustering",
    "cluster_documents",
    "local_clustering_coefficient",
    "link_adjacency",
    "bm25_knn_adjacency",
    "embedding_knn_adjacency",
    "build_clusters",
]


@dataclass
class Clustering:
    """The output of :func:`cluster_documents`.

    Attributes:
        members: For each cluster, the indices of its documents (merge order).
        sizes: Tokens per cluster.
        seconds: Wall-clock seconds the clustering took.
    """

    members: list[list[int]]
    sizes: list[int]
    seconds: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)

    def assignment(self, n: int) -> np.ndarray:
        """Cluster index of every document."""
        out = np.empty(n, dtype=np.int64)
        for c, mem in enumerate(self.members):
            out[mem] = c
        return out


def _binary_symmetric(adj: sp.spmatrix) -> sp.csr_matrix:
    a = sp.csr_matrix(adj, dtype=np.float64)
    a = a.maximum(a.T).tocsr()
    a.setdiag(0)
    a.eliminate_zeros()
    return a


def local_clustering_coefficient(adj: sp.spmatrix) -> np.ndarray:
    """Local clustering coefficient of every node of an undirected graph (weights ignored).

    ``C(v) = 2 T(v) / (deg(v) (deg(v) - 1))`` with ``T(v)`` the triangles through ``v``, computed
    as ``((A @ A) * A).sum(1) / 2`` on the sparse binary adjacency.
    """
    a = _binary_symmetric(adj)
    a.data[:] = 1.0
    deg = np.asarray(a.sum(axis=1)).ravel()
    tri = np.asarray((a @ a).multiply(a).sum(axis=1)).ravel() / 2.0
    denom = deg * (deg - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cc = np.where(denom > 0, 2.0 * tri / denom, 0.0)
    return cc


def cluster_documents(adj: sp.spmatrix, sizes: Sequence[int], max_tokens: int = 4096,
                      grow_absorbed: bool = False) -> Clustering:
    """FunnelRAG Algorithm 1 over a document graph (see the module docstring).

    Args:
        adj: (n, n) adjacency with edge weights (symmetrised; the diagonal is ignored).
        sizes: Token count of every document.
        max_tokens: Maximum cluster size S in tokens.
        grow_absorbed: When a visited document was already absorbed into a cluster, grow that
            cluster from it. The default ``False`` skips such documents (the paper's singleton
            reading); on SciFact train it gave larger clusters and higher cluster recall.
    """
    check_positive_int(max_tokens, "max_tokens")
    t0 = time.perf_counter()
    sizes_arr = np.asarray(sizes, dtype=np.int64)
    n = len(sizes_arr)
    if adj.shape != (n, n):
        raise ValueError(f"adjacency shape {adj.shape} does not match {n} documents.")
    a = sp.csr_matrix(adj, dtype=np.float64)
    a = a.maximum(a.T).tocsr()
    a.setdiag(0)
    a.eliminate_zeros()
    cc = local_clustering_coefficient(a)
    order = np.lexsort((np.arange(n), -cc))  # by coefficient desc, then index

    cluster_of = np.arange(n, dtype=np.int64)
    members: dict[int, list[int]] = {i: [i] for i in range(n)}
    tokens = sizes_arr.tolist()  # tokens per cluster id; new clusters get ids n, n+1, ...
    indptr, indices, weights = a.indptr, a.indices, a.data

    for d in order.tolist():
        cid = cluster_of[d]
        if len(members[cid]) > 1 and not grow_absorbed:
            continue  # already absorbed by a more central document
        nbrs = indices[indptr[d]:indptr[d + 1]]
        if len(nbrs) == 0:
            continue
        w = weights[indptr[d]:indptr[d + 1]]
        ncl = cluster_of[nbrs]
        keep = ncl != cid
        if not keep.any():
            continue
        uniq, inv = np.unique(ncl[keep], return_inverse=True)
        strength = np.bincount(inv, weights=w[keep])
        counts = np.fromiter((len(members[c]) for c in uniq.tolist()), dtype=np.float64,
                             count=len(uniq))
        closeness = strength / counts
        ranked = uniq[np.lexsort((uniq, -closeness))]
        # remove d's cluster (its singleton, unless absorbed) and grow a new cluster from it
        new_members = members.pop(cid)
        size = tokens[cid]
        for c in ranked.tolist():
            if size + tokens[c] > max_tokens:
                continue
            new_members.extend(members.pop(c))
            size += tokens[c]
        new_id = len(tokens)
        tokens.append(size)
        members[new_id] = new_members
        cluster_of[new_members] = new_id

    live = sorted(members, key=lambda c: min(members[c]))  # deterministic cluster order
    out_members = [members[c] for c in live]
    out_sizes = [int(sizes_arr[m].sum()) for m in out_members]
    return Clustering(members=out_members, sizes=out_sizes, seconds=time.perf_counter() - t0,
                      stats={"n_documents": n, "n_clusters": len(out_members),
                             "n_edges": int(a.nnz // 2), "max_tokens": max_tokens})


def link_adjacency(units: Sequence[Unit], key: str = "links", title_key: str = "title") -> sp.csr_matrix:
    """Adjacency from explicit links: ``unit.metadata[key]`` lists linked ids or titles."""
    index = {u.id: i for i, u in enumerate(units)}
    for i, u in enumerate(units):
        title = u.metadata.get(title_key)
        if isinstance(title, str):
            index.setdefault(title, i)
    rows, cols = [], []
    for i, u in enumerate(units):
        for target in u.metadata.get(key) or ():
            j = index.get(str(target))
            if j is not None and j != i:
                rows.append(i)
                cols.append(j)
    n = len(units)
    adj = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, n))
    return adj.maximum(adj.T).tocsr()


def bm25_knn_adjacency(index: Any, k: int = 20, threshold: float = 0.1, query_terms: int = 16,
                       chunk_size: int = 2048) -> sp.csr_matrix:
    """BM25 k-nearest-neighbour graph over the units of a :class:`~funnel_core.bm25.BM25Index`.

    Each document's query is its ``query_terms`` highest-BM25-weight terms; all documents are
    scored at once per chunk as ``Q @ W.T`` (scipy.sparse), where ``W`` is the index's (docs x
    terms) BM25 weight matrix. A neighbour's score is normalised by the document's self-score, so
    ``threshold`` is in [0, 1]. Edge weight = that normalised score; the graph is symmetrised.
    """
    check_positive_int(k, "k")
    check_positive_int(query_terms, "query_terms")
    s = index._retriever.scores
    n = int(s["num_docs"])
    w = sp.csc_matrix((s["data"], s["indices"], s["indptr"]), shape=(n, len(s["indptr"]) - 1))
    # bm25s numbers terms in hash-seed-dependent order; put the columns in sorted-term order so
    # tie-breaking, and hence the graph, is the same in every process.
    vocab = index._retriever.vocab_dict
    w = w[:, [vocab[t] for t in sorted(vocab) if vocab[t] < w.shape[1]]].tocsr()
    # keep each document's top-m weighted terms as its query (binary bag of words)
    q_rows, q_cols = [], []
    for i in range(n):
        lo, hi = w.indptr[i], w.indptr[i + 1]
        if hi == lo:
            continue
        row_w = w.data[lo:hi]
        top = np.argsort(-row_w, kind="stable")[:query_terms]
        q_rows.append(np.full(len(top), i))
        q_cols.append(w.indices[lo:hi][top])
    if not q_rows:
        return sp.csr_matrix((n, n))
    q = sp.csr_matrix((np.ones(sum(len(r) for r in q_rows)), (np.concatenate(q_rows), np.concatenate(q_cols))),
                      shape=w.shape)
    wt = w.T.tocsc()
    rows, cols, vals = [], [], []
    for start in range(0, n, chunk_size):
        block = (q[start:start + chunk_size] @ wt).tocsr()  # (chunk, n) scores
        for r in range(block.shape[0]):
            i = start + r
            lo, hi = block.indptr[r], block.indptr[r + 1]
            if hi == lo:
                continue
            cand, sc = block.indices[lo:hi], block.data[lo:hi]
            self_mask = cand == i
            self_score = float(sc[self_mask][0]) if self_mask.any() else float(sc.max())
            if self_score <= 0:
                continue
            norm = sc / self_score
            norm[self_mask] = -1.0
            kk = min(k, len(cand))
            top = np.argpartition(-norm, kk - 1)[:kk]
            top = top[norm[top] >= threshold]
            rows.append(np.full(len(top), i))
            cols.append(cand[top])
            vals.append(np.minimum(norm[top], 1.0))
    if not rows:
        return sp.csr_matrix((n, n))
    adj = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n))
    return adj.maximum(adj.T).tocsr()


def embedding_knn_adjacency(embeddings: np.ndarray, k: int = 10, threshold: float = 0.5,
                            chunk_size: int = 1024) -> sp.csr_matrix:
    """Cosine k-nearest-neighbour graph (embeddings are L2-normalised here), chunked matmul."""
    check_positive_int(k, "k")
    emb = np.asarray(embeddings, dtype=np.float32)
    emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    n = emb.shape[0]
    kk = min(k + 1, n)
    rows, cols, vals = [], [], []
    for start in range(0, n, chunk_size):
        sims = emb[start:start + chunk_size] @ emb.T
        idx = np.argpartition(-sims, kk - 1, axis=1)[:, :kk]
        for r in range(sims.shape[0]):
            i = start + r
            cand = idx[r][idx[r] != i]
            sc = sims[r, cand]
            keep = sc >= threshold
            rows.append(np.full(int(keep.sum()), i))
            cols.append(cand[keep])
            vals.append(sc[keep])
    adj = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n))
    return adj.maximum(adj.T).tocsr()


def build_clusters(units: Sequence[Unit], adjacency: sp.spmatrix | str = "auto",
                   max_tokens: int = 4096, knn_k: int = 20, knn_threshold: float = 0.1,
                   bm25_config: dict | None = None,
                   separator: str = "\n\n") -> tuple[list[Unit], Clustering]:
    """Cluster documents and return one cluster :class:`Unit` per cluster.

    Args:
        units: The documents.
        adjacency: A sparse matrix, or ``"links"`` (metadata links), ``"bm25"`` (BM25 kNN), or
            ``"auto"``: links when any document has ``metadata["links"]``, else BM25 kNN.
        max_tokens: Maximum cluster size S (whitespace tokens).
        knn_k: Neighbours per document in the BM25 kNN graph (tuned on SciFact train qrels).
        knn_threshold: Minimum normalised BM25 similarity of an edge (tuned likewise).
        bm25_config: Tokenizer/BM25 settings for the kNN index.
        separator: Joins member texts into the cluster text.

    Cluster units have ``level="cluster"``, ``metadata["members"]`` (document ids, merge order)
    and ``metadata["n_tokens"]``.
    """
    units = list(units)
    if not units:
        raise ValueError("cannot cluster an empty corpus; pass at least one document.")
    check_unique_ids(units)
    if isinstance(adjacency, str):
        mode = adjacency
        if mode == "auto":
            mode = "links" if any(u.metadata.get("links") for u in units) else "bm25"
        if mode == "links":
            adj = link_adjacency(units)
        elif mode == "bm25":
            from funnel_core.bm25 import BM25Index

            adj = bm25_knn_adjacency(BM25Index(**(bm25_config or {})).index(units), k=knn_k,
                                     threshold=knn_threshold)
        else:
            raise ValueError(f"adjacency must be a sparse matrix, 'auto', 'links' or 'bm25'; got {adjacency!r}.")
    else:
        adj = adjacency
    sizes = [count_tokens(u.text) for u in units]
    clustering = cluster_documents(adj, sizes, max_tokens=max_tokens)
    clusters = []
    for c, mem in enumerate(clustering.members):
        docs = [units[i] for i in mem]
        clusters.append(Unit(id=f"cluster-{c}", text=separator.join(d.text for d in docs),
                             metadata={"members": [d.id for d in docs],
                                       "n_tokens": clustering.sizes[c]},
                             level="cluster"))
    return clusters, clustering
