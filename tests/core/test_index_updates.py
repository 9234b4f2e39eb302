"""Index updates and the bounded caches: one state object per index (atomic for
concurrent readers), incremental add/delete, and bad inputs with clear errors."""

from __future__ import annotations

import datetime
import threading

import numpy as np
import pytest
import scipy.sparse as sp

from funnel_core.bm25 import FILTER_CACHE_SIZE, BM25Index
from funnel_core.embeddings import DenseIndex
from funnel_core.funnel import Funnel
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
from funnel_core.rerank.bm25 import BM25Scorer
from funnel_core.units import Unit

QUERIES = ["Paris France", "Shakespeare playwright", "dense vectors", "capital of Germany", "ranking search"]


def sig(results):
    return [(u.id, u.score) for u in results]


# -- incremental updates -------------------------------------------------------------------------
def test_bm25_add_and_delete_equal_a_fresh_index(corpus_units):
    inc = BM25Index().index(corpus_units[:3]).add(corpus_units[3:6]).add(corpus_units[6:])
    fresh = BM25Index().index(corpus_units)
    for q in QUERIES:
        np.testing.assert_allclose(inc.get_scores(q), fresh.get_scores(q), rtol=1e-6)
        assert sig(inc.search(q, k=8)) == sig(fresh.search(q, k=8))
    assert inc.delete(["d1", "d5", "nope"]) == 2
    rest = BM25Index().index([u for u in corpus_units if u.id not in ("d1", "d5")])
    for q in QUERIES:
        assert sig(inc.search(q, k=8)) == sig(rest.search(q, k=8))
    assert all(u.id not in ("d1", "d5") for q in QUERIES for u in inc.search(q, k=8))
    with pytest.raises(ValueError, match="unit id 'd0' is already in the index"):
        inc.add([Unit(id="d0", text="again")])
    with pytest.raises(ValueError, match="remove every unit"):
        inc.delete([u.id for u in inc.units])
    with pytest.raises(TypeError, match="list of ids"):
        inc.delete("d0")
    assert inc.delete([]) == 0 and len(inc) == 6


