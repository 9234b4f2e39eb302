"""Mix-of-Granularity-Graph (MoGG, section 3.3): documents as a graph of small sentence nodes.

Documents are split into nodes of 1-2 sentences. Each node is linked to its ``k_graph`` most
BM25-similar nodes (anywhere in the corpus) whose *normalised* similarity reaches ``t_graph``;
the normalised similarity of node ``j`` to node ``i`` is ``bm25(text_i -> text_j) /
bm25(text_i -> text_i)`` (a node's score against itself is the largest it can get, so the ratio is
in [0, 1] up to BM25's length normalisation), and edges are made undirected.

Granularity becomes a hopping range: the level-``j`` snippet of node ``i`` is every node within
``j`` hops of ``i`` (``j = 1 .. n_gra``), each node once, in document order. Distant but related
sentences therefore come back together.

The similarity graph is one sparse matrix product ``Q @ W`` (query-term counts of every node
times the BM25 term-weight matrix that ``bm25s`` precomputes), done in row blocks with a
vectorised top-k per block, so it scales to 100k nodes without Python loops over node pairs.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Iterable, Sequence

import numpy as np
import scipy.sparse as sp

from funnel_core.bm25 import BM25Index
from funnel_core.errors import check_positive_int, check_probability
from funnel_core.granularity.levels import GranularityStructure, as_documents, level_name
from funnel_core.settings import Settings
from funnel_core.text import split_sentences
from funnel_core.units import SCORE_PREFIX, Unit, check_unique_ids

__all__ = ["GraphGranularityBuilder", "GranularityGraph", "bm25_knn_graph"]


def _term_weight_matrix(index: BM25Index) -> tuple[sp.csr_matrix, dict[str, int], np.ndarray | None]:
    """The ``(vocab, n_docs)`` BM25 weight matrix bm25s precomputed, its vocabulary and the
    non-occurrence scores (bm25l / bm25+ only)."""
    index._require_built()
    retr = index._retriever
    s = retr.scores
    n_vocab = len(s["indptr"]) - 1
    w = sp.csr_matrix((s["data"], s["indices"], s["indptr"]), shape=(n_vocab, int(s["num_docs"])))
    return w, retr.vocab_dict, getattr(retr, "nonoccurrence_array", None)


def bm25_knn_graph(index: BM25Index, k_graph: int = 3, t_graph: float = 0.3,
                   block_size: int = 512, max_df: float | None = None) -> sp.csr_matrix:
    """Directed BM25 kNN graph over the units of ``index``, using each unit's text as a query.

    Returns a ``(n, n)`` CSR matrix whose row ``i`` holds at most ``k_graph`` entries: the units
    ``j != i`` with the largest normalised score ``bm25(i -> j) / bm25(i -> i)`` that reach
    ``t_graph`` (and are > 0). Scores are computed ``block_size`` rows at a time as a sparse
    matrix product; only pairs that share a term are ever materialised, and the top-k per row is
    a vectorised sort of the block's non-zeros.

    The cost grows with the number of node pairs that share a term, which frequent terms make
    nearly quadratic. ``max_df`` (a fraction in (0, 1], default ``None`` = exact) leaves terms that
    occur in more than ``max_df * n`` nodes out of the *pair* scores (they have the lowest IDF,
    so they add least); self-scores stay exact, so the normalised threshold only gets stricter.
    """
    check_positive_int(k_graph, "k_graph")
    check_probability(t_graph, "t_graph")
    check_positive_int(block_size, "block_size")
    w, vocab, nonocc = _term_weight_matrix(index)
    n = w.shape[1]
    tokens = index.tokenize([u.text for u in index.units])
    rows = np.repeat(np.arange(n), [len(t) for t in tokens])
    cols = np.fromiter((vocab.get(t, -1) for toks in tokens for t in toks), dtype=np.int64,
                       count=len(rows))
    keep = cols >= 0
    q = sp.csr_matrix((np.ones(int(keep.sum()), dtype=np.float32), (rows[keep], cols[keep])),
                      shape=(n, w.shape[0]))
    q.sum_duplicates()  # repeated query terms count repeatedly, as in bm25s.get_scores
    exact_self = None
    if max_df is not None:
        if not 0.0 < float(max_df) <= 1.0:
            raise ValueError(f"max_df must be in (0, 1] or None, got {max_df!r}.")
        exact_self = np.asarray(q.multiply(w.T.tocsr()).sum(axis=1), dtype=np.float32).ravel()
        if nonocc is not None:  # bm25l / bm25+: the self-score's constant over the full query
            exact_self = exact_self + np.asarray(q @ nonocc, dtype=np.float32).ravel()
        df = np.diff(w.indptr)
        keep_terms = (df <= max_df * n).astype(np.float32)
        q = (q @ sp.diags(keep_terms)).tocsr()
        q.eliminate_zeros()
    shift = None if nonocc is None else np.asarray(q @ nonocc, dtype=np.float32).ravel()
    k = min(k_graph, n - 1)
    out_rows, out_cols, out_vals = [], [], []
    if k >= 1:
        for b0 in range(0, n, block_size):
            b1 = min(n, b0 + block_size)
            block = (q[b0:b1] @ w).tocsr()  # sparse (rows, n): only pairs sharing a term
            block.sum_duplicates()
            rows = np.repeat(np.arange(b0, b1), np.diff(block.indptr))
            cols, vals = block.indices.astype(np.int64), block.data.astype(np.float32)
            if shift is not None:  # bm25l / bm25+: a per-query constant on every document
                vals = vals + shift[rows]
            is_self = cols == rows
            self_score = np.zeros(b1 - b0, dtype=np.float32)
            self_score[rows[is_self] - b0] = vals[is_self]
            if exact_self is not None:  # max_df: exact self-scores, the full query's constant included
                self_score = exact_self[b0:b1]
            denom = self_score[rows - b0]
            with np.errstate(divide="ignore", invalid="ignore"):
                norm = np.where(denom > 0, vals / denom, 0.0)
            ok = ~is_self & (vals > 0) & (norm > 0) & (norm >= t_graph)
            rows, cols, norm = rows[ok], cols[ok], norm[ok]
            order = np.lexsort((cols, -norm, rows))  # per row: best first, ties by position
            rows, cols, norm = rows[order], cols[order], norm[order]
            starts = np.searchsorted(rows, rows, side="left")
            top = (np.arange(len(rows)) - starts) < k  # rank within the row
            out_rows.append(rows[top])
            out_cols.append(cols[top])
            out_vals.append(np.minimum(norm[top], 1.0).astype(np.float32))
    if out_rows:
        data = (np.concatenate(out_vals), (np.concatenate(out_rows), np.concatenate(out_cols)))
        return sp.csr_matrix(data, shape=(n, n))
    return sp.csr_matrix((n, n), dtype=np.float32)


class GranularityGraph(GranularityStructure):
    """MoGG's graph: sentence nodes, undirected BM25 kNN edges, and hop-range levels.

    Attributes:
        nodes: The graph's nodes (also :attr:`finest`), in document order.
        adjacency: Symmetric ``(n, n)`` CSR matrix of edge weights (normalised BM25 similarity).
        n_gra: Number of levels; level ``j`` is the ``j``-hop neighbourhood of each node.
        build_seconds: Seconds spent building the edges (``None`` when rebuilt from units).

    Level units are built lazily (on first access to :attr:`levels`); the level-``j`` unit of node
    ``i`` has id ``"<node id>/h<j>"``, ``funnel["center_id"]``, ``funnel["node_ids"]`` and
    ``funnel["granularity"] = j``.
    """

    def __init__(self, nodes: Sequence[Unit], adjacency: sp.spmatrix, n_gra: int = 5,
                 build_seconds: float | None = None) -> None:
        self.n_gra = check_positive_int(n_gra, "n_gra (number of hop ranges)")
        self.nodes = self.finest = list(nodes)
        if not self.nodes:
            raise ValueError("a granularity graph needs at least one node.")
        n = len(self.nodes)
        if adjacency.shape != (n, n):
            raise ValueError(f"adjacency has shape {adjacency.shape}, expected ({n}, {n}).")
        adjacency = sp.csr_matrix(adjacency, dtype=np.float32)
        self.adjacency = adjacency.maximum(adjacency.T).tocsr()
        self.adjacency.setdiag(0)
        self.adjacency.eliminate_zeros()
        self.build_seconds = build_seconds
        self._reach: list[sp.csr_matrix] | None = None
        self._levels: list[list[Unit]] | None = None
        if self.adjacency.nnz == 0 and n > 1:
            warnings.warn("the granularity graph has no edges (no pair of nodes reaches t_graph); "
                          "every hop range is the node alone. Lower t_graph or raise k_graph.",
                          stacklevel=2)

    @property
    def n_edges(self) -> int:
        """Number of undirected edges."""
        return int(self.adjacency.nnz // 2)

    def reach(self, hops: int) -> sp.csr_matrix:
        """Boolean ``(n, n)`` matrix (dtype ``bool``): node ``c`` is within ``hops`` hops of node
        ``r``."""
        self._check_level(hops)
        if self._reach is None:
            # boolean products (sums are "or"): a count of paths in a small integer type wraps
            # around, and a count of exactly 256 in int8 became 0 and dropped a reachable node
            step = ((self.adjacency != 0) + sp.identity(len(self.nodes), dtype=np.bool_)).tocsr()
            reach = [step]
            for _ in range(1, self.n_gra):
                reach.append((reach[-1] @ step).tocsr())
            self._reach = reach
        return self._reach[hops - 1]

    def neighbourhood(self, index: int, hops: int) -> np.ndarray:
        """Indices of the nodes within ``hops`` hops of node ``index``, in document order."""
        r = self.reach(hops)
        return np.sort(r.indices[r.indptr[index]:r.indptr[index + 1]])

    @property
    def levels(self) -> list[list[Unit]]:  # type: ignore[override]
        if self._levels is None:
            levels = []
            for j in range(1, self.n_gra + 1):
                level = []
                for i, node in enumerate(self.nodes):
                    members = self.neighbourhood(i, j)
                    ours = {k: v for k, v in node.funnel.items()
                            if k not in ("graph_neighbors", "graph_weights")
                            and not k.startswith(SCORE_PREFIX)}
                    ours.update(granularity=j, center_id=node.id,
                                node_ids=[self.nodes[m].id for m in members])
                    level.append(Unit(id=f"{node.id}/h{j}",
                                      text=" ".join(self.nodes[m].text for m in members),
                                      metadata=dict(node.metadata), level=level_name(j),
                                      funnel=ours))
                levels.append(level)
            self._levels = levels
        return self._levels

    def covers(self, level: int, index: int) -> np.ndarray:
        return self.neighbourhood(index, level)

    def container_index(self, finest_index: int, level: int) -> int:
        self._check_level(level)
        return int(finest_index)

    @classmethod
    def from_units(cls, nodes: Sequence[Unit], n_gra: int = 5) -> "GranularityGraph":
        """Rebuild a graph from nodes that carry ``funnel["graph_neighbors"]`` (ids).

        Nodes are put in document order by ``(doc_index, position)``; neighbours missing from
        ``nodes`` are ignored.
        """
        nodes = sorted(nodes, key=lambda u: (u.funnel.get("doc_index", 0),
                                             u.funnel.get("position", 0)))
        check_unique_ids(nodes)
        pos = {u.id: i for i, u in enumerate(nodes)}
        rows, cols, vals = [], [], []
        for i, u in enumerate(nodes):
            nbrs = u.funnel.get("graph_neighbors")
            if nbrs is None:
                raise ValueError(f"node {u.id!r} has no funnel['graph_neighbors']; build the nodes "
                                 "with GraphGranularityBuilder / GraphGranularityNodeParser.")
            weights = u.funnel.get("graph_weights") or [1.0] * len(nbrs)
            for nb, wt in zip(nbrs, weights):
                if nb in pos:
                    rows.append(i)
                    cols.append(pos[nb])
                    vals.append(float(wt))
        adj = sp.csr_matrix((np.asarray(vals, dtype=np.float32), (rows, cols)),
                            shape=(len(nodes), len(nodes)))
        return cls(nodes, adj, n_gra=n_gra)


class GraphGranularityBuilder(Settings):
    """Build a :class:`GranularityGraph` from documents (MoGG section 3.3).

    Args:
        sentences_per_node: Sentences per node (the paper uses 1-2; the last node of a document
            may hold fewer).
        n_gra: Number of hop ranges (levels 1..n_gra).
        k_graph: Edges per node (its most similar nodes).
        t_graph: Minimum normalised BM25 similarity in [0, 1] for an edge.
        block_size: Rows per block of the sparse similarity product.
        max_df: Leave terms in more than this fraction of nodes out of pair scores (faster on
            large corpora, approximate); ``None`` (default) is exact. See :func:`bm25_knn_graph`.
        bm25: Keyword arguments for the :class:`~funnel_core.bm25.BM25Index` used for edges.
    """

    def __init__(self, *, sentences_per_node: int = 2, n_gra: int = 5, k_graph: int = 3,
                 t_graph: float = 0.3, block_size: int = 512, max_df: float | None = None,
                 bm25: dict[str, Any] | None = None) -> None:
        self.sentences_per_node = check_positive_int(sentences_per_node, "sentences_per_node")
        self.n_gra = check_positive_int(n_gra, "n_gra (number of hop ranges)")
        self.k_graph = check_positive_int(k_graph, "k_graph")
        self.t_graph = check_probability(t_graph, "t_graph")
        self.block_size = check_positive_int(block_size, "block_size")
        if max_df is not None and not 0.0 < float(max_df) <= 1.0:
            raise ValueError(f"max_df must be in (0, 1] or None, got {max_df!r}.")
        self.max_df = max_df
        self.bm25 = dict(bm25 or {})

    def nodes(self, documents: Iterable[Unit | str]) -> list[Unit]:
        """Split documents into sentence nodes (``funnel``: doc_id, doc_index, position; the
        document's metadata copied)."""
        docs = as_documents(documents)
        if not docs:
            raise ValueError("cannot build a graph from an empty corpus; pass at least one document.")
        out = []
        step = self.sentences_per_node
        for di, doc in enumerate(docs):
            sents = split_sentences(doc.text)
            for p, s in enumerate(range(0, len(sents), step)):
                out.append(Unit(id=f"{doc.id}/s{p}", text=" ".join(sents[s:s + step]),
                                metadata=dict(doc.metadata), level="graph-node",
                                funnel=dict(doc_id=doc.id, doc_index=di, position=p)))
        if not out:
            raise ValueError("every document is empty (no sentences); nothing to build a graph from.")
        return out

    def build(self, documents: Iterable[Unit | str]) -> GranularityGraph:
        """Split ``documents`` into nodes and link them; see :meth:`build_from_nodes`."""
        return self.build_from_nodes(self.nodes(documents))

    def build_from_nodes(self, nodes: Sequence[Unit]) -> GranularityGraph:
        """Link ready-made nodes; writes ``graph_neighbors``/``graph_weights`` into their
        bookkeeping (``Unit.funnel``).

        Nodes whose text has no indexable token get no edges. ``build_seconds`` on the result is
        the time for BM25 indexing plus the kNN edges.
        """
        nodes = [u.copy() for u in nodes]
        if not nodes:
            raise ValueError("cannot build a graph from no nodes.")
        t0 = time.perf_counter()
        index = BM25Index(**self.bm25)
        if any(index.tokenize([u.text for u in nodes])):
            index.index(nodes)
            directed = bm25_knn_graph(index, self.k_graph, self.t_graph, self.block_size,
                                      self.max_df)
        else:
            directed = sp.csr_matrix((len(nodes), len(nodes)), dtype=np.float32)
        seconds = time.perf_counter() - t0
        graph = GranularityGraph(nodes, directed, n_gra=self.n_gra, build_seconds=seconds)
        adj = graph.adjacency
        for i, u in enumerate(graph.nodes):
            lo, hi = adj.indptr[i], adj.indptr[i + 1]
            order = np.argsort(-adj.data[lo:hi], kind="stable")
            u.funnel["graph_neighbors"] = [nodes[c].id for c in adj.indices[lo:hi][order]]
            u.funnel["graph_weights"] = [float(v) for v in adj.data[lo:hi][order]]
        return graph
