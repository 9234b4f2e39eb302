"""Best-practice RAG components in funnel_core: hybrid fusion, repacking, extractive compression,
query classification (Wang et al. 2024, "Searching for Best Practices in RAG")."""

import asyncio

import numpy as np
import pytest

from funnel_core.best_practices.classify import NotFittedError, QueryClassifier, RetrievalGate, load_labelled_queries
from funnel_core.best_practices.compress import ExtractiveCompressor
from funnel_core.best_practices.fusion import HybridRetrieve, alpha_fusion, normalize_scores, rrf_fusion
from funnel_core.best_practices.repack import Repack, repack
from funnel_core.bm25 import BM25Index, BM25Retrieve
from funnel_core.embeddings import DenseIndex, DenseRetrieve, SentenceEmbedder
from funnel_core.errors import PersistError
from funnel_core.text import split_sentences
from funnel_core.units import Unit

pytestmark = pytest.mark.models  # builds or loads a model in most tests


def U(i, s):
    return Unit(id=i, text=f"text {i}", score=s)


@pytest.fixture(scope="module")
def embedder():
    return SentenceEmbedder()


@pytest.fixture(scope="module")
def indexes(corpus_units, embedder):
    return BM25Index().index(corpus_units), DenseIndex(embedder).index(corpus_units)


# -- normalisation and fusion ------------------------------------------------------------------
def test_minmax_and_zscore_normalisation():
    assert normalize_scores([2.0, 4.0, 3.0]) == [0.0, 1.0, 0.5]
    assert normalize_scores([5.0, 5.0]) == [1.0, 1.0]
    z = normalize_scores([1.0, 2.0, 3.0], "zscore")
    assert abs(sum(z)) < 1e-9 and z[2] > z[1] > z[0]
    assert normalize_scores([], "minmax") == []
    with pytest.raises(ValueError, match="unknown normalization 'l2'"):
        normalize_scores([1.0], "l2")


def test_alpha_fusion_matches_the_paper_formula_by_hand():
    sparse = [U("a", 10.0), U("b", 6.0), U("c", 2.0)]   # minmax -> a 1, b .5, c 0
    dense = [U("b", 0.9), U("d", 0.5), U("a", 0.1)]     # minmax -> b 1, d .5, a 0
    out = alpha_fusion(sparse, dense, alpha=0.3)
    got = {u.id: u.score for u in out}
    assert got == pytest.approx({"a": 0.3 * 1 + 0.0, "b": 0.3 * 0.5 + 1.0,
                                 "c": 0.3 * 0.0 + 0.0, "d": 0.3 * 0.0 + 0.5})
    assert [u.id for u in out] == ["b", "d", "a", "c"]
    b = out[0]
    assert b.funnel["sparse_rank"] == 1 and b.funnel["dense_rank"] == 0
    assert out[1].funnel["sparse_rank"] is None  # d: dense only, gets the sparse floor 0
    assert type(b.score) is float and b.scores["hybrid"] == b.score
    # alpha = 1 weighs both sides equally; alpha = 0 is the dense ranking
    assert [u.id for u in alpha_fusion(sparse, dense, alpha=0.0)][:3] == ["b", "d", "a"]
    assert alpha_fusion(sparse, dense, alpha=1.0)[0].score == pytest.approx(1.5)


def test_alpha_fusion_keeps_both_sides_score_history_and_does_not_mutate():
    s = [U("a", 3.0).rescored(3.0, "bm25")]
    d = [U("a", 0.7).rescored(0.7, "dense")]
    out = alpha_fusion(s, d)
    assert out[0].scores == {"bm25": 3.0, "dense": 0.7, "hybrid": pytest.approx(1.3)}
    assert s[0].score == 3.0 and "hybrid" not in s[0].scores


def test_rrf_fusion_by_hand():
    out = rrf_fusion([U("a", 1), U("b", 1)], [U("b", 1), U("c", 1)], k=60)
    got = {u.id: u.score for u in out}
    assert got["b"] == pytest.approx(1 / 62 + 1 / 61)
    assert got["a"] == pytest.approx(1 / 61) and got["c"] == pytest.approx(1 / 62)
    assert [u.id for u in out] == ["b", "a", "c"]
    # RRF needs no scores
    assert rrf_fusion([Unit(id="x", text="x")], [])[0].id == "x"
    with pytest.raises(ValueError, match="no score"):
        alpha_fusion([Unit(id="x", text="x")], [])


