"""One conformance suite for :class:`funnel_core.index.SearchIndex`, run against every index:
BM25, clustered BM25 and dense, each in memory and on Milvus Lite.

Each check states which wrong implementation it catches. The Milvus cases are checked against
their in-memory counterpart (same ids), the in-memory ones against a reference computed from
their own unfiltered ranking. The dense cases embed with the packaged MiniLM (``slow`` tier);
the Milvus cases run where ``pymilvus`` and ``milvus_lite`` are installed.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any, Callable

import pytest

from funnel_core.bm25 import BM25Index
from funnel_core.embeddings import DenseIndex, SentenceEmbedder
from funnel_core.filters import Comparison, Condition, filter_predicate
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
from funnel_core.index import SearchIndex
from funnel_core.units import Unit

if TYPE_CHECKING:  # importable without pymilvus (it is imported on first connection)
    from funnel_core.backends.milvus import MilvusBM25Index, MilvusClusteredBM25Index, MilvusDenseIndex

HAVE_MILVUS = all(importlib.util.find_spec(m) is not None for m in ("pymilvus", "milvus_lite"))
needs_milvus = pytest.mark.skipif(not HAVE_MILVUS, reason="pymilvus / milvus-lite not installed "
                                  "(pip install 'funnel-rag[milvus]')")

TOPICS = {
    "geo": "city capital river mountain country border population map coast valley",
    "ir": "ranking retrieval index query document score search engine relevance term",
    "lit": "poem novel author tragedy play verse character chapter stage writer",
}
QUERIES = ["capital city of the country", "ranking documents for a search query",
           "tragedy play by an author", "river valley map", "index score relevance term"]
#: BM25 settings other than the defaults, so a load that forgets them scores differently
BM25: dict[str, Any] = {"k1": 1.2, "b": 0.5}


def corpus() -> list[Unit]:
    """36 documents over three topic vocabularies, with a few words of the next topic."""
    out = []
    names = list(TOPICS)
    for i in range(36):
        topic = names[i % 3]
        own = TOPICS[topic].split()
        other = TOPICS[names[(i + 1) % 3]].split()
        words = [own[(i * 7 + j * 3) % len(own)] for j in range(4 + i % 9)] + [other[i % len(other)]]
        out.append(Unit(id=f"doc-{i}", text=f"Document {i}. {' '.join(words)}.", level="document",
                        metadata={"topic": topic, "year": 2000 + i % 5,
                                  "tags": ["odd" if i % 2 else "even", f"t{i % 4}"]}))
    return out


CORPUS = corpus()


class Case:
    """One implementation: how to build it, and how to load what it saved."""

    def __init__(self, name: str, kind: str, where: str) -> None:
        self.name, self.kind, self.where = name, kind, where

    @property
    def clustered(self) -> bool:
        return self.kind == "clustered"


CASES = [Case("bm25-memory", "bm25", "memory"), Case("bm25-milvus", "bm25", "milvus"),
         Case("clustered-memory", "clustered", "memory"), Case("clustered-milvus", "clustered", "milvus"),
         Case("dense-memory", "dense", "memory"), Case("dense-milvus", "dense", "milvus")]


def _param(case: Case) -> Any:
    marks = []
    if case.where == "milvus":
        marks += [needs_milvus, pytest.mark.slow]  # an embedded Milvus per module: seconds
    if case.kind == "dense":
        marks += [pytest.mark.slow, pytest.mark.models]  # the packaged MiniLM
    return pytest.param(case, id=case.name, marks=marks)


PARAMS = [_param(c) for c in CASES]


class Built:
    """The indexes of this module, built once each (the Milvus ones from the in-memory ones'
    clusters and embeddings, so both hold the same thing)."""

    def __init__(self, request: pytest.FixtureRequest, folder: Any) -> None:
        self.request, self.folder = request, folder
        self.cache: dict[str, Any] = {}

    @property
    def db(self) -> str:
        return str(self.folder / "conformance.db")

    def embedder(self) -> SentenceEmbedder:
        if "embedder" not in self.cache:
            self.cache["embedder"] = SentenceEmbedder(self.request.getfixturevalue("minilm_path"))
        return self.cache["embedder"]

    def get(self, name: str) -> Any:
        if name not in self.cache:
            self.cache[name] = self._build(name)
        return self.cache[name]

    def _build(self, name: str) -> Any:
        if name == "bm25-memory":
            return BM25Index(engine="numpy", **BM25).index(CORPUS)
        if name == "clustered-memory":
            return ClusteredBM25Index(max_tokens=40, adjacency="bm25", knn_k=3, knn_threshold=0.05,
                                      engine="numpy", **BM25).index(CORPUS)
        if name == "dense-memory":
            return DenseIndex(self.embedder(), index="exact").index(CORPUS)
        from funnel_core.backends.milvus import MilvusBM25Index, MilvusClusteredBM25Index, MilvusDenseIndex

        if name == "bm25-milvus":
            return MilvusBM25Index(self.db, "conf_bm25", **BM25).index(CORPUS)
        if name == "clustered-milvus":
            return MilvusClusteredBM25Index.from_index(self.get("clustered-memory"), self.db, "conf_clusters")
        if name == "dense-milvus":
            memory = self.get("dense-memory")
            return MilvusDenseIndex(self.db, "conf_dense", self.embedder(), index_type="FLAT").index(
                CORPUS, embeddings=memory.embeddings)
        raise AssertionError(name)

    def load(self, case: Case, path: Any) -> Any:
        index = self.get(case.name)
        if case.where == "milvus":
            extra = {"embedder": self.embedder()} if case.kind == "dense" else {}
            return type(index).load(path, uri=self.db, **extra)
        if case.kind == "dense":
            return DenseIndex.load(path, embedder=self.embedder())
        return type(index).load(path)


@pytest.fixture(scope="module")
def built(request, tmp_path_factory) -> Built:
    return Built(request, tmp_path_factory.mktemp("conformance"))


def ids(hits: list[Unit]) -> list[str]:
    return [u.id for u in hits]


def scores(hits: list[Unit]) -> list[float | None]:
    return [u.score for u in hits]


def cluster_ids(hits: list[Unit]) -> list[str]:
    """The clusters a clustered search opened, in cluster rank order."""
    ranked = sorted({(u.funnel["cluster_rank"], u.funnel["cluster_id"]) for u in hits})
    return [cid for _, cid in ranked]


# -- the checks ---------------------------------------------------------------------------------
def _signatures_conform(a: BM25Index, b: ClusteredBM25Index, c: DenseIndex, d: MilvusBM25Index,
                        e: MilvusClusteredBM25Index, f: MilvusDenseIndex) -> list[SearchIndex]:
    """For mypy (``mypy tests/core/test_index_conformance.py``): each class satisfies the
    protocol's signatures, not only its method names (the isinstance checks below see names)."""
    return [a, b, c, d, e, f]


