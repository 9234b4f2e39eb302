"""The clustered first stage: the top-``k`` clusters decide WHICH documents come back; each
document's score is its OWN BM25 score and the documents are sorted by it, best first (ties keep
cluster order, then member order); the cluster's score and rank stay in the bookkeeping. Before,
every member carried its cluster's score and documents came cluster by cluster, so a
document without a query term ranked above matching documents of the next cluster.

The reference is the Lucene BM25 formula written out here over the documents (tokenized with
the index's own tokenizer), not the index's code path: idf = ln(1 + (N - df + 0.5) / (df + 0.5)),
tf part = tf / (tf + k1 (1 - b + b |d| / avgdl)) (bm25s' "lucene" variant, no (k1 + 1) factor).
"""

from __future__ import annotations

import math
from collections import Counter

import pytest

from funnel_core import BM25Index, Unit
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index

# three linked groups (clusters by metadata links); inside each group the merge order is NOT the
# order of relevance for the queries below
GROUPS = {
    "river": [
        "The valley road follows old stone walls past farms and a mill.",
        "A river crosses the valley; the river floods the river meadows each spring.",
        "Boats on the river carry grain down the valley.",
        "The mill wheel turns in the river current.",
    ],
    "music": [
        "An orchestra rehearses in the hall every evening.",
        "The violin and the cello play a slow duet; the violin leads.",
        "A violin maker carves spruce tops by hand.",
        "Concert tickets sell out within the hour.",
    ],
    "space": [
        "The telescope records faint galaxies at night.",
        "A comet passes the telescope field; the comet tail glows.",
        "Astronomers publish a catalogue of stars.",
        "The comet returns every seventy years, a comet of legend.",
    ],
}
QUERIES = ["river valley mill", "violin cello duet", "comet telescope", "river violin comet",
           "valley farms stone"]
K1, B = 1.5, 0.75


def _documents(groups=GROUPS) -> list[Unit]:
    docs = []
    for g, texts in groups.items():
        ids = [f"{g}-{i}" for i in range(len(texts))]
        for i, t in enumerate(texts):
            docs.append(Unit(id=ids[i], text=t, metadata={"group": g, "funnel_links": [x for x in ids if x != ids[i]]}))
    return docs


def _reference_scores(query: str, docs: list[Unit]) -> dict[str, float]:
    tok = BM25Index()  # only its tokenizer: stemming and stopwords as the index uses them
    doc_tokens = tok.tokenize([d.text for d in docs])
    q_tokens = set(tok.tokenize([query])[0])
    n = len(docs)
    avgdl = sum(len(t) for t in doc_tokens) / n
    df = Counter(w for t in doc_tokens for w in set(t))
    out = {}
    for d, toks in zip(docs, doc_tokens):
        tf = Counter(toks)
        s = 0.0
        for w in q_tokens:
            if tf[w]:
                idf = math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5))
                s += idf * tf[w] / (tf[w] + K1 * (1 - B + B * len(toks) / avgdl))
        out[d.id] = s
    return out


def _expected(index: ClusteredBM25Index, query: str, k: int, docs: list[Unit]) -> list[str]:
    """Members of the top-``k`` clusters (cluster order, then member order), sorted by their own
    reference score (a stable sort: ties keep that order)."""
    ref = _reference_scores(query, docs)
    clusters = index.search(query, k=k, return_clusters=True)
    return sorted([m for c in clusters for m in c.metadata["members"]], key=lambda m: -ref[m])


@pytest.fixture(scope="module")
def index() -> ClusteredBM25Index:
    return ClusteredBM25Index(max_tokens=200, adjacency="links").index(_documents())


