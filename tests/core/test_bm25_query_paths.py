"""The fast BM25 query path against references: bm25s' own tokenizer, a full sort of
bm25s' score vector, and copy safety of the cheap hit copies."""

import dataclasses
import random

import numpy as np
import pytest

from funnel_core import BM25Index, Unit
from funnel_core.bm25 import METHODS
from funnel_core.bm25.index import _hit

WORDS = ("the running runner runs ran quickly quick cities city's CITY Paris parisian ranking "
         "ranked ranks of and a an to tower towers lattice iron Eiffel école naïve x y z 42 4x4 "
         "don't it's über straße").split()


def _texts(n, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 14))) for _ in range(n)]


@pytest.mark.parametrize("config", [
    {}, {"stemmer": None}, {"stopwords": None}, {"stopwords": ["tower", "the"]}, {"lower": False},
    {"token_pattern": r"(?u)\b\w+\b", "stopwords": None}, {"stopwords": "fr", "stemmer": "french"},
])
def test_tokenize_equals_bm25s_tokenize(config):
    import bm25s

    index = BM25Index(**config)
    texts = _texts(300) + ["", "   ", "THE", "Running-runners; ranks!"]
    stop = index.config["stopwords"]
    reference = bm25s.tokenize(texts, lower=index.config["lower"], token_pattern=index.config["token_pattern"],
                               stopwords=stop if stop is not None else [], stemmer=index._stemmer(),
                               return_ids=False, show_progress=False)
    assert index.tokenize(texts) == reference
    assert [index.tokenize([t])[0] for t in texts] == reference  # the one-query path too


def _reference_top(index, query, k):
    """Full sort of bm25s' score vector: positive scores only, score descending, index ascending."""
    scores = index.get_scores(query)
    pos = [i for i in range(len(scores)) if scores[i] > 0]
    pos.sort(key=lambda i: (-float(scores[i]), i))
    return [(index.units[i].id, float(scores[i])) for i in pos[:k]]


@pytest.mark.parametrize("engine", ["numpy", "numba"])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("k", [1, 5, 200])
def test_search_equals_a_full_sort_of_bm25s_scores(method, k, engine):
    """Both engines against a full sort of the numpy engine's bm25s score vector (np.add.at in
    float32): the compiled kernel must sum in the same order (equal floats), keep positive
    scores only, and break the many ties of this small vocabulary by index."""
    if engine == "numba":
        pytest.importorskip("numba")
    texts = _texts(150, seed=1)
    texts[0] = texts[0] + " tower"  # at least one match
    index = BM25Index.from_texts(texts, method=method, engine=engine)
    reference = BM25Index.from_texts(texts, method=method)
    queries = ["tower of Paris", "running quickly", "the", "xylophone", "ranks city tower lattice",
               "tower tower iron"]  # a repeated token counts twice
    many = index.search_many(queries, k=k)
    threaded = index.search_many(queries, k=k, n_threads=2)
    for q, got, got2 in zip(queries, many, threaded):
        want = _reference_top(reference, q, k)
        assert [(u.id, u.score) for u in got] == want
        assert [(u.id, u.score) for u in index.search(q, k=k)] == want
        assert [(u.id, u.score) for u in got2] == want
        assert [u.funnel["bm25_rank"] for u in got] == list(range(len(got)))
        assert all(u.scores == {"bm25": u.score} for u in got)


def test_filter_on_the_fast_path_matches_the_reference():
    texts = _texts(120, seed=2)
    meta = [{"even": i % 2 == 0} for i in range(len(texts))]
    index = BM25Index.from_texts(texts, metadatas=meta)
    got = index.search("tower running Paris", k=10, filter={"even": True})
    want = [(i, s) for i, s in _reference_top(index, "tower running Paris", len(texts))
            if int(i) % 2 == 0][:10]
    assert [(u.id, u.score) for u in got] == want and got


def test_a_hit_sets_every_unit_field():
    unit = Unit(id="a", text="t", score=3.0, metadata={"k": 1}, parent_id="p", level="document",
                source=object())
    hit = _hit(unit, 2.5, "bm25", 4, True)
    for f in dataclasses.fields(Unit):
        assert f.name in vars(hit), f"_hit does not set Unit.{f.name}"
    assert hit.to_dict() == {"id": "a", "text": "t", "score": 2.5, "parent_id": "p", "level": "document",
                             "metadata": {"k": 1}, "funnel": {"score_bm25": 2.5, "bm25_rank": 4}}
    assert hit.source is unit.source and unit.metadata == {"k": 1} and unit.score == 3.0


