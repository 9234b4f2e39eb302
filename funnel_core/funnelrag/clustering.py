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
  highest-weighted terms; neighbours are the top ``k`` (ties: lower index) with a score
  normalised by the self-score at or above ``threshold``. Rows are computed in blocks by the
  pure function :func:`knn_block` (a compiled term-at-a-time kernel when numba is installed,
  else one scipy sparse product per block; both give the same matrix), so blocks can be
  sharded across processes and stacked. The work is the summed posting length of the query
  terms: for a fixed vocabulary it grows ~n per document, so ~n^2 in all;
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
    "LINKS_KEY",
    "has_links",
    "link_adjacency",
    "bm25_knn_adjacency",
    "bm25_weight_matrix",
    "knn_block",
    "knn_adjacency_from_weights",
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


def _without_diagonal_and_zeros(a: sp.csr_matrix) -> sp.csr_matrix:
    """``a`` without its diagonal and explicit zeros, entries kept in order (what ``setdiag(0)``
    then ``eliminate_zeros()`` give, without scipy's slow diagonal assignment)."""
    rows = np.repeat(np.arange(a.shape[0]), np.diff(a.indptr))
    keep = (a.indices != rows) & (a.data != 0)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows[keep], minlength=a.shape[0]))])
    return sp.csr_matrix((a.data[keep], a.indices[keep], indptr), shape=a.shape)


def _binary_symmetric(adj: sp.spmatrix) -> sp.csr_matrix:
    a = sp.csr_matrix(adj, dtype=np.float64)
    return _without_diagonal_and_zeros(a.maximum(a.T).tocsr())


def local_clustering_coefficient(adj: sp.spmatrix, chunk_size: int = 16384) -> np.ndarray:
    """Local clustering coefficient of every node of an undirected graph (weights ignored).

    ``C(v) = 2 T(v) / (deg(v) (deg(v) - 1))`` with ``T(v)`` the triangles through ``v``, computed
    by a compiled neighbour-marking count when numba is installed, else as
    ``((A @ A) * A).sum(1) / 2`` on the sparse binary adjacency, ``chunk_size`` rows of ``A @ A``
    at a time (the whole product has ~n * deg^2 entries: ~10 GB at 1M documents).
    """
    check_positive_int(chunk_size, "chunk_size")
    return _clustering_coefficient(_binary_symmetric(adj), chunk_size)