def test_documents_are_scored_and_sorted_by_their_own_bm25_score(index):
    docs = _documents()
    assert sorted(len(c.metadata["members"]) for c in index.clusters) == [4, 4, 4]
    differs = False
    for q in QUERIES:
        ref = _reference_scores(q, docs)
        got = index.search(q, k=3)
        clusters = index.search(q, k=3, return_clusters=True)
        assert [d.id for d in got] == _expected(index, q, 3, docs), q
        for d in got:  # the document's own score; the cluster's score and rank kept apart
            assert d.score == pytest.approx(ref[d.id], rel=1e-5, abs=1e-6)
            c = next(c for c in clusters if d.id in c.metadata["members"])
            assert d.funnel["cluster_id"] == c.id and d.funnel["cluster_score"] == c.score
            assert d.funnel["cluster_rank"] == clusters.index(c)
            assert d.scores == {"bm25": d.score}
        scores = [d.score for d in got]
        assert scores == sorted(scores, reverse=True)
        members = [m for c in clusters for m in c.metadata["members"]]
        differs |= members != [d.id for d in got]
    assert differs  # the merge order is not already the answer: the old behaviour fails here


def test_no_document_without_a_query_term_ranks_above_one_with_it():
    """A member without any query term must not come before a matching
    document, neither of its own cluster nor of the next one (before: each document carried its
    cluster's score, so the whole first cluster, matching or not, came first)."""
    groups = {  # the first cluster has one strong match and three documents without the terms
        "a": ["glacier glacier glacier ice shelf melt", "The bakery opens at six.",
              "Trains leave from platform four.", "The museum closes on Mondays."],
        "b": ["A glacier feeds the lake below.", "Ice covers the pond in winter.",
              "The ice shelf cracked.", "Summer festivals fill the square."],
    }
    docs = _documents(groups)
    index = ClusteredBM25Index(max_tokens=200, adjacency="links").index(docs)
    tok = BM25Index()
    for q in ["glacier ice shelf", "ice melt", "glacier"]:
        q_terms = set(tok.tokenize([q])[0])
        got = index.search(q, k=2)
        assert {d.funnel["cluster_rank"] for d in got} == {0, 1}, q  # both clusters opened
        has_term = [bool(q_terms & set(tok.tokenize([d.text])[0])) for d in got]
        first_miss = has_term.index(False)
        assert not any(has_term[first_miss:]), (q, [d.id for d in got])
        assert all(d.score == 0.0 for d, h in zip(got, has_term) if not h)
        assert all(d.score > 0.0 for d, h in zip(got, has_term) if h)


def test_the_query_is_tokenized_once_for_clusters_and_documents(index, monkeypatch):
    calls = []
    real = BM25Index.tokenize

    def counting(self, texts):
        calls.append(list(texts))
        return real(self, texts)

    monkeypatch.setattr(BM25Index, "tokenize", counting)
    index.search("river valley mill", k=2)
    assert calls == [["river valley mill"]]


def test_the_document_cap_keeps_the_best_documents_of_the_last_cluster(index):
    docs = _documents()
    for q in QUERIES:
        want = _expected(index, q, 1, docs)[:2]
        assert [d.id for d in index.search(q, k=1, max_documents=2)] == want


def test_order_survives_save_load_add_and_delete(tmp_path, index):
    index.save(tmp_path / "c")
    loaded = ClusteredBM25Index.load(tmp_path / "c")
    for q in QUERIES:
        assert [(d.id, d.score) for d in loaded.search(q, k=3)] == \
            [(d.id, d.score) for d in index.search(q, k=3)]
    # add and delete change N, df and avgdl: the scores follow the new corpus
    grown = ClusteredBM25Index(max_tokens=200, adjacency="links").index(_documents())
    extra = Unit(id="river-4", text="The river river river mill.", metadata={"funnel_links": ["river-0"]})
    grown.add([extra])
    docs = _documents() + [extra]
    q = "river mill"
    got = grown.search(q, k=1)
    assert [d.id for d in got] == _expected(grown, q, 1, docs)
    ref = _reference_scores(q, docs)
    assert [d.score for d in got] == pytest.approx([ref[d.id] for d in got], rel=1e-5)
    grown.delete(["river-1", "space-1"])
    docs = [d for d in docs if d.id not in ("river-1", "space-1")]
    for q in QUERIES:
        assert [d.id for d in grown.search(q, k=3)] == _expected(grown, q, 3, docs), q