class NoBatch:
    """Everything a SearchIndex has but ``search_many`` (what the in-memory clustered index
    lacked): the negative control of the isinstance check."""

    def index(self, units):
        return self

    def search(self, query, k=10, filter=None):
        return []

    def save(self, path):
        return None

    @classmethod
    def load(cls, path):
        return cls()

    def __len__(self):
        return 0


@pytest.mark.parametrize("case", PARAMS)
def test_is_a_search_index(case, built):
    """Catches an index that lacks one of the protocol's methods (e.g. no ``search_many``): it
    would not be a SearchIndex (the negative control shows the check can fail)."""
    index = built.get(case.name)
    assert isinstance(index, SearchIndex)
    assert not isinstance(NoBatch(), SearchIndex)
    assert len(index) == len(CORPUS)


@pytest.mark.parametrize("case", PARAMS)
@pytest.mark.parametrize("k", [1, 3, 5])
def test_search_returns_at_most_k_sorted_by_score(case, k, built):
    """Catches a search that returns more than ``k`` hits (``k`` clusters for a clustered
    index, opened into their documents), hits out of score order, repeated units, or scores
    that are not Python floats."""
    index = built.get(case.name)
    for q in QUERIES:
        hits = index.search(q, k=k)
        assert hits, q
        assert len(cluster_ids(hits) if case.clustered else hits) <= k
        assert len(set(ids(hits))) == len(hits)
        s = scores(hits)
        assert all(type(x) is float for x in s)
        assert s == sorted(s, reverse=True), (q, s)


