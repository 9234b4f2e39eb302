"""DenseIndex over faiss HNSW against exact search (the reference: a full numpy sort
of inner products), persisted through the snapshot mechanism."""

import numpy as np
import pytest

from funnel_core import Unit
from funnel_core.embeddings import DenseIndex

pytest.importorskip("faiss")


def _data(n=2000, d=32, nq=30, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(40, d))
    x = centers[rng.integers(40, size=n)] + 0.3 * rng.normal(size=(n, d))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    q = x[rng.integers(n, size=nq)] + 0.1 * rng.normal(size=(nq, d)).astype(np.float32)
    q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
    units = [Unit(id=f"u{i}", text=f"text {i}") for i in range(n)]
    return units, x, q


def _exact_top(x, q, k):
    return [list(np.argsort(-(x @ qq), kind="stable")[:k]) for qq in q]


def test_hnsw_finds_the_exact_neighbours_and_scores():
    units, x, q = _data()
    hnsw = DenseIndex(index="hnsw").index(units, embeddings=x)
    exact = DenseIndex(index="exact").index(units, embeddings=x)
    assert hnsw.backend == "hnsw" and exact.backend == "exact"
    queries = [f"q{i}" for i in range(len(q))]
    got = hnsw.search_many(queries, k=10, query_embeddings=q)
    ref = _exact_top(x, q, 10)
    recall = np.mean([len({u.id for u in g} & {f"u{i}" for i in r}) / 10 for g, r in zip(got, ref)])
    assert recall >= 0.95
    for g in got:  # scores are the true inner products, best first
        s = [u.score for u in g]
        assert s == sorted(s, reverse=True)
        for u in g:
            assert u.score == pytest.approx(float(x[int(u.id[1:])] @ q[got.index(g)]), abs=1e-4)
    assert [[u.id for u in r] for r in exact.search_many(queries, k=10, query_embeddings=q)] == \
        [[f"u{i}" for i in r] for r in ref]


def test_auto_switches_at_the_threshold_and_updates_rebuild_the_graph():
    units, x, q = _data(n=300)
    assert DenseIndex(ann_threshold=301).index(units, embeddings=x).backend == "exact"
    idx = DenseIndex(ann_threshold=290).index(units, embeddings=x)
    assert idx.backend == "hnsw"
    idx.delete(["u0", "u1"])
    assert idx.backend == "hnsw" and idx._state.ann.ntotal == 298
    top = idx.search_many(["q"], k=5, query_embeddings=x[:1])[0]
    assert "u0" not in {u.id for u in top}
    with pytest.raises(ValueError, match="index must be one of"):
        DenseIndex(index="ivf")


def test_hnsw_graph_is_saved_and_loaded_without_rebuild(tmp_path, monkeypatch):
    units, x, q = _data(n=500)
    idx = DenseIndex(index="hnsw", hnsw_m=16, ef_search=64).index(units, embeddings=x)
    before = idx.search_many(["a", "b"], k=7, query_embeddings=q[:2])
    idx.save(tmp_path / "d")
    assert (tmp_path / "d").exists()
    import faiss

    def no_build(*a, **k):
        raise AssertionError("the graph was rebuilt on load")

    monkeypatch.setattr(faiss, "IndexHNSWFlat", no_build)
    loaded = DenseIndex.load(tmp_path / "d", embedder=idx.embedder)
    assert loaded.backend == "hnsw" and loaded.hnsw_m == 16 and loaded.ef_search == 64
    after = loaded.search_many(["a", "b"], k=7, query_embeddings=q[:2])
    assert [[(u.id, u.score) for u in r] for r in after] == [[(u.id, u.score) for u in r] for r in before]


@pytest.mark.parametrize("kind", ["exact", "hnsw"])
def test_a_filter_keeps_the_exact_ranking_of_the_matching_units(kind):
    """``filter=`` means what it means on BM25Index (dict, predicate, boolean mask): the result
    is the top-k of the matching units by the true inner product. Catches a filter ignored, a
    post-filter of the HNSW top-k (fewer than k hits while more units match), and a padded
    result. The reference is a full numpy sort over the matching rows."""
    units, x, q = _data(n=600)
    for i, u in enumerate(units):
        u.metadata = {"shard": i % 7, "tags": ["a" if i % 2 else "b"]}
    index = DenseIndex(index=kind).index(units, embeddings=x)
    queries = [f"q{i}" for i in range(len(q))]
    keep = np.array([i % 7 == 3 and i % 2 == 1 for i in range(len(units))])
    rows = np.flatnonzero(keep)
    want = [[f"u{rows[j]}" for j in np.argsort(-(x[rows] @ qq), kind="stable")[:10]] for qq in q]
    for flt in ({"shard": 3, "tags": "a"}, lambda m: m["shard"] == 3 and "a" in m["tags"], keep):
        got = index.search_many(queries, k=10, query_embeddings=q, filter=flt)
        assert [[u.id for u in g] for g in got] == want
    assert index.search_many(queries[:1], k=5, query_embeddings=q[:1], filter={"shard": 99}) == [[]]
    with pytest.raises(ValueError, match="boolean array of shape"):
        index.search_many(queries[:1], k=5, query_embeddings=q[:1], filter=keep[:10])


def test_search_takes_filter_and_name_like_the_other_indexes():
    """``search(query, k=, filter=, name=)``: one query of :meth:`search_many` (catches a
    ``search`` that drops the filter on the way)."""
    units, x, q = _data(n=50)
    for i, u in enumerate(units):
        u.metadata = {"even": i % 2 == 0}

    class Fixed:  # an embedder that returns the given query vector (no model)
        model_name_or_path = "fixed"

        def encode(self, texts, show_progress=False):
            return np.repeat(q[:1], len(texts), axis=0)

    index = DenseIndex(Fixed(), index="exact").index(units, embeddings=x)
    hits = index.search("anything", k=5, filter={"even": True}, name="vec")
    assert len(hits) == 5 and all(u.metadata["even"] for u in hits)
    assert all("score_vec" in u.funnel for u in hits)
    assert [u.id for u in hits] == [u.id for u in index.search_many(["anything"], 5, filter={"even": True})[0]]
