"""The core data flow: Unit, Stage composition (% and >>), Funnel trace, later chunking."""

import asyncio

import pytest

from funnel_core import BM25Index, BM25Retrieve, Funnel, LaterChunking, OpenClusters, Unit, word_windows
from funnel_core.funnel import FunctionStage
from funnel_core.text import split_sentences


def test_unit_rejects_non_text():
    with pytest.raises(TypeError, match="Unit.text must be a str"):
        Unit(id="x", text=None)  # type: ignore[arg-type]


def test_rescored_keeps_history_and_does_not_mutate():
    u = Unit(id="a", text="t", score=1.0)
    v = u.rescored(2.5, "s1").rescored(0.5, "s2")
    assert u.score == 1.0 and "scores" not in u.metadata
    assert v.score == 0.5 and v.scores == {"s1": 2.5, "s2": 0.5}
    assert type(v.score) is float


def test_split_sentences_handles_abbreviations():
    s = split_sentences("Dr. Smith met J. Doe in the U.S. on Monday. They talked, e.g. about BM25! Fine?")
    assert s == ["Dr. Smith met J. Doe in the U.S. on Monday.", "They talked, e.g. about BM25!", "Fine?"]


def test_word_windows_sentence_aware_and_overlap():
    text = " ".join(f"Sentence number {i} has five words." for i in range(10))  # 6 words each
    wins = word_windows(text, words=12)
    assert all(len(w.split()) <= 12 for w in wins)
    assert " ".join(wins).split() == text.split()
    over = word_windows(text, words=12, overlap=3)
    assert over[1].split()[:3] == over[0].split()[-3:]
    with pytest.raises(ValueError, match="overlap"):
        word_windows(text, words=5, overlap=5)


def test_later_chunking_sets_parent_and_position():
    parent = Unit(id="doc", text=" ".join(["word"] * 250), score=3.0, metadata={"title": "T"}, level="document")
    kids = LaterChunking(words=100)("q", [parent])
    assert [k.id for k in kids] == ["doc#0", "doc#1", "doc#2"]
    assert all(k.parent_id == "doc" and k.funnel["parent_score"] == 3.0 for k in kids)
    assert [k.funnel["position"] for k in kids] == [0, 1, 2]
    assert kids[0].metadata["title"] == "T" and kids[0].level == "passage"


def test_funnel_composition_cutoffs_and_trace(corpus_units):
    index = BM25Index().index(corpus_units)
    funnel = BM25Retrieve(index, k=50) % 3 >> LaterChunking(words=4) % 5
    assert isinstance(funnel, Funnel) and len(funnel) == 2
    res = funnel.search("capital of France Paris", answers=["Paris"])
    assert len(res.units) == 5
    names = [r.name for r in res.trace.stages]
    assert names == ["bm25 % 3", "later_chunking(4w) % 5"]
    assert res.trace.stages[0].units_out == 3 and res.trace.stages[1].units_in == 3
    assert res.trace.stages[0].answer_recall == 1.0
    assert all(r.seconds >= 0 for r in res.trace.stages)
    # the trace is on the result, not copied onto every unit
    assert all("funnel_trace" not in u.metadata and "funnel_trace" not in u.funnel for u in res.units)
    assert res.trace.to_dict()["stages"][0]["name"] == "bm25 % 3"


def test_funnel_accepts_plain_callables_and_nests(corpus_units):
    index = BM25Index().index(corpus_units)
    reverse = FunctionStage(lambda q, us: list(reversed(us)), name="reverse")
    inner = BM25Retrieve(index, k=4) >> reverse
    outer = inner >> (lambda q, us: us[:1])
    out = outer("Shakespeare Hamlet tragedy")
    assert len(out) == 1 and len(outer) == 3


def test_funnel_empty_query_and_bad_query(corpus_units):
    funnel = Funnel([BM25Retrieve(BM25Index().index(corpus_units))])
    assert funnel.search("   ").units == []
    with pytest.raises(TypeError, match="query must be a str"):
        funnel.search(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cut-off k must be >= 1"):
        BM25Retrieve(BM25Index().index(corpus_units)) % 0


def test_funnel_async_matches_sync(corpus_units):
    funnel = BM25Retrieve(BM25Index().index(corpus_units), k=5) >> LaterChunking(words=5)
    sync = funnel.search("BM25 ranking search engines")
    asyn = asyncio.run(funnel.asearch("BM25 ranking search engines"))
    assert [u.id for u in sync.units] == [u.id for u in asyn.units]
    assert [r.name for r in sync.trace.stages] == [r.name for r in asyn.trace.stages]


def test_open_clusters(corpus_units):
    cluster = Unit(id="c0", text="...", score=2.0, metadata={"members": ["d0", "d2"]}, level="cluster")
    docs = OpenClusters(corpus_units)("q", [cluster])
    assert [d.id for d in docs] == ["d0", "d2"]
    assert docs[0].funnel["cluster_id"] == "c0" and docs[0].funnel["cluster_rank"] == 0
    assert docs[0].score == 2.0 and docs[0].parent_id == "c0"