def _clustering_coefficient(a: sp.csr_matrix, chunk_size: int = 16384) -> np.ndarray:
    """:func:`local_clustering_coefficient` of a graph already made symmetric, without loops."""
    a = sp.csr_matrix((np.ones(len(a.data), dtype=np.float32), a.indices, a.indptr),
                      shape=a.shape)  # path counts are exact small integers
    n = a.shape[0]
    deg = np.diff(a.indptr).astype(np.float64)
    try:
        from funnel_core.funnelrag._clustering_numba import triangles_kernel
    except ImportError:  # no numba: the sparse product, in row chunks
        tri = np.zeros(n, dtype=np.float64)
        for start in range(0, n, chunk_size):
            rows = a[start:start + chunk_size]
            tri[start:start + chunk_size] = np.asarray((rows @ a).multiply(rows).sum(axis=1)).ravel() / 2.0
    else:
        tri = triangles_kernel(a.indptr.astype(np.int64), a.indices.astype(np.int64), n)
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
    a = _binary_symmetric(adj)
    cc = _clustering_coefficient(a)
    order = np.lexsort((np.arange(n), -cc))  # by coefficient desc, then index

    out_members = _merge(a, order, sizes_arr, max_tokens, grow_absorbed)
    out_sizes = [int(sizes_arr[m].sum()) for m in out_members]
    return Clustering(members=out_members, sizes=out_sizes, seconds=time.perf_counter() - t0,
                      stats={"n_documents": n, "n_clusters": len(out_members),
                             "n_edges": int(a.nnz // 2), "max_tokens": max_tokens})


def _merge(a: sp.csr_matrix, order: np.ndarray, sizes: np.ndarray, max_tokens: int,
           grow_absorbed: bool) -> list[list[int]]:
    """Steps 2-3 of Algorithm 1 over the visiting ``order``: the clusters' member lists (merge
    order), ordered by their lowest member. Compiled when numba is installed; the same result
    as :func:`_merge_python` (tested on random graphs with tied weights)."""
    try:
        from funnel_core.funnelrag._clustering_numba import algorithm1_kernel, cluster_lists
    except ImportError:
        return _merge_python(a, order, sizes, max_tokens, grow_absorbed)
    head, nxt, alive = algorithm1_kernel(a.indptr.astype(np.int64), a.indices.astype(np.int64),
                                         a.data.astype(np.float64), order.astype(np.int64),
                                         sizes.astype(np.int64), int(max_tokens), bool(grow_absorbed))
    flat, offsets, lowest = cluster_lists(head, nxt, np.flatnonzero(alive))
    groups = np.split(flat, offsets[1:-1])
    return [groups[c].tolist() for c in np.argsort(lowest, kind="stable").tolist()]


def _merge_python(a: sp.csr_matrix, order: np.ndarray, sizes: np.ndarray, max_tokens: int,
                  grow_absorbed: bool) -> list[list[int]]:
    n = len(sizes)
    cluster_of = np.arange(n, dtype=np.int64)
    members: dict[int, list[int]] = {i: [i] for i in range(n)}
    tokens = sizes.tolist()  # tokens per cluster id; new clusters get ids n, n+1, ...
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
    return [members[c] for c in live]


#: The metadata key whose list of linked ids or titles steers clustering (``adjacency="auto"``
#: or ``"links"``). It is ours (``funnel_`` prefix): a user's own ``links`` key (web loaders write
#: URLs there) changes nothing; pass ``link_adjacency(units, key="links")`` to use it on purpose.
LINKS_KEY = "funnel_links"


def has_links(units: Sequence[Unit]) -> bool:
    """Whether any unit lists links under :data:`LINKS_KEY` (what ``adjacency="auto"`` checks)."""
    return any(u.metadata.get(LINKS_KEY) for u in units)


def link_adjacency(units: Sequence[Unit], key: str = LINKS_KEY, title_key: str = "title") -> sp.csr_matrix:
    """Adjacency from explicit links: ``unit.metadata[key]`` lists linked ids or titles
    (``key`` is :data:`LINKS_KEY`, ``"funnel_links"``, unless named; a target is matched to a
    unit's id, else to the ``title_key`` of a unit)."""
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


def bm25_weight_matrix(index: Any) -> sp.csr_matrix:
    """The (documents x terms) BM25 weight matrix of a :class:`~funnel_core.bm25.BM25Index`.

    float32 CSR with sorted column indices; the columns are in sorted-term order (bm25s numbers
    terms in a hash-seed-dependent order), so every tie-break, and hence the kNN graph, is the
    same in every process.
    """
    s = index._retriever.scores
    n = int(s["num_docs"])
    w = sp.csc_matrix((np.asarray(s["data"], dtype=np.float32), s["indices"], s["indptr"]),
                      shape=(n, len(s["indptr"]) - 1))
    vocab = index._retriever.vocab_dict
    order = [vocab[t] for t in sorted(vocab) if vocab[t] < w.shape[1]]
    if order != list(range(w.shape[1])):  # indexes built from counts are already in term order
        w = w[:, order]
    w = w.tocsr()
    w.sort_indices()
    return w


def knn_backend(backend: str) -> str:
    if backend not in ("auto", "numba", "scipy"):
        raise ValueError(f"backend must be 'auto', 'numba' or 'scipy', got {backend!r}.")
    if backend == "scipy":
        return backend
    try:
        import numba  # noqa: F401
    except ImportError:
        if backend == "numba":
            raise ImportError("backend='numba' needs numba: pip install 'funnel-rag[fast]', or use "
                              "backend='scipy'.") from None
        return "scipy"
    return "numba"


def knn_tile(l2_bytes: int | None = None) -> int:
    """Documents per accumulator tile of the compiled kNN kernel: float64 scores filling a quarter
    of the per-core L2 cache (:func:`funnel_core.hardware.l2_cache_bytes`), a power of two in
    [4096, 65536]; 16,384 where the cache size is unknown. On the 1M-document benchmark corpus
    (512 KiB L2, 2 threads) a quarter beat a half and the whole L2."""
    if l2_bytes is None:
        from funnel_core.hardware import l2_cache_bytes

        l2_bytes = l2_cache_bytes()
    if not l2_bytes:
        return 16384
    entries = max(1, l2_bytes // 4 // 8)
    return int(min(65536, max(4096, 1 << (entries.bit_length() - 1))))


def knn_block(w: sp.csr_matrix, start: int, stop: int, *, k: int = 20, threshold: float = 0.1,
              query_terms: int = 16, postings: sp.csc_matrix | None = None,
              backend: str = "auto") -> sp.csr_matrix:
    """Directed BM25 kNN rows ``start:stop`` of :func:`bm25_knn_adjacency` (a pure function).

    Document ``i``'s query is its ``query_terms`` highest-weighted terms (ties: lower column);
    its score for document ``j`` is ``sum(w[j, t] for t in query)`` (float64, exact for float32
    weights of BM25's range, so independent of summation order); its self-score is its score for
    itself. Its neighbours are the documents ``j != i`` with a non-zero score whose score divided
    by the self-score is at least ``threshold``, the ``k`` highest (ties: lower index), with edge
    weight ``min(score / self-score, 1)``. Rows with no terms or a non-positive self-score are empty.

    Args:
        w: (n, terms) weight matrix, CSR with sorted indices (:func:`bm25_weight_matrix`).
        start: First row to compute; any split of ``range(n)`` into blocks gives the same
            rows, so blocks can be computed anywhere (threads, processes, a cluster) and stacked
            with ``scipy.sparse.vstack``.
        stop: One past the last row to compute.
        postings: ``w.tocsc()``, passed in to avoid recomputing it per block.
        backend: ``"numba"`` (compiled, term at a time, no score block materialised, all
            cores), ``"scipy"`` (one sparse product per block), or ``"auto"`` (numba if installed).
            Both return the same matrix.

    Returns:
        ``(stop - start, n)`` float64 CSR matrix; row ``r`` holds document ``start + r``'s edges.
    """
    check_knn_args(k, threshold, query_terms)
    n = w.shape[0]
    if not 0 <= start <= stop <= n:
        raise ValueError(f"need 0 <= start <= stop <= {n}, got start={start}, stop={stop}.")
    if not w.has_sorted_indices:
        w = w.copy()
        w.sort_indices()
    if postings is None:
        postings = w.tocsc()
    if knn_backend(backend) == "numba":
        return _knn_block_numba(w, postings, start, stop, k, float(threshold), query_terms)
    return _knn_block_scipy(w, postings, start, stop, k, float(threshold), query_terms)


def check_knn_args(k: int, threshold: float, query_terms: int) -> None:
    check_positive_int(k, "k")
    check_positive_int(query_terms, "query_terms")
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold is a share of the self-score in [0, 1], got {threshold!r}.")


def _query_matrix(sub: sp.csr_matrix, m: int) -> sp.csr_matrix:
    """Binary (rows x terms) matrix of each row's top-``m`` weighted terms (ties: lower column)."""
    counts = np.diff(sub.indptr)
    row = np.repeat(np.arange(sub.shape[0]), counts)
    order = np.lexsort((sub.indices, -sub.data, row))  # indices are sorted, so ties -> lower column
    rank = np.arange(len(order)) - sub.indptr[row[order]]
    keep = np.sort(order[rank < m])
    q = sp.csr_matrix((np.ones(len(keep)), (row[keep], sub.indices[keep])), shape=sub.shape)
    return q


def _block_from_candidates(B: int, n: int, start: int, row: np.ndarray, col: np.ndarray,
                           score: np.ndarray, self_score: np.ndarray, k: int, threshold: float) -> sp.csr_matrix:
    ok = (self_score[row] > 0) & (col != start + row) & (score != 0)
    row, col, score = row[ok], col[ok], score[ok]
    norm = score / self_score[row]
    ok = norm >= threshold
    row, col, norm = row[ok], col[ok], norm[ok]
    order = np.lexsort((col, -norm, row))
    row, col, norm = row[order], col[order], norm[order]
    first = np.searchsorted(row, np.arange(B))
    rank = np.arange(len(row)) - first[row]
    top = rank < k
    row, col, norm = row[top], col[top], norm[top]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(row, minlength=B))])
    return sp.csr_matrix((np.minimum(norm, 1.0), col, indptr), shape=(B, n))


def _knn_block_scipy(w, postings, start, stop, k, threshold, m):
    n = w.shape[0]
    B = stop - start
    if B == 0:
        return sp.csr_matrix((0, n))
    sub = w[start:stop]
    q = _query_matrix(sub, m)
    self_score = np.asarray(q.multiply(sub.astype(np.float64)).sum(axis=1)).ravel()
    wt = sp.csr_matrix((postings.data.astype(np.float64), postings.indices, postings.indptr),
                       shape=(w.shape[1], n))  # = w.T in float64: exact sums
    scores = (q @ wt).tocsr()
    row = np.repeat(np.arange(B), np.diff(scores.indptr))
    return _block_from_candidates(B, n, start, row, scores.indices.astype(np.int64), scores.data,
                                  self_score, k, threshold)


def _knn_block_numba(w, postings, start, stop, k, threshold, m):
    import numba

    n = w.shape[0]
    B = stop - start
    if B == 0:
        return sp.csr_matrix((0, n))
    from funnel_core.funnelrag._clustering_numba import knn_block_kernel as kernel

    if not postings.has_sorted_indices:  # the kernel walks each posting list in document order
        postings = postings.sorted_indices()

    out_cols = np.zeros((B, k), dtype=np.int64)
    out_vals = np.zeros((B, k), dtype=np.float64)
    out_cnt = np.zeros(B, dtype=np.int64)
    nparts = max(1, min(B, 4 * numba.get_num_threads()))
    kernel(w.indptr.astype(np.int64, copy=False), w.indices, w.data, postings.indptr.astype(np.int64, copy=False),
           postings.indices, postings.data, start, stop, n, k, threshold, m, knn_tile(), nparts,
           out_cols, out_vals, out_cnt)
    keep = np.arange(k)[None, :] < out_cnt[:, None]
    indptr = np.concatenate([[0], np.cumsum(out_cnt)])
    return sp.csr_matrix((out_vals[keep], out_cols[keep], indptr), shape=(B, n))


def bm25_knn_adjacency(index: Any, k: int = 20, threshold: float = 0.1, query_terms: int = 16,
                       chunk_size: int = 4096, backend: str = "auto") -> sp.csr_matrix:
    """BM25 k-nearest-neighbour graph over the units of a :class:`~funnel_core.bm25.BM25Index`.

    Each document's query is its ``query_terms`` highest-BM25-weight terms; a neighbour's score
    (the BM25 score of that query, ``Q @ W.T``) is normalised by the document's self-score, so
    ``threshold`` is in [0, 1]; the ``k`` best neighbours at or above it are kept (ties: lower
    index), edge weight = that normalised score; the graph is symmetrised (maximum). Rows are
    computed in blocks of ``chunk_size`` by :func:`knn_block` (see there for ``backend``).
    """
    check_knn_args(k, threshold, query_terms)
    w = bm25_weight_matrix(index)
    return knn_adjacency_from_weights(w, k=k, threshold=threshold, query_terms=query_terms,
                                      chunk_size=chunk_size, backend=backend)


def knn_adjacency_from_weights(w: sp.csr_matrix, k: int = 20, threshold: float = 0.1,
                               query_terms: int = 16, chunk_size: int = 4096,
                               backend: str = "auto") -> sp.csr_matrix:
    """:func:`bm25_knn_adjacency` from a (documents x terms) weight matrix: every block of
    :func:`knn_block`, stacked and symmetrised. Returns a float64 CSR matrix, int32 indices."""
    check_knn_args(k, threshold, query_terms)
    check_positive_int(chunk_size, "chunk_size")
    backend = knn_backend(backend)
    if not w.has_sorted_indices:
        w = w.copy()
        w.sort_indices()
    n = w.shape[0]
    postings = w.tocsc()
    blocks = []
    for start in range(0, n, chunk_size):
        stop = min(n, start + chunk_size)
        if backend == "numba":
            blocks.append(_knn_block_numba(w, postings, start, stop, k, float(threshold), query_terms))
        else:
            blocks.append(knn_block(w, start, stop, k=k, threshold=threshold, query_terms=query_terms,
                                    postings=postings, backend="scipy"))
    del postings
    adj = sp.vstack(blocks, format="csr") if blocks else sp.csr_matrix((n, n))
    del blocks
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
        adjacency: A sparse matrix, or ``"links"`` (metadata ``funnel_links``), ``"bm25"``
            (BM25 kNN), or ``"auto"``: links when any document has ``metadata["funnel_links"]``
            (:data:`LINKS_KEY`), else BM25 kNN. A user's ``links`` key is not read; build
            ``link_adjacency(units, key="links")`` to use it.
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
            mode = "links" if has_links(units) else "bm25"
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
