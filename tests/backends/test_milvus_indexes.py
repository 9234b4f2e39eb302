"""The Milvus backend (funnel_core.backends.milvus) on embedded Milvus Lite, against the in-memory indexes.

The reference for "same results" is the bm25s-backed BM25Index / ClusteredBM25Index and the
numpy DenseIndex: same ids, same scores (to float32 precision), same order up to ties, same
metadata. One Milvus Lite database per module (tmp folder), collections named per test.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

pytest.importorskip("pymilvus", reason="pymilvus is not installed (pip install 'funnel-rag[milvus]')")
pytest.importorskip("milvus_lite", reason="milvus-lite is not installed (pip install 'funnel-rag[milvus]')")

from funnel_core.backends.milvus import (
    MilvusBM25Index,
    MilvusClusteredBM25Index,
    MilvusCollectionError,
    MilvusConnectionError,
    MilvusDenseIndex,
    MilvusSettingsError,
    UnsupportedFilterError,
    filter_expression,
    load_index,
    milvus_tokens,
)
from funnel_core.bm25 import BM25Index  # noqa: E402
from funnel_core.embeddings import DenseIndex  # noqa: E402
from funnel_core.errors import PersistError  # noqa: E402
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index  # noqa: E402
from funnel_core.persist import snapshot_info  # noqa: E402
from funnel_core.units import Unit  # noqa: E402

TOPICS = {
    "geo": "city capital river mountain country border population map coast valley",
    "ir": "ranking retrieval index query document score search engine relevance term",
    "lit": "poem novel author tragedy play verse character chapter stage writer",
    "bio": "cell protein gene enzyme tissue membrane receptor mutation blood organism",
}


def make_corpus(n: int = 120, seed: int = 0) -> list[Unit]:
    """Documents of varying length over four topic vocabularies (few exact score ties)."""
    rng = np.random.default_rng(seed)
    units = []
    for i in range(n):
        topic = list(TOPICS)[i % 4]
        words = TOPICS[topic].split() + TOPICS[list(TOPICS)[(i + 1) % 4]].split()[:3]
        length = int(rng.integers(6, 40))
        text = " ".join(rng.choice(words, size=length))
        tags = ["odd" if i % 2 else "even", f"t{i % 3}"]
        units.append(Unit(id=f"doc-{i}", text=f"Document {i}. {text}.", level="document",
                          metadata={"topic": topic, "year": 2000 + i % 7, "tags": tags,
                                    "source": f"s{i % 5}.md"}))
    return units


QUERIES = ["capital city of the country", "ranking documents for a search query",
           "tragedy play by an author", "protein receptor mutation in blood cells",
           "river valley map", "the", "index score relevance term engine", "gene"]


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("milvus") / "funnel.db")


@pytest.fixture(scope="module")
def corpus() -> list[Unit]:
    return make_corpus()


@pytest.fixture(scope="module")
def ref(corpus) -> BM25Index:
    return BM25Index().index(corpus)


@pytest.fixture(scope="module")
def flat(db, corpus) -> MilvusBM25Index:
    return MilvusBM25Index(db, "flat").index(corpus)


def assert_same_ranking(got: list[Unit], want: list[Unit], rel: float = 1e-5) -> None:
    """Same ids with the same scores, and both lists sorted; ties may swap, but an id outside
    a tie at the cut-off must be the same."""
    assert len(got) == len(want)
    g = {u.id: u.score for u in got}
    w = {u.id: u.score for u in want}
    gs = [u.score for u in got]
    assert gs == sorted(gs, reverse=True)
    assert sorted(g.values()) == pytest.approx(sorted(w.values()), rel=rel)
    cut = min(w.values()) if w else None
    for uid, s in w.items():
        if cut is not None and abs(s - cut) > rel * abs(cut):
            assert uid in g and g[uid] == pytest.approx(s, rel=rel)


# -- tokens and filters -----------------------------------------------------------------------
def test_milvus_tokens_are_one_to_one_and_safe():
    toks = ["cat", "Cat", "qxcat", "foo_bar", "naïve", "日本語", "3d", "x" * 50]
    out = milvus_tokens(toks).split(" ")
    assert len(out) == len(toks) and len(set(out)) == len(toks)
    assert out[0] == "cat" and out[6] == "3d"
    assert all(t.isascii() and t.isalnum() and t == t.lower() for t in out)
    assert milvus_tokens(["qx" + b"Cat".hex()]) != milvus_tokens(["Cat"])


def test_filter_expression_forms():
    assert filter_expression(None) is None
    assert filter_expression('metadata["year"] > 3') == 'metadata["year"] > 3'
    e = filter_expression({"topic": "geo", "year": [2001, 2002]})
    assert 'metadata["topic"] == "geo"' in e and "json_contains_any" in e and " and " in e
    assert filter_expression({"topic": []}) == "false"
    assert filter_expression({"q": 'say "hi"'}).count('\\"') == 4
    with pytest.raises(UnsupportedFilterError, match="callable.*dict.*expression"):
        filter_expression(lambda m: True)
    with pytest.raises(UnsupportedFilterError, match="boolean-mask"):
        filter_expression(np.ones(3, dtype=bool))
    with pytest.raises(UnsupportedFilterError, match="key 'k'"):
        filter_expression({"k": {"nested": 1}})


# -- flat BM25 ---------------------------------------------------------------------------------
def test_bm25_matches_bm25s(flat, ref):
    for q in QUERIES:
        assert_same_ranking(flat.search(q, k=10), ref.search(q, k=10))
    got, want = flat.search(QUERIES[1], k=5)[0], ref.search(QUERIES[1], k=5)[0]
    assert got.id == want.id and got.text == want.text and got.level == "document"
    assert {k: v for k, v in got.metadata.items() if k != "scores"} == \
        {k: v for k, v in want.metadata.items() if k != "scores"}
    assert got.scores["bm25"] == pytest.approx(want.score, rel=1e-5)
    assert isinstance(got.score, float) and got.funnel["bm25_rank"] == 0
    assert flat.search("the", k=5) == [] and flat.search("   ") == []
    assert len(flat) == 120


def test_bm25_score_is_lucene_formula(db):
    """A hand-computed Lucene BM25 score (k1=1.2, b=0.5), independent of bm25s."""
    docs = ["apple banana apple", "banana cherry", "cherry cherry cherry date"]
    idx = MilvusBM25Index.from_texts(docs, uri=db, collection="formula", k1=1.2, b=0.5,
                                     stemmer=None, stopwords=None)
    hits = idx.search("apple", k=3)
    n, df, avgdl = 3, 1, (3 + 2 + 4) / 3
    idf = np.log(1 + (n - df + 0.5) / (df + 0.5))
    tf, dl = 2, 3
    want = idf * tf / (tf + 1.2 * (1 - 0.5 + 0.5 * dl / avgdl))
    assert [u.id for u in hits] == ["0"] and hits[0].score == pytest.approx(want, rel=1e-5)


def test_case_and_unicode_terms_are_not_merged(db):
    """With lower=False, 'Apple' and 'apple' are different terms (Milvus's analyzer would
    lower-case them), and non-ASCII/underscore tokens survive intact."""
    texts = ["Apple pie", "apple tree apple", "naïve foo_bar", "naive foo bar", "日本語 text"]
    cfg = dict(lower=False, stemmer=None, stopwords=None)
    m = MilvusBM25Index.from_texts(texts, uri=db, collection="case", **cfg)
    r = BM25Index.from_texts(texts, **cfg)
    for q in ["Apple", "apple", "naïve", "foo_bar", "foo", "日本語"]:
        assert_same_ranking(m.search(q, k=5), r.search(q, k=5))
    assert [u.id for u in m.search("Apple")] == ["0"]


def test_filters_pushed_down_like_in_memory(flat, ref):
    cases = [{"topic": "geo"}, {"year": [2001, 2003]}, {"tags": "odd"}, {"tags": ["t1", "t2"]},
             {"topic": "ir", "tags": "even"}, {"source": "nope.md"}]
    for flt in cases:
        for q in QUERIES[:5]:
            # reference: the in-memory index with the documented semantics as a predicate (a
            # list-valued field matches when it contains the value)
            got = flat.search(q, k=8, filter=flt)
            want = ref.search(q, k=8, filter=lambda m, flt=flt: _match(m, flt))
            assert_same_ranking(got, want)
            mask_ok = {u.id for u in ref.units if _match(u.metadata, flt)}
            assert all(u.id in mask_ok for u in got)  # never padded
    assert flat.search("capital", filter={"topic": []}) == []
    expr = flat.search("capital city", k=50, filter='metadata["year"] >= 2005')
    assert expr and all(u.metadata["year"] >= 2005 for u in expr)
    with pytest.raises(UnsupportedFilterError):
        flat.search("capital", filter=lambda m: m["topic"] == "geo")


def _match(meta: dict, flt: dict) -> bool:
    for k, w in flt.items():
        v = meta.get(k)
        ws = w if isinstance(w, list) else [w]
        vs = v if isinstance(v, list) else [v]
        if not any(x in ws for x in vs):
            return False
    return True


def test_search_many_and_threads_match_sequential(flat):
    seq = [flat.search(q, k=7) for q in QUERIES]
    assert flat.search_many(QUERIES, k=7) == seq
    results: dict[int, list] = {}

    def worker(t: int) -> None:
        results[t] = [flat.search(q, k=7) for q in QUERIES[t % 3:] + QUERIES[:t % 3]]

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for t, res in results.items():
        assert res == seq[t % 3:] + seq[:t % 3]


def test_reopen_save_load_without_reindexing(db, flat, tmp_path):
    again = MilvusBM25Index(db, "flat")  # no settings: adopts the collection's
    assert again.search(QUERIES[0], k=5) == flat.search(QUERIES[0], k=5)
    assert again.config["stemmer"] == "english"
    flat.save(tmp_path / "m")
    # one committed snapshot (funnel_core.persist) holding only its manifest: no data files
    info = snapshot_info(tmp_path / "m")
    assert info["format"] == MilvusBM25Index.kind and info["files"] == {}
    snapshot_files = [f.name for f in (tmp_path / "m" / info["snapshot"]).iterdir()]
    assert snapshot_files == ["manifest.json"]
    raw = (tmp_path / "m" / info["snapshot"] / "manifest.json").read_text()
    assert len(raw) < 2000 and "Document 1." not in raw and "token\"" not in raw
    # the folder never says where to connect: a fingerprint of the uri, not the uri
    assert info["meta"]["collection"] == "flat" and "uri" not in info["meta"]
    assert flat.uri not in raw and info["meta"]["uri_sha256"] != flat.uri
    assert info["meta"]["settings"]["bm25"]["stemmer"] == "english"
    loaded = load_index(tmp_path / "m", uri=db)
    assert isinstance(loaded, MilvusBM25Index)
    assert loaded.search(QUERIES[2], k=5) == flat.search(QUERIES[2], k=5)
    assert MilvusBM25Index.load(tmp_path / "m", uri=db).config == flat.config
    # an in-memory index saved there is refused by the Milvus class, loaded by load_index
    BM25Index().index([Unit(id="a", text="alpha beta")]).save(tmp_path / "mem")
    assert isinstance(load_index(tmp_path / "mem", BM25Index), BM25Index)
    with pytest.raises(PersistError, match="not a.*milvus-bm25"):
        MilvusBM25Index.load(tmp_path / "mem")
    with pytest.raises(PersistError, match="no saved Milvus index"):
        load_index(tmp_path / "mem")


def test_saved_manifest_checks_the_collection_settings(db, corpus, tmp_path):
    """A manifest saved for one build, opened after the collection was rebuilt with other
    tokenizer settings: an error naming both values, not silently different results."""
    idx = MilvusBM25Index(db, "resettled").index(corpus[:10])
    idx.save(tmp_path / "s")
    MilvusBM25Index(db, "resettled", stemmer=None).index(corpus[:10])
    with pytest.raises(MilvusSettingsError, match=r"stemmer=None.*stemmer='english'"):
        MilvusBM25Index.load(tmp_path / "s", uri=db)


def test_errors_name_the_value_and_fix(db, flat):
    with pytest.raises(MilvusSettingsError, match=r"stemmer='english'.*stemmer=None"):
        MilvusBM25Index(db, "flat", stemmer=None).search("x")
    with pytest.raises(MilvusSettingsError, match=r"k1=1.5.*k1=2.0"):
        MilvusBM25Index(db, "flat", k1=2.0).open()
    with pytest.raises(MilvusCollectionError, match="no collection 'missing'.*index"):
        MilvusBM25Index(db, "missing").search("x")
    with pytest.raises(MilvusConnectionError, match="127.0.0.1:1.*start the server"):
        MilvusBM25Index("http://127.0.0.1:1", "flat").search("x")
    with pytest.raises(ValueError, match="must end in '.db'"):
        MilvusBM25Index("some/folder", "flat")
    with pytest.raises(ValueError, match="lucene"):
        MilvusBM25Index(db, "x", method="bm25+")
    with pytest.raises(MilvusSettingsError, match="milvus-bm25.*not a.*clustered"):
        MilvusClusteredBM25Index(db, "flat").search("x")


def test_format_version_mismatch(db, corpus):
    idx = MilvusBM25Index(db, "versioned").index(corpus[:10])
    client = idx.client
    physical = client.describe_collection("versioned")["collection_name"]
    meta = json.loads(client.describe_collection(physical)["properties"]["funnel_rag.meta"])
    meta["version"] = 99
    client.alter_collection_properties(physical, {"funnel_rag.meta": json.dumps(meta)})
    with pytest.raises(MilvusSettingsError, match="version 99.*rebuild"):
        MilvusBM25Index(db, "versioned").open()


def test_failed_build_leaves_previous_collection(db, corpus):
    idx = MilvusBM25Index(db, "atomic").index(corpus[:20])
    before = sorted(idx.client.list_collections())
    answer = idx.search(QUERIES[0], k=5)
    bad = corpus[:30] + [Unit(id="huge", text="word " * 20000)]
    with pytest.raises(ValueError, match="'huge'.*65535"):
        idx.index(bad)
    assert sorted(idx.client.list_collections()) == before
    assert MilvusBM25Index(db, "atomic").search(QUERIES[0], k=5) == answer
    idx.index(corpus[20:40])  # a rebuild swaps and drops the old physical collection
    after = idx.client.list_collections()
    assert len(after) == len(before)
    assert {u.id for u in idx.search(QUERIES[0], k=50)} <= {u.id for u in corpus[20:40]}


def test_name_taken_by_foreign_collection(db, flat):
    client = flat.client
    from pymilvus import DataType

    schema = client.create_schema(auto_id=False)
    schema.add_field("pk", DataType.INT64, is_primary=True)
    schema.add_field("v", DataType.FLOAT_VECTOR, dim=2)
    params = client.prepare_index_params()
    params.add_index(field_name="v", index_type="FLAT", metric_type="L2")
    client.create_collection("foreign", schema=schema, index_params=params)
    with pytest.raises(MilvusCollectionError, match="'foreign'.*not built by funnel-rag"):
        MilvusBM25Index(db, "foreign").search("x")
    n = len(client.list_collections())
    with pytest.raises(MilvusCollectionError, match="'foreign' already exists"):
        MilvusBM25Index(db, "foreign").index([Unit(id="a", text="alpha")])
    assert len(client.list_collections()) == n


# -- clustered BM25 ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def clustered_ref(corpus) -> ClusteredBM25Index:
    return ClusteredBM25Index(max_tokens=120).index(corpus)


@pytest.fixture(scope="module")
def clustered(db, clustered_ref) -> MilvusClusteredBM25Index:
    return MilvusClusteredBM25Index.from_index(clustered_ref, db, "clusters")


def _doc_view(units: list[Unit]) -> list[tuple]:
    return [(u.id, u.text, u.parent_id, u.level, u.funnel["cluster_id"], u.funnel["cluster_rank"],
             round(u.score, 4), round(u.score, 4),
             {k: v for k, v in u.metadata.items() if k not in ("scores", "cluster_score", "document_score")})
            for u in units]


def test_clustered_matches_in_memory(clustered, clustered_ref):
    assert clustered.n_clusters == len(clustered_ref.clusters) > 5
    for q in QUERIES:
        got, want = clustered.search(q, k=3), clustered_ref.search(q, k=3)
        gc = clustered.search(q, k=3, return_clusters=True)
        wc = clustered_ref.search(q, k=3, return_clusters=True)
        assert_same_ranking(gc, wc)
        if len({round(c.score, 5) for c in wc}) == len(wc):  # no tie among the clusters
            assert _doc_view(got) == _doc_view(want)
            assert [(c.id, c.text, c.metadata["members"]) for c in gc] == \
                [(c.id, c.text, c.metadata["members"]) for c in wc]
        assert len(clustered.search(q, k=3, max_documents=2)) <= 2


def test_clustered_filters(clustered, clustered_ref):
    for flt in [{"topic": "lit"}, {"year": [2002, 2004]}, {"tags": "odd", "topic": "geo"}]:
        for q in QUERIES[:5]:
            pred = lambda m, flt=flt: _match(m, flt)  # noqa: E731
            got, want = clustered.search(q, k=2, filter=flt), clustered_ref.search(q, k=2, filter=pred)
            assert all(_match(u.metadata, flt) for u in got)
            wc = clustered_ref.search(q, k=2, filter=pred, return_clusters=True)
            if len({round(c.score, 5) for c in wc}) == len(wc):
                assert _doc_view(got) == _doc_view(want)
    assert clustered.search("capital", filter={"topic": "none"}) == []


def test_clustered_builds_itself_and_reopens(db, corpus, clustered_ref, tmp_path):
    own = MilvusClusteredBM25Index(db, "clusters_own", max_tokens=120).index(corpus)
    assert own.n_clusters == len(clustered_ref.clusters)
    q = QUERIES[3]
    assert [c.metadata["members"] for c in own.search(q, k=3, return_clusters=True)] == \
        [c.metadata["members"] for c in clustered_ref.search(q, k=3, return_clusters=True)]
    own.save(tmp_path / "c")
    again = load_index(tmp_path / "c", uri=db)
    assert isinstance(again, MilvusClusteredBM25Index) and again.max_tokens == 120
    assert again.search(q, k=3) == own.search(q, k=3)


def test_clustered_settings_are_validated_like_in_memory(db, tmp_path):
    """The Milvus clustered index checks its clustering settings with the in-memory index's rule,
    before it connects, and again when it re-opens a collection whose stored settings changed."""
    absent = tmp_path / "never.db"
    for bad, word in [({"adjacency": "link"}, "adjacency"), ({"knn_k": 0}, "knn_k"),
                      ({"knn_threshold": float("nan")}, "knn_threshold"), ({"max_tokens": -1}, "max_tokens")]:
        with pytest.raises(ValueError, match=word):
            ClusteredBM25Index(**bad)
        with pytest.raises(ValueError, match=word):
            MilvusClusteredBM25Index(absent, "c", **bad)
    assert not absent.exists()  # refused before any connection

    from funnel_core.backends.milvus.client import META_KEY, MilvusError

    own = MilvusClusteredBM25Index(db, "clusters_tampered", max_tokens=120).index(
        [Unit(id=f"d{i}", text=f"word{i} shared text") for i in range(6)])
    physical = own._opened()["_physical"]
    meta = json.loads(own.client.describe_collection(physical)["properties"][META_KEY])
    meta["settings"]["adjacency"] = "everything"
    own.client.alter_collection_properties(physical, properties={META_KEY: json.dumps(meta)})
    with pytest.raises(MilvusError, match="adjacency.*rebuild it"):
        MilvusClusteredBM25Index(db, "clusters_tampered").search("shared")


# -- dense --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vectors(corpus) -> np.ndarray:
    rng = np.random.default_rng(1)
    v = rng.normal(size=(len(corpus), 16)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_dense_flat_equals_numpy(db, corpus, vectors):
    ref = DenseIndex().index(corpus, embeddings=vectors)  # the model is never loaded
    m = MilvusDenseIndex(db, "dense_flat", ref.embedder, index_type="FLAT").index(
        corpus, embeddings=vectors)
    q = vectors[:5] + 0.1
    got, want = m.search_many(["a"] * 5, k=6, query_embeddings=q), \
        ref.search_many(["a"] * 5, k=6, query_embeddings=q)
    for g, w in zip(got, want):
        assert [u.id for u in g] == [u.id for u in w]
        assert [u.score for u in g] == pytest.approx([u.score for u in w], rel=1e-5)
        assert g[0].metadata == w[0].metadata and g[0].text == w[0].text


def test_dense_hnsw_filter_reopen_and_dimension(db, corpus, vectors, tmp_path):
    ref = DenseIndex().index(corpus, embeddings=vectors)
    m = MilvusDenseIndex(db, "dense_hnsw", ref.embedder, batch_size=32).index(corpus, embeddings=vectors)
    q = vectors[10:20]
    got = m.search_many(["a"] * 10, k=5, query_embeddings=q)
    want = ref.search_many(["a"] * 10, k=5, query_embeddings=q)
    recall = np.mean([len({u.id for u in g} & {u.id for u in w}) / 5 for g, w in zip(got, want)])
    assert recall >= 0.9
    flt = m.search_many(["a"], k=5, query_embeddings=q[:1], filter={"topic": "bio"})[0]
    assert flt and all(u.metadata["topic"] == "bio" for u in flt)
    m.save(tmp_path / "d")
    again = MilvusDenseIndex.load(tmp_path / "d", db, embedder=ref.embedder)
    assert again.search_many(["a"], k=5, query_embeddings=q[:1]) == m.search_many(["a"], k=5, query_embeddings=q[:1])
    with pytest.raises(MilvusSettingsError, match="16-d.*8-d"):
        m.search_many(["a"], k=3, query_embeddings=np.ones((1, 8), dtype=np.float32))


def test_funnelrag_preset_on_milvus_equals_in_memory(clustered, clustered_ref):
    """The same funnel, one argument changed: the preset runs over the Milvus clustered index."""
    from funnel_core.funnelrag.presets import funnelrag
    from funnel_core.rerank.bm25 import BM25Scorer

    kw = dict(pre_ranker=BM25Scorer(), k_clusters=3, k_documents=4, k_passages=2, passage_words=8)
    mem, mil = funnelrag(clustered_ref, **kw), funnelrag(clustered, **kw)
    for q in QUERIES[:4]:
        a, b = mil.search(q), mem.search(q)
        assert [(u.id, round(u.score, 4)) for u in a.units] == [(u.id, round(u.score, 4)) for u in b.units]
        assert [r.units_out for r in a.trace.stages] == [r.units_out for r in b.trace.stages]


@pytest.mark.slow  # over the fast tier's 2 s on a quiet machine (load 0.5)
def test_clustered_follows_a_rebuild_by_another_writer(db, corpus):
    """A reader that cached the old collections keeps working after another writer's rebuild."""
    writer = MilvusClusteredBM25Index(db, "shared_clusters", max_tokens=120).index(corpus[:40])
    reader = MilvusClusteredBM25Index(db, "shared_clusters")
    assert reader.search(QUERIES[0], k=2)
    writer.index(corpus[40:80])
    got = reader.search(QUERIES[0], k=50)
    assert got and {u.id for u in got} <= {u.id for u in corpus[40:80]}


def test_clustered_threads_match_sequential(clustered):
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(q, f) for q in QUERIES for f in (None, {"topic": "geo"})] * 3
    seq = [clustered.search(q, k=3, filter=f) for q, f in jobs]
    with ThreadPoolExecutor(max_workers=6) as pool:
        par = list(pool.map(lambda a: clustered.search(a[0], k=3, filter=a[1]), jobs))
    assert par == seq