@pytest.mark.parametrize("metadata", [
    {"title": "Paris", "year": 2020, "pair": (1, 2)},            # immutable values: shallow copy
    {"tags": ["geo", "fr"], "nested": {"a": [1]}},               # mutable values: deep copy
    {"scores": {"earlier": 1.0}, "title": "Paris"},              # a user's "scores" key is theirs
])
def test_editing_returned_units_never_changes_the_index(metadata):
    import copy

    units = [Unit(id="a", text="Paris tower", metadata=copy.deepcopy(metadata)),
             Unit(id="b", text="London bridge", metadata={})]
    index = BM25Index().index(units)
    first = index.search("Paris", k=2)
    hit = first[0]
    hit.metadata["title"] = "changed"
    hit.metadata.setdefault("scores", {})["mine"] = 9.0
    hit.funnel["mine"] = 9.0
    for v in hit.metadata.values():
        if isinstance(v, list):
            v.append("x")
        if isinstance(v, dict):
            v["new"] = 1
    hit.text, hit.score = "edited", -1.0
    again = index.search("Paris", k=2)[0]
    assert again.metadata == metadata  # a stage never writes the user's metadata
    assert again.funnel == {"score_bm25": again.score, "bm25_rank": 0}
    assert again.text == "Paris tower" and again.score == first[0].scores["bm25"]
    assert index.units[0].metadata == metadata and index.units[0].text == "Paris tower"


def test_numba_engine_filters_like_numpy_in_threads_and_alone():
    """A filter (mask) with k larger than what it allows, batches split over threads, and a
    batch that has empty queries: both engines return the same ids and scores."""
    pytest.importorskip("numba")
    units = [Unit(id=str(i), text=t, metadata={"even": i % 2 == 0}) for i, t in enumerate(_texts(200, seed=5))]
    a, b = BM25Index().index(units), BM25Index(engine="numba").index(units)
    queries = ["tower Paris running", "", "lattice iron tower the", "quick", "zzz unknown", "ranks"] * 3
    for kw in ({"k": 3}, {"k": 150, "filter": {"even": True}}, {"k": 7, "n_threads": 3}):
        want = [[(u.id, u.score) for u in r] for r in a.search_many(queries, **kw)]
        assert [[(u.id, u.score) for u in r] for r in b.search_many(queries, **kw)] == want
        assert any(want) and all(len(r) <= kw["k"] for r in want)
    evens = b.search_many(["tower"], k=150, filter={"even": True})[0]
    assert evens and all(int(u.id) % 2 == 0 for u in evens)


def test_numba_backend_gives_the_same_results_when_installed():
    pytest.importorskip("numba")
    texts = _texts(80, seed=3)
    numpy_index = BM25Index.from_texts(texts)
    numba_index = BM25Index.from_texts(texts, engine="numba")
    q = ["tower Paris running", "lattice iron", "the"]
    a, b = numpy_index.search_many(q, k=7), numba_index.search_many(q, k=7)
    assert [[u.score for u in r] for r in a] == [[u.score for u in r] for r in b]
    assert np.allclose([len(r) for r in a], [len(r) for r in b])


@pytest.mark.parametrize("enabled_before", [True, False])
def test_search_many_leaves_the_garbage_collector_as_it_found_it(enabled_before):
    """search_many pauses the cyclic GC while it builds a batch's hits (they hold no cycles);
    whatever the collector's state was, it is the same afterwards, and the hits equal search's."""
    import gc

    idx = BM25Index().index([Unit(id=str(i), text=f"alpha beta doc{i} gamma{i % 7}") for i in range(50)])
    queries = ["alpha gamma3", "beta doc7", "gamma1"]
    single = [idx.search(q, k=20) for q in queries]
    (gc.enable if enabled_before else gc.disable)()
    try:
        batch = idx.search_many(queries, k=20)
        assert gc.isenabled() is enabled_before
    finally:
        gc.enable()
    assert [[(u.id, u.score) for u in r] for r in batch] == [[(u.id, u.score) for u in r] for r in single]