def test_hybrid_retrieve_over_bm25_and_dense(indexes):
    bm25, dense = indexes
    hybrid = HybridRetrieve(BM25Retrieve(bm25, k=5), DenseRetrieve(dense, k=5), alpha=0.3, k=3)
    out = hybrid("Which tragedy did Shakespeare write?")
    assert len(out) == 3 and out[0].id in {"d5", "d6"}
    assert {"bm25", "dense", "hybrid"} <= set(out[0].scores)
    assert all(a.score >= b.score for a, b in zip(out, out[1:]))
    assert len((hybrid % 2)("Shakespeare")) == 2
    rrf = HybridRetrieve(bm25.search, dense.search, method="rrf")  # plain callables work too
    assert rrf("Eiffel Tower in Paris")[0].id == "d2"
    assert asyncio.run(hybrid.acall("Which tragedy did Shakespeare write?")) == out


def test_hybrid_sides_receive_different_queries(indexes):
    """HyDE: the dense side embeds a hypothetical document, the sparse side keeps the query."""
    bm25, dense = indexes
    seen = {}

    def sparse_side(q):
        seen["sparse"] = q
        return bm25.search(q, k=5)

    def dense_side(q):
        seen["dense"] = q
        return dense.search(q, k=5)

    hyde = lambda q: "Hamlet is a play written by William Shakespeare."  # noqa: E731
    hybrid = HybridRetrieve(sparse_side, dense_side, dense_query=hyde)
    hybrid("who wrote Hamlet")
    assert seen == {"sparse": "who wrote Hamlet", "dense": hyde("")}
    hybrid.retrieve("who wrote Hamlet", dense_query="Berlin is in Germany.")
    assert seen["dense"] == "Berlin is in Germany."


def test_hybrid_bad_input(indexes):
    bm25, dense = indexes
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\], got 1.5"):
        HybridRetrieve(bm25.search, dense.search, alpha=1.5)
    with pytest.raises(ValueError, match="k must be >= 1"):
        HybridRetrieve(bm25.search, dense.search, k=0)
    with pytest.raises(ValueError, match="unknown fusion method"):
        HybridRetrieve(bm25.search, dense.search, method="sum")
    with pytest.raises(TypeError, match="sparse side must be"):
        HybridRetrieve("bm25", dense.search)
    hybrid = HybridRetrieve(bm25.search, dense.search)
    assert hybrid("   ") == [] and hybrid.retrieve("") == []
    with pytest.raises(TypeError, match="query must be a str"):
        hybrid(7)


# -- repacking -------------------------------------------------------------------------------
def test_repack_orders():
    units = [U(str(i), 10.0 - i) for i in range(5)]
    assert [u.id for u in repack(units, "forward")] == ["0", "1", "2", "3", "4"]
    assert [u.id for u in repack(units, "reverse")] == ["4", "3", "2", "1", "0"]
    assert [u.id for u in repack(units, "sides")] == ["0", "2", "4", "3", "1"]
    out = Repack()("q", units)  # default: reverse, best last
    assert out[-1].id == "0" and out[-1].funnel["retrieval_rank"] == 0
    assert out[-1].funnel["repack_position"] == 4 and out[-1].score == 10.0
    assert "repack_position" not in units[0].metadata
    assert [u.id for u in (Repack() % 2)("q", units)] == ["1", "0"]  # cut best 2, then reverse
    with pytest.raises(ValueError, match="unknown repack order 'backwards'"):
        Repack("backwards")


# -- extractive compression ------------------------------------------------------------------------
DOCS = [
    Unit(id="p1", text="The Eiffel Tower is in Paris. The tower was completed in 1889. Gustave Eiffel's "
                       "company designed and built it. Many tourists visit every year.", score=2.0),
    Unit(id="p2", text="Bananas are rich in potassium. They grow in tropical regions. "
                       "Bananas are often eaten at breakfast.", score=1.0),
]


