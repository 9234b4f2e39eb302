"""FunnelRAG Algorithm 1 and the adjacency builders; the clustered BM25 index."""

import numpy as np
import pytest
import scipy.sparse as sp

from funnel_core import BM25Index, PersistError, Unit
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index, ClusteredBM25Retrieve
from funnel_core.funnelrag.clustering import (
    bm25_knn_adjacency,
    build_clusters,
    cluster_documents,
    embedding_knn_adjacency,
    link_adjacency,
    local_clustering_coefficient,
)


def _graph(edges, n):
    r, c = zip(*edges)
    a = sp.csr_matrix((np.ones(len(r)), (r, c)), shape=(n, n))
    return a.maximum(a.T)


def test_local_clustering_coefficient_on_a_known_graph():
    # triangle 0-1-2 plus a pendant 3 attached to 2
    cc = local_clustering_coefficient(_graph([(0, 1), (1, 2), (0, 2), (2, 3)], 4))
    assert cc.tolist() == pytest.approx([1.0, 1.0, 1 / 3, 0.0])


def test_algorithm1_merges_neighbours_within_the_size_limit():
    # two triangles joined by one edge; every document has 10 tokens
    a = _graph([(0, 1), (1, 2), (0, 2), (3, 4), (4, 5), (3, 5), (2, 3)], 6)
    res = cluster_documents(a, [10] * 6, max_tokens=30)
    assert sorted(sorted(m) for m in res.members) == [[0, 1, 2], [3, 4, 5]]
    assert res.sizes == [30, 30]
    # a larger S merges everything reachable from the first seed's neighbourhood
    big = cluster_documents(a, [10] * 6, max_tokens=1000)
    assert sum(len(m) for m in big.members) == 6 and max(big.sizes) <= 1000


def test_algorithm1_is_a_partition_deterministic_and_respects_s():
    rng = np.random.default_rng(0)
    n = 300
    a = sp.random(n, n, density=0.03, random_state=1, format="csr")
    sizes = rng.integers(50, 400, size=n)
    r1 = cluster_documents(a, sizes, max_tokens=1000)
    r2 = cluster_documents(a, sizes, max_tokens=1000)
    assert r1.members == r2.members
    flat = sorted(i for m in r1.members for i in m)
    assert flat == list(range(n))
    assert all(s <= 1000 or len(m) == 1 for s, m in zip(r1.sizes, r1.members))
    assert len(r1.members) < n / 2  # it does merge


def test_oversized_document_stays_alone():
    a = _graph([(0, 1)], 2)
    res = cluster_documents(a, [5000, 10], max_tokens=4096)
    assert sorted(res.members) == [[0], [1]]


def test_link_adjacency_by_id_and_title():
    units = [Unit(id="a", text="x", metadata={"title": "Alpha", "links": ["Beta"]}),
             Unit(id="b", text="y", metadata={"title": "Beta"}),
             Unit(id="c", text="z", metadata={"links": ["a", "missing"]})]
    adj = link_adjacency(units, key="links").toarray()  # a key named explicitly
    assert adj[0, 1] == adj[1, 0] == 1 and adj[2, 0] == adj[0, 2] == 1 and adj[1, 2] == 0


def test_bm25_knn_adjacency_is_symmetric_and_thresholded(corpus_units):
    idx = BM25Index().index(corpus_units)
    adj = bm25_knn_adjacency(idx, k=3, threshold=0.05)
    assert (adj != adj.T).nnz == 0 and adj.diagonal().sum() == 0
    pos = {u.id: i for i, u in enumerate(corpus_units)}
    assert adj[pos["d0"], pos["d2"]] > 0  # both about Paris, France
    assert adj.data.max() <= 1.0
    assert bm25_knn_adjacency(idx, k=3, threshold=1.0).nnz == 0