def test_auto_engine_is_numba_where_installed_and_numpy_elsewhere(monkeypatch):
    """engine='auto' (the default) scores with the compiled kernel when numba imports, with numpy
    when it does not (same results either way); engine='numba' without numba is refused with
    the fix."""
    pytest.importorskip("numba")
    from funnel_core.bm25 import _numba as bm25_numba
    from funnel_core.bm25 import index as bm25_index

    texts = _texts(120, seed=7)
    index = BM25Index.from_texts(texts)
    assert index.config["engine"] == "auto"
    calls = []
    real = bm25_numba.search_range
    monkeypatch.setattr(bm25_numba, "search_range", lambda *a: calls.append(1) or real(*a))
    with_numba = [(u.id, u.score) for u in index.search("tower Paris", k=9)]
    assert calls, "auto did not use the compiled kernel although numba is installed"
    monkeypatch.setattr(bm25_index, "_numba_installed", lambda: False)
    calls.clear()
    assert [(u.id, u.score) for u in index.search("tower Paris", k=9)] == with_numba
    assert not calls
    with pytest.raises(ImportError, match=r"funnel-rag\[fast\]"):
        BM25Index(engine="numba")


def _zipf_texts(n, vocab=400, seed=11):
    """Texts over a Zipf-like vocabulary: a few very common terms (long postings, many ties at
    small k) and a long tail (short postings)."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(vocab)]
    p = 1.0 / np.arange(1, vocab + 1)
    p /= p.sum()
    return [" ".join(rng.choice(words, size=int(rng.integers(3, 30)), p=p)) for _ in range(n)]


@pytest.mark.parametrize("engine", ["numpy", "numba"])
@pytest.mark.parametrize("method", ["lucene", "bm25l"])
def test_a_batch_returns_what_each_query_returns_alone(engine, method):
    """search_many scores and cuts a batch together (the numpy engine in blocks of queries, one
    scatter-add and one partition per block; the compiled engine in threads); each query's hits
    must be exactly the ones a full sort of its own bm25s score vector gives, and the ones
    search() gives it alone, at every k up to the whole index, with and without a filter, in
    blocks split over threads."""
    if engine == "numba":
        pytest.importorskip("numba")
    from funnel_core.bm25 import index as bm25_module  # BLOCK_CELLS is read there

    texts = _zipf_texts(500)
    units = [Unit(id=f"d{i}", text=t, metadata={"even": i % 2 == 0}) for i, t in enumerate(texts)]
    index = BM25Index(method=method, engine=engine).index(units)
    reference = BM25Index(method=method, engine="numpy").index(units)
    rng = random.Random(5)
    vocab = [f"w{i}" for i in range(420)]  # w400.. are not in the index
    queries = [" ".join(rng.choice(vocab[:60] if j % 3 else vocab) for _ in range(rng.randint(1, 8)))
               for j in range(70)] + ["", "w5 w5 w5", "unknownword", "w399"]
    full = [_reference_top(reference, q, len(units)) if q else [] for q in queries]
    for k in (1, 10, 100, len(units)):
        for kw in ({}, {"filter": {"even": True}}, {"n_threads": 2}):
            batch = index.search_many(queries, k=k, **kw)
            for q, got, ranked in zip(queries, batch, full):
                alone = index.search(q, k=k, filter=kw.get("filter"))
                assert [(u.id, u.score, u.funnel) for u in got] == \
                    [(u.id, u.score, u.funnel) for u in alone]
                want = [(i, s) for i, s in ranked if "filter" not in kw or int(i[1:]) % 2 == 0][:k]
                assert [(u.id, u.score) for u in got] == want
    # blocks smaller than the batch (the block size follows the index size): same hits
    small = bm25_module.BLOCK_CELLS
    try:
        bm25_module.BLOCK_CELLS = 7 * len(units)
        assert [[(u.id, u.score) for u in r] for r in index.search_many(queries, k=10, n_threads=3)] == \
            [[(u.id, u.score) for u in index.search(q, k=10)] for q in queries]
    finally:
        bm25_module.BLOCK_CELLS = small