@pytest.mark.parametrize("method", ["bm25", "embedding"])
def test_extractive_compressor_keeps_relevant_sentences_in_order(method, embedder):
    comp = ExtractiveCompressor(method=method, ratio=0.4, embedder=embedder)
    out = comp("When was the Eiffel Tower completed?", DOCS)
    total = sum(len(d.text.split()) for d in DOCS)
    kept = sum(len(u.text.split()) for u in out)
    assert kept <= 0.4 * total
    assert out[0].id == "p1" and "completed in 1889" in out[0].text
    assert "potassium" not in " ".join(u.text for u in out)
    info = out[0].funnel
    assert info["compression_kept_tokens"] == len(out[0].text.split())
    assert (info["compression_original_tokens"] == len(DOCS[0].text.split())
            and info["compression_total_sentences"] == 4)
    # kept sentences stay in their original order
    kept_sents = split_sentences(out[0].text)
    positions = [DOCS[0].text.index(s) for s in kept_sents]
    assert positions == sorted(positions) and len(kept_sents) == info["compression_kept_sentences"]
    assert DOCS[0].text.startswith("The Eiffel Tower is in Paris.")  # input not mutated


def test_extractive_compressor_embedding_cache_gives_the_same_selection(embedder):
    plain = ExtractiveCompressor(embedder=embedder, ratio=0.4)
    cached = ExtractiveCompressor(embedder=embedder, ratio=0.4, cache_size=5)
    assert cached.precompute(DOCS) == 5  # 7 sentences, LRU keeps the last 5
    q = "When was the Eiffel Tower completed?"
    assert [u.text for u in cached(q, DOCS)] == [u.text for u in plain(q, DOCS)]
    assert plain.score_sentences(q, ["The tower was completed in 1889."]) == pytest.approx(
        cached.score_sentences(q, ["The tower was completed in 1889."]), abs=1e-5)
    with pytest.raises(ValueError, match="cache_size must be an int >= 0"):
        ExtractiveCompressor(cache_size=-1)


def test_extractive_compressor_token_budget_and_unit_scope():
    comp = ExtractiveCompressor(method="bm25", ratio=1.0, max_tokens=7)
    out = comp("Eiffel Tower completed 1889", DOCS)
    assert [u.text for u in out] == ["The tower was completed in 1889."]
    per_unit = ExtractiveCompressor(method="bm25", ratio=0.5, scope="unit")("bananas breakfast", DOCS)
    assert [u.id for u in per_unit] == ["p1", "p2"]  # unit scope never drops a unit
    assert "breakfast" in per_unit[1].text
    assert ExtractiveCompressor(method="bm25")("q", []) == []


def test_extractive_compressor_bad_input():
    for bad in (0, 1.5, -0.2):
        with pytest.raises(ValueError, match=r"ratio must be in \(0, 1\]"):
            ExtractiveCompressor(ratio=bad)
    with pytest.raises(TypeError, match="ratio must be a number"):
        ExtractiveCompressor(ratio="0.4")
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        ExtractiveCompressor(max_tokens=0)
    with pytest.raises(ValueError, match="unknown compression method"):
        ExtractiveCompressor(method="tfidf")
    # an empty query compresses nothing: the documents pass in their order, as in every stage
    assert ExtractiveCompressor(method="bm25")("", DOCS) == list(DOCS)


# -- query classification ----------------------------------------------------------------------------
def test_packaged_labelled_set_covers_15_task_types():
    rows = load_labelled_queries()
    assert len(rows) >= 200 and len({r["task"] for r in rows}) == 15
    assert {r["label"] for r in rows} == {"retrieval", "sufficient"}
    assert len({r["query"] for r in rows}) == len(rows)


@pytest.fixture(scope="module")
def classifier(embedder):
    return QueryClassifier.pretrained(embedder=embedder)


def test_query_classifier_routes_unseen_queries(classifier):
    need = ["What is the recommended dosage of ibuprofen for children?",
            "Who won the Nobel Prize in Physics in 1921?",
            "What are the opening hours of the Prado museum this Sunday?"]
    enough = ["Translate into German: 'The weather is lovely today.'",
              "Summarize this in one sentence: The shop opens at nine. It closes at five. "
              "It is closed on Sundays.",
              "What is 12 times 14?"]
    assert [classifier.needs_retrieval(q) for q in need] == [True] * 3
    assert [classifier.needs_retrieval(q) for q in enough] == [False] * 3
    probs = classifier.predict_proba(need + enough)
    assert all(type(p) is float and 0 <= p <= 1 for p in probs)
    assert classifier.predict(need[:1]) == ["retrieval"]
    assert classifier.needs_retrieval("  ") is False