def test_embedding_knn_adjacency():
    emb = np.array([[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], dtype=np.float32)
    adj = embedding_knn_adjacency(emb, k=1, threshold=0.5).toarray()
    assert adj[0, 1] > 0 and adj[2, 3] > 0 and adj[0, 2] == 0


def test_build_clusters_units(corpus_units):
    clusters, res = build_clusters(corpus_units, max_tokens=40, knn_k=3, knn_threshold=0.05)
    members = [m for c in clusters for m in c.metadata["members"]]
    assert sorted(members) == sorted(u.id for u in corpus_units)
    assert all(c.level == "cluster" and c.metadata["n_tokens"] <= 40 or len(c.metadata["members"]) == 1
               for c in clusters)
    with pytest.raises(ValueError, match="empty corpus"):
        build_clusters([])
    with pytest.raises(ValueError, match="adjacency must be"):
        build_clusters(corpus_units, adjacency="nonsense")


@pytest.fixture
def clustered(corpus_units):
    return ClusteredBM25Index(max_tokens=40, knn_k=3, knn_threshold=0.05).index(corpus_units)


def test_clustered_search_opens_clusters(clustered):
    docs = clustered.search("Eiffel Tower Paris", k=1)
    assert "d2" in {d.id for d in docs}
    assert all(d.level == "document" and d.funnel["cluster_rank"] == 0 for d in docs)
    assert len({d.funnel["cluster_id"] for d in docs}) == 1
    clusters = clustered.search("Eiffel Tower Paris", k=2, return_clusters=True)
    assert all(c.level == "cluster" for c in clusters) and len(clusters) <= 2
    assert len(clustered.search("Eiffel Tower Paris", k=2, max_documents=1)) == 1


def test_clustered_filter_never_returns_filtered_documents(clustered):
    docs = clustered.search("Paris capital tower playwright", k=5, filter={"topic": "lit"})
    assert docs and all(d.metadata["topic"] == "lit" for d in docs)


def test_clustered_save_load(tmp_path, clustered):
    clustered.save(tmp_path / "c")
    loaded = ClusteredBM25Index.load(tmp_path / "c")
    q = "Shakespeare Hamlet"
    assert [(d.id, d.score) for d in loaded.search(q, k=3)] == [(d.id, d.score) for d in clustered.search(q, k=3)]
    with pytest.raises(PersistError, match="no clustered BM25 index"):
        ClusteredBM25Index.load(tmp_path / "missing")


def test_clustered_stage_in_a_funnel(clustered):
    from funnel_core import LaterChunking

    funnel = ClusteredBM25Retrieve(clustered, k=2) >> LaterChunking(words=5) % 3
    res = funnel.search("Eiffel Tower", answers=["Eiffel"])
    assert len(res.units) == 3 and res.units[0].parent_id is not None
    assert res.trace.stages[0].level == "document"


@pytest.mark.slow  # over the fast tier's 2 s on a quiet machine (load 0.5)
def test_clustering_is_identical_across_processes(tmp_path):
    """bm25s numbers terms in hash-seed order; the graph must not depend on it."""
    import os
    import subprocess
    import sys

    code = ("from conftest import CORPUS; from funnel_core import Unit; "
            "from funnel_core.funnelrag.clustering import build_clusters; "
            "us=[Unit(id=i, text=t) for i, t, _ in CORPUS]*1; "
            "cs,_=build_clusters(us, max_tokens=30, knn_k=3, knn_threshold=0.01); "
            "print([c.metadata['members'] for c in cs])")
    outs = set()
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=os.pathsep.join(["tests", "."]))
        outs.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                check=True).stdout)
    assert len(outs) == 1


# -- the blocked BM25 kNN graph against a brute-force reference ------------------------------------

def _reference_knn(w_dense: np.ndarray, k: int, threshold: float, m: int) -> np.ndarray:
    """Plain dense reference: every document's query is its top-m weighted terms (ties: lower
    column); scores = W @ q; neighbours j != i with a non-zero score / self-score >= threshold,
    the k best (ties: lower index); weight min(norm, 1); symmetrised with the maximum."""
    n, v = w_dense.shape
    out = np.zeros((n, n))
    for i in range(n):
        nz = [c for c in range(v) if w_dense[i, c] != 0]
        if not nz:
            continue
        ranked = sorted(nz, key=lambda c: (-w_dense[i, c], c))[:m]
        q = np.zeros(v)
        q[ranked] = 1.0
        scores = w_dense.astype(np.float64) @ q
        self_score = scores[i]
        if self_score <= 0:
            continue
        cands = [(-(scores[j] / self_score), j) for j in range(n)
                 if j != i and scores[j] != 0 and scores[j] / self_score >= threshold]
        for negv, j in sorted(cands)[:k]:
            out[i, j] = min(-negv, 1.0)
    return np.maximum(out, out.T)