def test_framework_retrievers_return_the_same_order(index):
    from llama_index.core.schema import TextNode

    from langchain_funnel.retrievers import ClusteredBM25Retriever as LCRetriever
    from llama_index_funnel.retrievers import ClusteredBM25Retriever as LIRetriever

    docs = _documents()
    nodes = [TextNode(id_=d.id, text=d.text, metadata=dict(d.metadata)) for d in docs]
    li = LIRetriever.from_defaults(nodes=nodes, similarity_top_k=3, k_clusters=1, max_tokens=200,
                                   adjacency="links")
    lc = LCRetriever.from_texts([d.text for d in docs], [dict(d.metadata) for d in docs],
                                ids=[d.id for d in docs], k=3, k_clusters=1, max_tokens=200,
                                adjacency="links")
    for q in QUERIES:
        want = _expected(index, q, 1, docs)[:3]
        assert [n.node.node_id for n in li.retrieve(q)] == want
        assert [d.id for d in lc.invoke(q)] == want
        meta = lc.invoke(q)[0].metadata  # bookkeeping: flat, prefixed, beside the user's keys
        assert isinstance(meta["funnel_cluster_rank"], int) and "cluster_rank" not in meta
        assert meta["group"] in GROUPS and isinstance(meta["relevance_score"], float)


def test_cluster_settings_and_edits_are_honoured(index):
    """k_clusters / return_clusters are the same settings in both frameworks; the index's build
    settings pass through to the index; an edit is validated and changes what the next query
    opens; a per-call k_clusters overrides the setting; a typo raises."""
    from llama_index.core.schema import TextNode

    from langchain_funnel.retrievers import ClusteredBM25Retriever as LCRetriever
    from llama_index_funnel.retrievers import ClusteredBM25Retriever as LIRetriever

    docs = _documents()
    nodes = [TextNode(id_=d.id, text=d.text, metadata=dict(d.metadata)) for d in docs]
    li = LIRetriever.from_defaults(nodes=nodes, similarity_top_k=12, k_clusters=1, max_tokens=200,
                                   adjacency="links", knn_k=7)
    lc = LCRetriever.from_texts([d.text for d in docs], [dict(d.metadata) for d in docs],
                                ids=[d.id for d in docs], k=12, k_clusters=1, max_tokens=200,
                                adjacency="links", knn_k=7)
    assert li.index.knn_k == lc.index.knn_k == 7 and li.index.max_tokens == 200  # to the index
    assert (li.k_clusters, li.return_clusters) == (lc.k_clusters, lc.return_clusters) == (1, False)
    q = "river violin comet"
    assert [d.id for d in lc.invoke(q, k_clusters=2)] == _expected(index, q, 2, docs)
    assert [d.id for d in lc.invoke(q)] == _expected(index, q, 1, docs)  # the setting again
    for r in (li, lc):
        r.k_clusters = 2  # two clusters opened at the next query: all their members
        got = [n.node.node_id for n in r.retrieve(q)] if r is li else [d.id for d in r.invoke(q)]
        assert got == _expected(index, q, 2, docs)
        r.return_clusters = True  # the clusters themselves, capped by k_clusters
        out = r.retrieve(q) if r is li else r.invoke(q)
        assert len(out) == 2
        out = r.retrieve(q) if r is li else r.invoke(q, k=1)  # ... and by k
        assert len(out) == (2 if r is li else 1)
    for r in (li, lc):
        with pytest.raises(ValueError, match="k_clusters"):
            r.k_clusters = 0
    with pytest.raises(TypeError, match="kclusters"):
        LIRetriever(index, nodes, kclusters=2)
    with pytest.raises(TypeError, match=r"kclusters.*k_clusters"):
        LCRetriever(index=lc.index, kclusters=2)
    with pytest.raises(TypeError, match=r"ClusteredBM25Retriever.*preprocess_func.*accepted"):
        LCRetriever.from_texts(["a b"], preprocess_func=str.split)
    with pytest.raises(TypeError, match=r"ClusteredBM25Retriever.*language.*accepted"):
        LIRetriever.from_defaults(nodes=nodes, language="en")