def test_dense_add_and_delete(corpus_units):
    emb = np.random.default_rng(1).normal(size=(len(corpus_units), 6)).astype(np.float32)
    inc = DenseIndex().index(corpus_units[:4], embeddings=emb[:4]).add(corpus_units[4:], embeddings=emb[4:])
    fresh = DenseIndex().index(corpus_units, embeddings=emb)
    q = emb[[2, 6]] + 0.1
    a = inc.search_many(["a", "b"], k=5, query_embeddings=q)
    b = fresh.search_many(["a", "b"], k=5, query_embeddings=q)
    assert [sig(x) for x in a] == [sig(x) for x in b]
    assert inc.delete(["d2"]) == 1
    assert "d2" not in [u.id for u in inc.search_many(["a"], k=8, query_embeddings=q[:1])[0]]
    assert inc.embeddings.shape == (7, 6) and [u.id for u in inc.units] == [u.id for u in corpus_units if u.id != "d2"]
    with pytest.raises(ValueError, match="dimension 3, the index 6"):
        inc.add([Unit(id="z", text="z")], embeddings=np.ones((1, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="NaN"):
        inc.add([Unit(id="z", text="z")], embeddings=np.full((1, 6), np.nan, dtype=np.float32))


def _docs(texts):
    return [Unit(id=f"d{i}", text=t, level="document") for i, t in enumerate(texts)]


def test_clustered_add_follows_algorithm_1_closeness(tmp_path):
    # 5 documents of 2 tokens; clusters from an explicit graph: {d0} alone, {d1, d2, d3} chained, {d4}
    docs = _docs(["aa bb", "cc dd", "ee ff", "gg hh", "ii jj"])
    a = sp.lil_matrix((5, 5))
    for i, j in [(1, 2), (2, 3), (1, 3)]:
        a[i, j] = a[j, i] = 1.0
    idx = ClusteredBM25Index(max_tokens=8).index(docs, adjacency=a.tocsr())
    groups = sorted(sorted(c.metadata["members"]) for c in idx.clusters)
    assert groups == [["d0"], ["d1", "d2", "d3"], ["d4"]]
    # new doc x links to d0 (closeness 1/1) and d1 (closeness 1/3): joins d0's cluster
    # new doc y links to d2 and d3 (closeness 2/3) but that cluster is full (6 + 2 > 8)... it has room
    # exactly for 2 tokens, so y joins it; z links only to the (now full) d1 cluster: new cluster
    new = [Unit(id="x", text="kk ll"), Unit(id="y", text="mm nn"), Unit(id="z", text="oo pp")]
    rows = sp.lil_matrix((3, 8))
    rows[0, 0] = rows[0, 1] = 1.0
    rows[1, 2] = rows[1, 3] = 1.0
    rows[2, 1] = 1.0
    before = {c.id for c in idx.clusters}
    idx.add(new, adjacency=rows.tocsr())
    cl = {c.id: c.metadata["members"] for c in idx.clusters}
    of = {m: cid for cid, mem in cl.items() for m in mem}
    assert of["x"] == of["d0"] and of["y"] == of["d1"] and of["z"] not in before
    assert cl[of["z"]] == ["z"] and of["z"] == "cluster-3"
    assert all(c.metadata["n_tokens"] <= 8 for c in idx.clusters)
    assert idx.search("mm", k=1)[0].funnel["cluster_id"] == of["d1"]  # cluster text updated
    # delete: y leaves its cluster, z's cluster disappears; the rest keep their ids
    assert idx.delete(["y", "z"]) == 2
    assert "cluster-3" not in {c.id for c in idx.clusters} and not idx.search("mm nn oo", k=5)
    idx.save(tmp_path / "c")
    again = ClusteredBM25Index.load(tmp_path / "c")
    again.add([Unit(id="w", text="qq rr")], adjacency=sp.csr_matrix((1, 7)))
    assert {c.id for c in again.clusters} - {c.id for c in idx.clusters} == {"cluster-4"}  # never reused


def test_clustered_add_with_links_and_bm25_graphs():
    docs = [Unit(id="a", text="alpha beta gamma", metadata={"funnel_links": ["b"]}),
            Unit(id="b", text="beta delta", metadata={"funnel_links": ["a"]}),
            Unit(id="c", text="omega sigma", metadata={"funnel_links": []})]
    idx = ClusteredBM25Index(max_tokens=100).index(docs)
    idx.add([Unit(id="n", text="new text", metadata={"funnel_links": ["c"]})])
    of = {m: c.id for c in idx.clusters for m in c.metadata["members"]}
    assert of["n"] == of["c"]
    bm = ClusteredBM25Index(max_tokens=100, adjacency="bm25", knn_k=3, knn_threshold=0.05, stemmer=None)
    bm.index([Unit(id="p", text="paris france capital city"), Unit(id="g", text="germany berlin capital"),
              Unit(id="s", text="shakespeare hamlet tragedy")])
    bm.add([Unit(id="h", text="hamlet tragedy play shakespeare wrote")])
    of = {m: c.id for c in bm.clusters for m in c.metadata["members"]}
    assert of["h"] == of["s"]


# -- one state object: atomic for concurrent readers ---------------------------------------------
def _hammer(search, versions, writer, n_threads=4):
    """Run readers while ``writer`` swaps versions; every result must be one version's answer."""
    stop = threading.Event()
    errors, wrong, count = [], [0], [0]
    expected = {q: [search(v, q) for v in versions] for q in QUERIES}

    def reader():
        while not stop.is_set():
            for q in QUERIES:
                try:
                    got = search(None, q)
                except Exception as exc:  # noqa: BLE001 - any exception is a failure here
                    errors.append(repr(exc))
                    continue
                count[0] += 1
                if got not in expected[q]:
                    wrong[0] += 1

    threads = [threading.Thread(target=reader) for _ in range(n_threads)]
    for t in threads:
        t.start()
    try:
        writer()
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == [] and wrong[0] == 0 and count[0] > 50, (errors[:3], wrong[0], count[0])


def test_bm25_concurrent_index_add_delete(corpus_units):
    a, b = corpus_units[:5], corpus_units
    live = BM25Index().index(a)
    refs = [BM25Index().index(a), BM25Index().index(b)]

    def search(v, q):
        return sig((live if v is None else v).search(q, k=3, filter={"topic": ["geo", "ir", "lit"]}))

    def writer():
        for i in range(30):
            live.index(b if i % 2 == 0 else a)
            live.add(b[5:]) if len(live) == 5 else live.delete([u.id for u in b[5:]])

    _hammer(search, refs, writer)


@pytest.mark.slow  # over the fast tier's 2 s on a quiet machine (load 0.5)
def test_clustered_concurrent_index_add_delete(corpus_units):
    a, b = corpus_units[:5], corpus_units
    cfg = dict(max_tokens=40, knn_k=3, knn_threshold=0.05)
    live = ClusteredBM25Index(**cfg).index(a)
    v1 = ClusteredBM25Index(**cfg).index(a)
    v2 = ClusteredBM25Index(**cfg).index(b)
    v3 = ClusteredBM25Index(**cfg).index(a).add(b[5:])

    def search(v, q):
        return sig((live if v is None else v).search(q, k=2, filter={"topic": ["geo", "ir", "lit"]}))

    def writer():
        for i in range(15):
            live.index(b if i % 2 == 0 else a)
            live.index(a)
            live.add(b[5:])
            live.delete([u.id for u in b[5:]])

    _hammer(search, [v1, v2, v3], writer)


def test_dense_concurrent_index_add_delete(corpus_units):
    rng = np.random.default_rng(2)
    emb = rng.normal(size=(len(corpus_units), 5)).astype(np.float32)
    qemb = rng.normal(size=(len(QUERIES), 5)).astype(np.float32)
    a, extra = corpus_units[:5], corpus_units[5:]
    live = DenseIndex().index(a, embeddings=emb[:5])
    refs = [DenseIndex().index(a, embeddings=emb[:5]), DenseIndex().index(corpus_units, embeddings=emb)]

    def search(v, q):
        i = QUERIES.index(q)
        return sig((live if v is None else v).search_many([q], k=3, query_embeddings=qemb[i:i + 1])[0])

    def writer():
        for i in range(40):
            live.add(extra, embeddings=emb[5:])
            live.delete([u.id for u in extra])
            live.index(corpus_units, embeddings=emb)
            live.index(a, embeddings=emb[:5])

    _hammer(search, refs, writer)


# -- bad inputs ----------------------------------------------------------------------------------
def test_corpus_without_indexable_tokens():
    with pytest.raises(ValueError, match=r"none of the 2 units has an indexable token .*stopwords=None"):
        BM25Index().index([Unit(id="a", text="the of and"), Unit(id="b", text="!! ??")])
    with pytest.raises(ValueError, match="none of the 1 units"):
        ClusteredBM25Index().index([Unit(id="a", text="!!")])


def test_lone_surrogates_in_queries_texts_and_metadata(tmp_path, corpus_units):
    units = corpus_units + [Unit(id="s", text="broken \udcff decoding of Lyon", metadata={"src": "f\ud800.txt"})]
    idx = BM25Index().index(units)
    assert sig(idx.search("Paris\udcff", k=3)) == sig(idx.search("Paris", k=3))
    assert idx.search("Lyon", k=1)[0].id == "s"
    assert idx.get_scores("\ud800").tolist() == [0.0] * len(units)
    idx.save(tmp_path / "ix")
    again = BM25Index.load(tmp_path / "ix")
    assert again.units[-1].text == units[-1].text and again.units[-1].metadata == {"src": "f\ud800.txt"}


def test_metadata_json_cannot_hold_is_named_at_index_time():
    with pytest.raises(TypeError, match=r"metadata of unit id='u1'\['when'\] is a date .*isoformat"):
        BM25Index().index([Unit(id="u0", text="ok words"), Unit(id="u1", text="more words",
                                                                 metadata={"when": datetime.date(2024, 1, 1)})])
    with pytest.raises(TypeError, match=r"unit id='u0'\['x'\]\[1\] is a bytes"):
        BM25Index().index([Unit(id="u0", text="ok words", metadata={"x": [1, b"raw"]})])
    with pytest.raises(TypeError, match=r"is a set"):
        DenseIndex().index([Unit(id="u0", text="w", metadata={"s": {1, 2}})], embeddings=np.ones((1, 2)))


def test_numpy_scalars_int_keys_and_tuples_round_trip(tmp_path):
    meta = {"n": np.int64(3), "f": np.float32(0.5), "ok": np.bool_(True), "pos": (1, (2, "x")),
            "by_int": {1: "a", 2: ("b",)}, "nested": [{"k": (None,)}], "weird": {"$tuple": "literal"}}
    idx = BM25Index().index([Unit(id="u", text="hello world", metadata=meta)])
    got = idx.units[0].metadata
    assert type(got["n"]) is int and type(got["f"]) is float and type(got["ok"]) is bool
    idx.save(tmp_path / "ix")
    loaded = BM25Index.load(tmp_path / "ix").units[0].metadata
    assert loaded == got == {"n": 3, "f": 0.5, "ok": True, "pos": (1, (2, "x")), "by_int": {1: "a", 2: ("b",)},
                             "nested": [{"k": (None,)}], "weird": {"$tuple": "literal"}}
    assert type(loaded["pos"]) is tuple and list(loaded["by_int"]) == [1, 2]


def test_argument_checks(corpus_units):
    idx = BM25Index().index(corpus_units)
    with pytest.raises(TypeError, match="query must be a str, got NoneType"):
        idx.get_scores(None)
    reranker = BM25Scorer()
    for bad in (-1, 0):
        with pytest.raises(ValueError, match="top_n must be >= 1"):
            reranker.rank("Paris", corpus_units, top_n=bad)
    assert len(reranker.rank("Paris", corpus_units, top_n=2)) == 2
    with pytest.raises(TypeError, match=r"units\[0\] is a str .*not a Unit"):
        Funnel([reranker]).search("Paris", units=["plain text"])
    with pytest.raises(ValueError, match="b must be a finite number, got nan"):
        BM25Index(b=float("nan"))
    with pytest.raises(ValueError, match=r"b must be in \[0.0, 1.0\], got 2"):
        BM25Index(b=2)
    with pytest.raises(ValueError, match="not a valid regular expression"):
        BM25Index(token_pattern="(unclosed")
    with pytest.raises(ValueError, match="catastrophic backtracking"):
        BM25Index(token_pattern=r"(?:\w+)+!")
    with pytest.raises(ValueError, match="catastrophic backtracking"):
        ClusteredBM25Index(token_pattern=r"(a|aa)+")
    with pytest.raises(ValueError, match="knn_threshold must be a finite number"):
        ClusteredBM25Index(knn_threshold=float("nan"))


def test_filters_on_list_valued_metadata():
    units = [Unit(id="a", text="apple pie recipe", metadata={"tags": ["food", "sweet"]}),
             Unit(id="b", text="apple laptop review", metadata={"tags": ["tech"]}),
             Unit(id="c", text="apple orchard", metadata={"tags": "farm"}),
             Unit(id="d", text="apple cider", metadata={"tags": [{"nested": 1}]})]
    idx = BM25Index().index(units)
    assert {u.id for u in idx.search("apple", filter={"tags": "food"})} == {"a"}
    assert {u.id for u in idx.search("apple", filter={"tags": ["tech", "farm"]})} == {"b", "c"}
    assert {u.id for u in idx.search("apple", filter={"tags": [{"nested": 1}]})} == {"d"}
    c = ClusteredBM25Index(max_tokens=4).index(units)
    assert {u.id for u in c.search("apple", k=4, filter={"tags": "sweet"})} == {"a"}


def test_index_keeps_its_own_copies(corpus_units):
    mine = [u.copy() for u in corpus_units]
    idx = BM25Index().index(mine)
    before = sig(idx.search("Paris", k=3)), idx.search("Paris", k=1)[0].metadata
    mine[0].text, mine[0].metadata["title"] = "changed", "changed"
    assert (sig(idx.search("Paris", k=3)), idx.search("Paris", k=1)[0].metadata)[0] == before[0]
    assert idx.search("Paris", k=1)[0].text != "changed"


def test_cjk_bigram_and_char_tokenization():
    units = [Unit(id="jp", text="東京は日本の首都です"), Unit(id="en", text="Tokyo is the capital of Japan")]
    assert BM25Index().index(units).search("東京 首都") == []  # one token per run: nothing found
    for mode in ("bigram", "char"):
        hit = BM25Index(cjk=mode).index(units).search("東京 首都")
        assert [u.id for u in hit] == ["jp"], mode
    assert BM25Index(cjk="bigram").tokenize(["東京は"])[0] == ["東京", "京は"]
    with pytest.raises(ValueError, match="cjk must be one of"):
        BM25Index(cjk="yes")


# -- bounded caches ------------------------------------------------------------------------------
def test_filter_column_cache_is_bounded(corpus_units):
    idx = BM25Index().index(corpus_units)
    for i in range(200):
        idx.search("Paris", filter={f"key{i}": 1})
    assert len(idx._state.columns) == FILTER_CACHE_SIZE


def test_router_query_embedding_cache_is_bounded():
    from funnel_core.granularity.router import GranularityRouter

    class Encoder:  # the cache is under test, not the model
        model_name_or_path = "none"
        dimension = 3

        def encode(self, texts):
            return np.array([[len(t), 1.0, 0.0] for t in texts], dtype=np.float32)

    router = GranularityRouter(2, embedder=Encoder(), cache_size=10)
    qs = [f"query {i}" * (i % 3 + 1) for i in range(50)]
    emb = router.embed(qs)
    assert emb.shape == (50, 3) and emb[0, 0] == len(qs[0]) and len(router._cache) == 10