def _random_words_corpus(n=160, seed=0):
    rng = np.random.default_rng(seed)
    words = [f"w{chr(97 + a)}{chr(97 + b)}" for a in range(6) for b in range(6)]  # 36 words
    docs = []
    for i in range(n):
        topic = rng.integers(4)
        pool = words[topic * 8: topic * 8 + 12]
        docs.append(" ".join(rng.choice(pool, size=rng.integers(3, 9)).tolist()))
    docs[7] = docs[3]  # exact duplicates: equal scores, ties broken by index
    docs[11] = docs[3]
    return [Unit(id=str(i), text=t) for i, t in enumerate(docs)]


@pytest.fixture(scope="module")
def knn_index():
    return BM25Index(stemmer=None, stopwords=None).index(_random_words_corpus())


def _weights_by_term_queries(index) -> np.ndarray:
    """W rebuilt column by column from one-term BM25 queries (sorted-term order): independent of
    how the library reads the bm25s score matrix."""
    r = index._retriever
    n_terms = len(r.scores["indptr"]) - 1  # bm25s also numbers a placeholder token past the end
    vocab = sorted(t for t, i in r.vocab_dict.items() if i < n_terms)
    return np.stack([r.get_scores([t]) for t in vocab], axis=1).astype(np.float32)


@pytest.mark.parametrize("backend", ["numba", "scipy"])
@pytest.mark.parametrize("chunk_size", [1, 7, 64, 160, 1000])
def test_blocked_knn_equals_brute_force(knn_index, backend, chunk_size):
    w_dense = _weights_by_term_queries(knn_index)
    from funnel_core.funnelrag.clustering import bm25_weight_matrix

    np.testing.assert_array_equal(bm25_weight_matrix(knn_index).toarray(), w_dense)
    for k, threshold, m in [(5, 0.1, 16), (3, 0.0, 2), (12, 0.4, 4)]:
        ref = _reference_knn(w_dense, k, threshold, m)
        got = bm25_knn_adjacency(knn_index, k=k, threshold=threshold, query_terms=m,
                                 chunk_size=chunk_size, backend=backend)
        assert got.shape == ref.shape and got.dtype == np.float64
        np.testing.assert_array_equal(got.toarray(), ref)  # entry for entry, exact
        assert got.nnz > 0


def test_knn_blocks_stack_to_the_whole_graph_and_backends_agree():
    from funnel_core.funnelrag.clustering import knn_adjacency_from_weights, knn_block

    rng = np.random.default_rng(3)
    # weights from a small set: many exact ties between candidates
    w = sp.random(300, 40, density=0.15, random_state=4, format="csr",
                  data_rvs=lambda s: rng.choice([0.5, 1.0, 1.5, 2.0], size=s)).astype(np.float32)
    w.sort_indices()
    full = {b: sp.vstack([knn_block(w, s, min(300, s + 37), k=4, threshold=0.2, query_terms=3, backend=b)
                          for s in range(0, 300, 37)]).tocsr() for b in ("numba", "scipy")}
    assert (full["numba"] != full["scipy"]).nnz == 0
    ref = _reference_knn(w.toarray(), 4, 0.2, 3)
    directed = full["numba"].toarray()
    assert np.array_equal(np.maximum(directed, directed.T), ref)
    assert (np.count_nonzero(directed, axis=1) <= 4).all() and np.diag(directed).sum() == 0
    adj = knn_adjacency_from_weights(w, k=4, threshold=0.2, query_terms=3, chunk_size=50)
    assert np.array_equal(adj.toarray(), ref)


@pytest.mark.parametrize("tile", [1, 5, 32, 4096])
def test_knn_tiles_cannot_change_the_graph(knn_index, monkeypatch, tile):
    """The compiled kernel walks the documents in tiles (a quarter of the L2 cache: one tile for
    these small corpora), so small tiles are forced here: every posting list then crosses tile
    edges, and the graph must still equal the reference entry for entry, also for weights of
    both signs (a document's score may fall back below the threshold)."""
    pytest.importorskip("numba")
    from funnel_core.funnelrag import clustering

    monkeypatch.setattr(clustering, "knn_tile", lambda l2_bytes=None: tile)
    w_dense = _weights_by_term_queries(knn_index)
    for k, threshold, m in [(5, 0.1, 16), (3, 0.0, 2)]:
        got = bm25_knn_adjacency(knn_index, k=k, threshold=threshold, query_terms=m, backend="numba")
        np.testing.assert_array_equal(got.toarray(), _reference_knn(w_dense, k, threshold, m))
    rng = np.random.default_rng(5)
    w = sp.random(200, 30, density=0.2, random_state=6, format="csr",
                  data_rvs=lambda s: rng.choice([-1.0, 0.5, 1.0, 2.0], size=s)).astype(np.float32)
    w.sort_indices()
    got = clustering.knn_adjacency_from_weights(w, k=4, threshold=0.3, query_terms=5, backend="numba")
    np.testing.assert_array_equal(got.toarray(), _reference_knn(w.toarray(), 4, 0.3, 5))