def test_pretrained_weights_are_reused_not_shared(classifier, embedder):
    again = QueryClassifier.pretrained(embedder=embedder)
    assert again is not classifier and np.array_equal(again.coef_, classifier.coef_)
    again.coef_[0] += 1.0
    assert not np.array_equal(again.coef_, classifier.coef_)


def test_query_classifier_save_load_roundtrip(classifier, embedder, tmp_path):
    classifier.save(tmp_path / "clf")
    loaded = QueryClassifier.load(tmp_path / "clf", embedder=embedder)
    qs = ["Who painted the Mona Lisa?", "Rewrite this politely: give me the file."]
    assert loaded.predict_proba(qs) == pytest.approx(classifier.predict_proba(qs))
    assert np.allclose(loaded.coef_, classifier.coef_)
    with pytest.raises(PersistError, match="no query classifier at"):
        QueryClassifier.load(tmp_path / "missing")


def test_query_classifier_cross_validation_reports_held_out_accuracy(embedder):
    rows = load_labelled_queries()[::3]
    cv = QueryClassifier(embedder=embedder).cross_validate(
        [r["query"] for r in rows], [r["label"] for r in rows], folds=3)
    assert len(cv["cv_accuracy_per_fold"]) == 3 and cv["cv_accuracy_mean"] > 0.7


def test_query_classifier_bad_input(embedder):
    clf = QueryClassifier(embedder=embedder)
    with pytest.raises(NotFittedError, match="not trained"):
        clf.needs_retrieval("who wrote Hamlet?")
    with pytest.raises(NotFittedError):
        RetrievalGate(clf, lambda q, us: us)
    with pytest.raises(ValueError, match="unknown label 'maybe'"):
        clf.fit(["a", "b"], ["retrieval", "maybe"])
    with pytest.raises(ValueError, match="both labels"):
        clf.fit(["a", "b"], ["retrieval", "retrieval"])
    with pytest.raises(ValueError, match="2 queries but 1 labels"):
        clf.fit(["a", "b"], ["retrieval"])


def test_retrieval_gate_skips_retrieval_for_sufficient_queries(classifier, indexes):
    bm25, _ = indexes
    gate = RetrievalGate(classifier, BM25Retrieve(bm25, k=3))
    assert gate("Who wrote the tragedy Hamlet?")[0].id == "d5"
    assert gate("Translate into French: 'Shakespeare wrote Hamlet.'") == []


def test_random_compression_is_a_seeded_control_blind_to_the_query():
    """method="random": the same budget as the other methods, sentences drawn regardless of the
    query (so the one sentence that matches it is kept about as often as any other), the same
    sentences for the same query and seed."""
    sentences = [f"Sentence {w} has five words." for w in ("alpha", "bravo", "delta", "echo", "golf",
                                                            "hotel", "india", "kilo", "lima", "mike")]
    unit = [Unit(id="d", text=" ".join(sentences))]
    comp = ExtractiveCompressor(method="random", ratio=0.3)
    kept = {q: comp(q, unit)[0].text for q in (f"question {i} about alpha" for i in range(300))}
    assert all(len(t.split()) == 15 for t in kept.values())  # 3 of 10 five-word sentences: 30% of 50 words
    share_alpha = sum("alpha" in t for t in kept.values()) / len(kept)
    assert 0.2 < share_alpha < 0.4  # bm25 would keep the "alpha" sentence every time
    assert ExtractiveCompressor(method="bm25", ratio=0.3)("about alpha", unit)[0].text.startswith("Sentence alpha")
    q = "question 7 about alpha"
    assert comp(q, unit)[0].text == kept[q]  # deterministic per (seed, query)
    assert len({ExtractiveCompressor(method="random", ratio=0.3, seed=s)(q, unit)[0].text for s in range(20)}) > 5