@pytest.mark.parametrize("case", PARAMS)
def test_search_many_equals_search_for_each_query(case, built):
    """Catches a batched search that mixes queries up, drops or misaligns an empty query, or
    scores a query differently in a batch than alone."""
    index = built.get(case.name)
    queries = [QUERIES[0], "", QUERIES[2], "   ", *QUERIES[3:]]
    batch = index.search_many(queries, k=4)
    one = [index.search(q, k=4) for q in queries]
    assert [ids(b) for b in batch] == [ids(o) for o in one]
    for b, o in zip(batch, one):
        assert scores(b) == pytest.approx(scores(o), rel=1e-5, abs=1e-6)


FILTERS: list[tuple[str, Any, Callable[[dict], bool]]] = [
    ("dict", {"topic": "geo"}, lambda m: m["topic"] == "geo"),
    ("dict-list-field", {"tags": "odd", "topic": ["ir", "lit"]},
     lambda m: "odd" in m["tags"] and m["topic"] in ("ir", "lit")),
    ("tree", Condition("and", (Comparison("year", "gte", 2002), Comparison("topic", "ne", "lit"))),
     lambda m: m["year"] >= 2002 and m["topic"] != "lit"),
]


@pytest.mark.parametrize("case", PARAMS)
@pytest.mark.parametrize("name,flt,keep", FILTERS, ids=[f[0] for f in FILTERS])
def test_a_filter_narrows_to_exactly_the_matching_units(case, name, flt, keep, built):
    """Catches a filter that is ignored or widens (a unit that fails it comes back), one whose
    hits are padded back (non-matching units to fill ``k``), a post-filter (top ``k`` first,
    then filtered: fewer than ``k`` hits although more units match), and a backend whose filter
    means something else than in memory (different ids from the in-memory counterpart)."""
    index = built.get(case.name)
    n = len(CORPUS)
    for q in QUERIES:
        everything = index.search(q, k=n)
        filtered = index.search(q, k=n, filter=flt)
        assert all(keep(u.metadata) for u in filtered), q
        assert set(ids(filtered)) == {u.id for u in everything if keep(u.metadata)}, q
        few = index.search(q, k=2, filter=flt)
        assert all(keep(u.metadata) for u in few)
        if case.clustered:  # the first two clusters that hold a matching document, opened
            assert len(cluster_ids(few)) == min(2, len(cluster_ids(filtered)))
        else:  # the best two matching units (compared by score: equal scores may swap)
            assert scores(few) == pytest.approx(scores(filtered)[:2], rel=1e-5, abs=1e-6)
        if case.where == "milvus":
            memory = built.get(f"{case.kind}-memory")
            assert set(ids(filtered)) == set(ids(memory.search(q, k=n, filter=flt))), q
    assert filter_predicate(FILTERS[2][1])({"year": 2003, "topic": "geo"})  # the tree, in memory


@pytest.mark.parametrize("case", PARAMS)
def test_an_empty_query_returns_nothing(case, built):
    """Catches an index that embeds or scores an empty query (returning arbitrary units) or
    raises on it, alone or inside a batch."""
    index = built.get(case.name)
    assert index.search("", k=3) == [] and index.search("   ", k=3) == []
    assert index.search_many(["", QUERIES[0]], k=3)[0] == []
    assert index.search("", k=3, filter={"topic": "geo"}) == []


@pytest.mark.parametrize("case", PARAMS)
def test_save_and_load_give_the_same_results(case, built, tmp_path):
    """Catches a save or load that forgets a setting (BM25 ``k1``/``b`` here differ from the
    defaults, so scores would change), loses or reorders units, or drops their metadata (the
    filtered search would change)."""
    index = built.get(case.name)
    index.save(tmp_path / "saved")
    again = built.load(case, tmp_path / "saved")
    assert isinstance(again, SearchIndex) and len(again) == len(index)
    for q in QUERIES:
        for flt in (None, {"topic": "ir"}):
            want, got = index.search(q, k=5, filter=flt), again.search(q, k=5, filter=flt)
            assert ids(got) == ids(want)
            assert scores(got) == pytest.approx(scores(want), rel=1e-5, abs=1e-6)
            assert [u.metadata for u in got] == [u.metadata for u in want]