def test_knn_tile_is_a_quarter_of_l2_in_float64_scores():
    from funnel_core.funnelrag.clustering import knn_tile
    from funnel_core.hardware import parse_cache_size

    assert parse_cache_size("512K") == 512 * 1024 and parse_cache_size("2M") == 2 << 20
    assert parse_cache_size("1536K") == 1536 * 1024 and parse_cache_size("big") is None
    assert knn_tile(512 * 1024) == 16384  # 128 KiB of float64 scores
    assert knn_tile(1536 * 1024) == 32768  # 48K entries -> the power of two below
    assert knn_tile(2 << 20) == 65536 and knn_tile(64 << 20) == 65536  # capped
    assert knn_tile(64 * 1024) == 4096  # floored
    assert knn_tile(None) >= 4096


def test_knn_argument_errors(knn_index):
    from funnel_core.funnelrag.clustering import bm25_weight_matrix, knn_block

    w = bm25_weight_matrix(knn_index)
    with pytest.raises(ValueError, match="threshold"):
        knn_block(w, 0, 10, threshold=1.5)
    with pytest.raises(ValueError, match="start"):
        knn_block(w, 5, 1)
    with pytest.raises(ValueError, match="backend"):
        bm25_knn_adjacency(knn_index, backend="gpu")


def test_clustering_coefficient_in_chunks_equals_triangle_count():
    from itertools import combinations

    a = sp.random(120, 120, density=0.06, random_state=2, format="csr")
    a = ((a + a.T) > 0).astype(float).tolil()
    a.setdiag(0)
    a = a.tocsr()
    a.eliminate_zeros()
    nbrs = [set(a.indices[a.indptr[i]:a.indptr[i + 1]]) for i in range(120)]
    ref = []
    for i in range(120):
        d = len(nbrs[i])
        tri = sum(1 for u, v in combinations(sorted(nbrs[i]), 2) if v in nbrs[u])
        ref.append(2 * tri / (d * (d - 1)) if d > 1 else 0.0)
    for chunk in (1, 17, 120, 500):
        np.testing.assert_allclose(local_clustering_coefficient(a, chunk_size=chunk), ref)


def test_a_clustered_index_saved_with_the_old_backend_key_loads(tmp_path, corpus_units,
                                                                 monkeypatch):
    """Clustered snapshots written before BM25's scoring engine was called ``engine=`` say
    ``backend`` (in bm25_config and in both inner BM25 indexes); they still load."""
    idx = ClusteredBM25Index(max_tokens=40, knn_k=3, knn_threshold=0.05).index(corpus_units)
    bm25_write, clustered_write = BM25Index._write, ClusteredBM25Index._write

    def old_key(config):
        config = {k: v for k, v in config.items() if k not in ("type", "show_progress")}
        config["backend"] = config.pop("engine")
        return config

    def old_bm25(self, folder, st=None):  # the settings as a "config" dict, as written then
        m = bm25_write(self, folder, st)
        return {**m, "config": old_key(m.pop("settings"))}

    def old_clustered(self, folder, st=None):  # clustering settings as keys, BM25's in bm25_config
        m = clustered_write(self, folder, st)
        settings = m.pop("settings")
        clustering = {n: settings.pop(n) for n in ("max_tokens", "adjacency", "knn_k", "knn_threshold")}
        return {**m, **clustering, "bm25_config": old_key(settings)}

    monkeypatch.setattr(BM25Index, "_write", old_bm25)
    monkeypatch.setattr(ClusteredBM25Index, "_write", old_clustered)
    idx.save(tmp_path / "old")
    monkeypatch.undo()
    loaded = ClusteredBM25Index.load(tmp_path / "old")
    assert loaded.bm25_config == idx.bm25_config
    assert [u.id for u in loaded.search("Paris tower", k=2)] == \
        [u.id for u in idx.search("Paris tower", k=2)]
