"""BM25 engine: variants, tokenizer settings, filters without padding, batching, persistence,
bad input and thread safety."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from funnel_core import BM25Index, PersistError, Unit, bm25_scores
from funnel_core.bm25 import METHODS


@pytest.fixture
def index(corpus_units):
    return BM25Index().index(corpus_units)


@pytest.mark.parametrize("method", METHODS)
def test_every_variant_ranks_the_matching_document_first(corpus_units, method):
    idx = BM25Index(method=method, k1=1.2, b=0.7).index(corpus_units)
    top = idx.search("Eiffel tower lattice", k=3)
    assert top[0].id == "d2"
    assert all(type(u.score) is float for u in top)
    assert [u.funnel["bm25_rank"] for u in top] == list(range(len(top)))


def test_stemming_and_stopwords_are_switchable(corpus_units):
    stemmed = BM25Index().index(corpus_units)
    raw = BM25Index(stemmer=None, stopwords=None).index(corpus_units)
    # "ranks" only matches "ranking"/"rank" through the stemmer
    assert stemmed.search("ranks", k=3)[0].id == "d3"
    assert raw.search("ranks", k=3) == []
    assert stemmed.tokenize(["the cities"])[0] == ["citi"]
    assert raw.tokenize(["the cities"])[0] == ["the", "cities"]


def test_token_pattern_is_used(corpus_units):
    idx = BM25Index(token_pattern=r"(?u)\b\w+\b", stopwords=None).index(
        [Unit(id="a", text="x y z"), Unit(id="b", text="a b c")])
    assert idx.search("y", k=2)[0].id == "a"  # single-letter tokens kept by this pattern


def test_dict_filter_never_pads(index):
    out = index.search("capital city", k=8, filter={"topic": "lit"})
    assert out == []  # no literature document mentions a capital: nothing, not zeros
    out = index.search("Paris capital", k=8, filter={"topic": ["geo", "ir"]})
    assert out and all(u.metadata["topic"] in ("geo", "ir") for u in out)
    assert all(u.score > 0 for u in out)


def test_predicate_and_mask_filters(index, corpus_units):
    pred = index.search("Paris", k=5, filter=lambda m: m["title"] == "Paris")
    assert {u.id for u in pred} == {"d0", "d2"}
    mask = np.array([u.id == "d2" for u in corpus_units])
    assert [u.id for u in index.search("Paris", k=5, filter=mask)] == ["d2"]
    with pytest.raises(ValueError, match="boolean array of shape"):
        index.search("Paris", filter=np.array([True]))
    with pytest.raises(TypeError, match="filter must be"):
        index.search("Paris", filter=3)


def test_search_many_equals_search(index):
    qs = ["Paris France", "Shakespeare", "dense vectors", "   "]
    many = index.search_many(qs, k=3)
    for q, res in zip(qs, many):
        assert [u.id for u in res] == [u.id for u in index.search(q, k=3)]
    assert many[-1] == []


def test_results_are_copies(index):
    hit = index.search("Paris", k=1)[0]
    hit.metadata["title"] = "changed"
    assert index.search("Paris", k=1)[0].metadata["title"] == "Paris"


def test_save_load_round_trips_every_setting(tmp_path, corpus_units):
    idx = BM25Index(method="bm25+", k1=1.1, b=0.6, delta=0.7, stemmer="porter", stopwords=["paris"],
                    token_pattern=r"(?u)\b\w+\b", lower=False).index(corpus_units)
    idx.save(tmp_path / "ix")
    loaded = BM25Index.load(tmp_path / "ix")
    assert loaded.config == idx.config
    for q in ["Eiffel Tower", "Paris", "a ranking function", "Shakespeare"]:
        a, b = idx.search(q, k=5), loaded.search(q, k=5)
        assert [(u.id, u.score, u.text, u.metadata) for u in a] == [(u.id, u.score, u.text, u.metadata) for u in b]


def test_an_index_saved_with_the_old_backend_key_loads(tmp_path, corpus_units, monkeypatch):
    """Snapshots written before BM25's scoring engine was called ``engine=`` say ``backend``;
    they load (``backend=`` now means storage: memory or Milvus), and a dict that names
    ``backend`` outside a snapshot is refused, naming ``engine``."""
    from funnel_core.bm25 import validate_config

    idx = BM25Index().index(corpus_units)
    write = BM25Index._write

    def old_write(self, folder, st=None):  # the settings as a "config" dict, as written then
        meta = write(self, folder, st)
        config = {k: v for k, v in meta.pop("settings").items() if k not in ("type", "show_progress")}
        config["backend"] = config.pop("engine")
        return {**meta, "config": config}

    monkeypatch.setattr(BM25Index, "_write", old_write)
    idx.save(tmp_path / "old")
    monkeypatch.undo()
    loaded = BM25Index.load(tmp_path / "old")
    assert loaded.config == idx.config and loaded.config["engine"] == "auto"
    assert [u.id for u in loaded.search("Paris", k=3)] == [u.id for u in idx.search("Paris", k=3)]
    with pytest.raises(TypeError, match="engine='numpy' or engine='numba'"):
        validate_config({"backend": "numba"})


def test_save_is_atomic_and_keeps_old_index_on_failure(tmp_path, corpus_units, monkeypatch):
    path = tmp_path / "ix"
    BM25Index().index(corpus_units[:3]).save(path)
    bad = BM25Index().index(corpus_units)

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(bad._retriever, "save", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        bad.save(path)
    assert len(BM25Index.load(path)) == 3  # the old index is intact
    assert [p.name for p in tmp_path.iterdir()] == ["ix"]  # no temp folders left behind


def test_missing_and_corrupt_persist_folders(tmp_path, corpus_units):
    with pytest.raises(PersistError, match="does not exist"):
        BM25Index.load(tmp_path / "nope")
    BM25Index().index(corpus_units).save(tmp_path / "ix")
    units_file = next((tmp_path / "ix").glob("snapshot-*/units.jsonl"))
    units_file.write_text("{not json\n")
    with pytest.raises(PersistError, match="checksum mismatch for .*units.jsonl"):
        BM25Index.load(tmp_path / "ix")
    with pytest.raises(PersistError, match="corrupt"):
        BM25Index.load(tmp_path / "ix", verify=False)
    from funnel_core.embeddings import DenseIndex

    emb = np.eye(len(corpus_units), dtype=np.float32)
    DenseIndex().index(corpus_units, embeddings=emb).save(tmp_path / "dense")
    with pytest.raises(PersistError, match="not a BM25 index"):
        BM25Index.load(tmp_path / "dense")


def test_bad_input(corpus_units, index):
    with pytest.raises(ValueError, match="empty corpus"):
        BM25Index().index([])
    with pytest.raises(ValueError, match="duplicate unit id 'd0'"):
        BM25Index().index(corpus_units + [Unit(id="d0", text="again")])
    with pytest.raises(TypeError, match="expects Unit objects"):
        BM25Index().index(["plain string"])
    with pytest.raises(ValueError, match="k must be >= 1"):
        index.search("Paris", k=0)
    with pytest.raises(TypeError, match="query must be a str"):
        index.search(["Paris"])
    with pytest.raises(ValueError, match="unknown BM25 method"):
        BM25Index(method="bm26")
    with pytest.raises(ValueError, match="unknown stemmer language"):
        BM25Index(stemmer="klingon")
    with pytest.raises(RuntimeError, match="empty"):
        BM25Index().search("Paris")
    assert index.search("   ") == []


def test_concurrent_queries_match_sequential(index):
    queries = ["Paris", "capital Germany", "Shakespeare tragedy", "BM25 ranking", "vectors",
               "tower", "playwright poet", "cross-encoder"] * 8
    expected = [[(u.id, u.score) for u in index.search(q, k=4)] for q in queries]
    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(lambda q: [(u.id, u.score) for u in index.search(q, k=4)], queries))
    assert got == expected


def test_bm25_scores_helper():
    scores = bm25_scores("tower", ["the Eiffel tower", "a river", "tower of London tower"])
    assert scores[1] == 0.0 and scores[0] > 0 and scores[2] > 0
    assert bm25_scores("x", []) == []


def test_bm25_rerank_orders_tied_candidates():
    from funnel_core.rerank.bm25 import BM25Scorer

    units = [Unit(id="a", text="Berlin is a capital.", score=1.0), Unit(id="b", text="The Eiffel Tower.", score=1.0)]
    out = BM25Scorer()("Eiffel Tower", units)
    assert [u.id for u in out] == ["b", "a"] and out[0].scores["bm25_rerank"] > 0
    assert [u.id for u in (BM25Scorer() % 1)("Eiffel", units)] == ["b"]
