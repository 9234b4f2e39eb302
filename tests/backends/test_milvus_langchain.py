"""LangChain retrievers over the Milvus backend, through embedded Milvus Lite.

Reference for "same results": the same retriever built in memory (bm25s). Covers: the one
argument (``backend=``) that builds into Milvus, re-opening without re-indexing
(``from_backend``, ``save``/``load`` of a manifest-only snapshot), per-call filters pushed down
(dicts and structured-query objects, checked against a Python predicate), an LCEL chain, an
``EnsembleRetriever`` beside our retriever, errors, and LangChain's standard retriever suite.
"""

from __future__ import annotations

import json
import tempfile

import pytest

pytest.importorskip("pymilvus", reason="pymilvus is not installed (pip install 'funnel-rag[milvus]')")
pytest.importorskip("milvus_lite", reason="milvus-lite is not installed (pip install 'funnel-rag[milvus]')")

from langchain_core.documents import Document  # noqa: E402
from langchain_core.structured_query import Comparator, Comparison, Operation, Operator  # noqa: E402
from langchain_tests.integration_tests import RetrieversIntegrationTests  # noqa: E402

from funnel_core.backends.milvus import (
    MilvusBackend,
    MilvusBM25Index,
    MilvusClusteredBM25Index,
    MilvusCollectionError,
    MilvusConnectionError,
    MilvusSettingsError,
    UnsupportedFilterError,
)
from funnel_core.persist import snapshot_info  # noqa: E402
from langchain_funnel.milvus import to_milvus_filter  # noqa: E402
from langchain_funnel.retrievers import BM25Retriever, ClusteredBM25Retriever  # noqa: E402
from tests.conftest import CORPUS  # noqa: E402

QUESTION = "Which city is the capital of France?"
QUERIES = [QUESTION, "Shakespeare tragedy", "ranking documents search engines", "capital city",
           "vectors neural network"]


def _docs() -> list[Document]:
    return [Document(id=i, page_content=t, metadata=dict(m, year=2000 + n, tags=[m["topic"], f"n{n % 2}"]))
            for n, (i, t, m) in enumerate(CORPUS)]


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("milvus_lc") / "lc.db")


@pytest.fixture(scope="module")
def bm25(db) -> BM25Retriever:
    return BM25Retriever.from_documents(_docs(), k=3, backend=MilvusBackend(db, collection="lc_bm25"))


@pytest.fixture(scope="module")
def memory() -> BM25Retriever:
    return BM25Retriever.from_documents(_docs(), k=3)


def _view(docs: list[Document]) -> list[tuple]:
    return [(d.id, round(d.metadata["funnel"]["score"], 4)) for d in docs]


def _same(got: list[Document], want: list[Document]) -> None:
    """Same scores in the same (descending) order and the same ids; documents with equal scores
    may come in either order, and at a tie at the cut-off either may be kept."""
    g, w = _view(got), _view(want)
    assert [s for _, s in g] == [s for _, s in w] == sorted([s for _, s in w], reverse=True)
    cut = w[-1][1] if w else None
    assert sorted(i for i, s in g if s != cut) == sorted(i for i, s in w if s != cut)


def test_backend_argument_builds_into_milvus_with_in_memory_results(bm25, memory):
    assert isinstance(bm25.index, MilvusBM25Index) and bm25.index.collection == "lc_bm25"
    for q in QUERIES:
        _same(bm25.invoke(q), memory.invoke(q))
        _same(bm25.invoke(q, k=5), memory.invoke(q, k=5))
    got = bm25.invoke(QUESTION)
    assert got[0].id == "d0" and got[0].metadata["title"] == "Paris"  # the user's metadata kept
    assert got[0].metadata["tags"] == ["geo", "n0"]


def test_lcel_chain_over_milvus(bm25, memory):
    from langchain_core.language_models import FakeListLLM
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import PromptTemplate
    from langchain_core.runnables import RunnableLambda, RunnablePassthrough

    seen: dict = {}

    def fmt(docs: list[Document]) -> str:
        seen["docs"] = docs
        return "\n".join(d.page_content for d in docs)

    prompt = PromptTemplate.from_template("Context:\n{context}\nQ: {question}\nA:")
    chain = ({"context": bm25 | RunnableLambda(fmt), "question": RunnablePassthrough()}
             | prompt | FakeListLLM(responses=["Paris"]) | StrOutputParser())
    assert chain.invoke(QUESTION) == "Paris"
    _same(seen["docs"], memory.invoke(QUESTION))
    for q, b in zip(QUERIES[:3], bm25.batch(QUERIES[:3])):
        _same(b, memory.invoke(q))


async def test_async_over_milvus(bm25, memory):
    _same(await bm25.ainvoke(QUESTION), memory.invoke(QUESTION))


def _predicate(directive):
    """A Python reference for a structured-query filter (missing key: fails eq/gt..., passes ne)."""
    if isinstance(directive, Operation):
        parts = [_predicate(a) for a in directive.arguments]
        if directive.operator == Operator.AND:
            return lambda m: all(p(m) for p in parts)
        if directive.operator == Operator.OR:
            return lambda m: any(p(m) for p in parts)
        return lambda m: not any(p(m) for p in parts)
    key, v, op = directive.attribute, directive.value, directive.comparator
    ops = {Comparator.EQ: lambda x: x == v, Comparator.NE: lambda x: x != v,
           Comparator.GT: lambda x: x > v, Comparator.GTE: lambda x: x >= v,
           Comparator.LT: lambda x: x < v, Comparator.LTE: lambda x: x <= v,
           Comparator.IN: lambda x: x in v, Comparator.NIN: lambda x: x not in v,
           Comparator.CONTAIN: lambda x: isinstance(x, list) and v in x,
           Comparator.LIKE: lambda x: isinstance(x, str) and v in x}
    missing_passes = op in (Comparator.NE, Comparator.NIN)

    def check(m: dict) -> bool:
        if key not in m:
            return missing_passes
        try:
            return bool(ops[op](m[key]))
        except TypeError:
            return False
    return check


FILTERS = [
    Comparison(comparator=Comparator.EQ, attribute="topic", value="geo"),
    Comparison(comparator=Comparator.NE, attribute="topic", value="geo"),
    Comparison(comparator=Comparator.GTE, attribute="year", value=2003),
    Comparison(comparator=Comparator.IN, attribute="title", value=["Paris", "Hamlet", "Nowhere"]),
    Comparison(comparator=Comparator.NIN, attribute="title", value=["Paris"]),
    Comparison(comparator=Comparator.CONTAIN, attribute="tags", value="n1"),
    Comparison(comparator=Comparator.LIKE, attribute="title", value="ar"),
    Comparison(comparator=Comparator.EQ, attribute="missing", value="x"),
    Comparison(comparator=Comparator.NE, attribute="missing", value="x"),
    Operation(operator=Operator.AND, arguments=[
        Comparison(comparator=Comparator.EQ, attribute="topic", value="geo"),
        Comparison(comparator=Comparator.LT, attribute="year", value=2002)]),
    Operation(operator=Operator.OR, arguments=[
        Comparison(comparator=Comparator.EQ, attribute="topic", value="lit"),
        Comparison(comparator=Comparator.GT, attribute="year", value=2006)]),
    Operation(operator=Operator.NOT, arguments=[
        Comparison(comparator=Comparator.EQ, attribute="topic", value="geo"),
        Comparison(comparator=Comparator.EQ, attribute="missing", value=1)]),
]


WIDE = "capital city Paris France Shakespeare BM25 ranking vectors tragedy"


@pytest.mark.parametrize("directive", FILTERS, ids=lambda d: to_milvus_filter(d)[:60])
def test_structured_query_filters_pushed_down_match_a_predicate(bm25, memory, directive):
    """The translated expression keeps exactly the documents a Python predicate keeps: the
    in-memory retriever with that predicate is the reference (scores equal, never padded)."""
    got = bm25.invoke(WIDE, k=8, filter=directive)
    want = memory.invoke(WIDE, k=8, filter=_predicate(directive))
    _same(got, want)


def test_dict_and_expression_filters(bm25, memory):
    q = "capital"
    assert _view(bm25.invoke(q, k=5, filter={"topic": "lit"})) == []
    assert [d.id for d in bm25.invoke(q, k=5, filter={"title": "Berlin"})] == ["d1"]
    _same(bm25.invoke(q, k=5, filter={"tags": "geo"}), memory.invoke(q, k=5, filter={"tags": "geo"}))
    assert [d.id for d in bm25.invoke(q, k=5, filter='metadata["year"] >= 2001')] == ["d1"]
    with pytest.raises(UnsupportedFilterError, match="callable.*Milvus expression"):
        bm25.invoke(q, filter=lambda m: True)
    with pytest.raises(UnsupportedFilterError, match="Milvus backend only"):
        memory.invoke(q, filter=FILTERS[0])


def test_save_writes_a_manifest_only_and_load_reopens(db, bm25, tmp_path):
    bm25.filter = {"topic": "geo"}
    try:
        bm25.save(tmp_path / "r")
    finally:
        bm25.filter = None
    info = snapshot_info(tmp_path / "r")
    assert info["files"] == {}  # no data file at all: the data stays in Milvus
    raw = json.dumps(info)
    assert "Paris is the capital" not in raw and "\"token\"" not in raw
    assert info["meta"]["index"]["collection"] == "lc_bm25"
    again = BM25Retriever.load(tmp_path / "r", backend=db)
    assert isinstance(again.index, MilvusBM25Index) and again.k == 3
    assert again.filter == {"topic": "geo"}
    _same(again.invoke("capital", k=5), bm25.invoke("capital", k=5, filter={"topic": "geo"}))
    assert again.invoke("Shakespeare") == []  # the saved default filter (geo) applies
    _same(BM25Retriever.load(tmp_path / "r", k=1, filter=None, backend=db).invoke("Shakespeare"),
          bm25.invoke("Shakespeare", k=1))  # load-time settings win


def test_the_token_is_never_written_and_is_passed_at_load(db, tmp_path):
    backend = MilvusBackend(db, collection="lc_tok", token="root:s3cret-pw")
    assert "s3cret" not in repr(backend)
    r = BM25Retriever.from_texts(["alpha beta", "gamma delta"], backend=backend)
    r.save(tmp_path / "t")
    r.index.save(tmp_path / "bare")  # the index alone: a manifest-only snapshot too
    written = [f.read_text() for f in tmp_path.rglob("*") if f.is_file()]
    assert written and not any("s3cret" in w for w in written)
    again = BM25Retriever.load(tmp_path / "t", token="root:s3cret-pw", backend=db)
    assert again.index.token == "root:s3cret-pw" and [d.id for d in again.invoke("alpha")] == ["0"]
    bare = BM25Retriever.load(tmp_path / "bare", k=1, backend=db)  # a bare Milvus index folder
    assert isinstance(bare.index, MilvusBM25Index) and [d.id for d in bare.invoke("gamma")] == ["1"]


def test_a_structured_query_default_filter_is_saved_as_its_expression(db, bm25, memory, tmp_path):
    directive = FILTERS[-2]  # topic == lit or year > 2006
    bm25.filter = directive
    try:
        bm25.save(tmp_path / "sq")
    finally:
        bm25.filter = None
    again = BM25Retriever.load(tmp_path / "sq", k=8, backend=MilvusBackend(db))
    assert again.filter == to_milvus_filter(directive)
    _same(again.invoke(WIDE), memory.invoke(WIDE, k=8, filter=_predicate(directive)))


def test_from_backend_reopens_without_reindexing(db, bm25):
    before = sorted(bm25.index.client.list_collections())
    again = BM25Retriever.from_backend(MilvusBackend(db, collection="lc_bm25"), k=2)
    _same(again.invoke(QUESTION), bm25.invoke(QUESTION, k=2))
    assert again.index.config == bm25.index.config
    assert sorted(bm25.index.client.list_collections()) == before  # nothing was built
    with pytest.raises(TypeError, match="unknown"):
        BM25Retriever.from_backend(MilvusBackend(db, collection="lc_bm25"), similarity_top_k=2)


def test_errors_name_the_value_and_the_fix(db, bm25, tmp_path):
    with pytest.raises(MilvusCollectionError, match="no collection 'nope'.*index"):
        BM25Retriever.from_backend(MilvusBackend(db, collection="nope"))
    with pytest.raises(MilvusConnectionError, match="127.0.0.1:1.*start the server"):
        BM25Retriever.from_backend("http://127.0.0.1:1")
    with pytest.raises(ValueError, match="backend='my_index'.*'memory'.*'.db'"):
        BM25Retriever.from_texts(["a b"], backend="my_index")
    with pytest.raises(ValueError, match="re-opens a Milvus collection"):
        BM25Retriever.from_backend("memory")
    with pytest.raises(MilvusSettingsError, match="milvus-bm25.*not a.*clustered"):
        ClusteredBM25Retriever.from_backend(MilvusBackend(db, collection="lc_bm25"))
    # a saved retriever whose collection was rebuilt with other tokenizer settings
    r = BM25Retriever.from_texts(["alpha beta", "gamma"], backend=MilvusBackend(db, collection="lc_moved"))
    r.save(tmp_path / "moved")
    BM25Retriever.from_texts(["alpha beta", "gamma"], stemmer=None,
                             backend=MilvusBackend(db, collection="lc_moved"))
    with pytest.raises(MilvusSettingsError, match=r"stemmer=None.*stemmer='english'"):
        BM25Retriever.load(tmp_path / "moved", backend=db)


def test_clustered_retriever_on_milvus(db):
    from funnel_core.funnelrag.clustered_index import ClusteredBM25Index

    kw = dict(k=3, k_clusters=2, max_tokens=25, knn_k=3, knn_threshold=0.05)
    cl = ClusteredBM25Retriever.from_documents(_docs(), backend=MilvusBackend(db, collection="lc_cl"), **kw)
    mem = ClusteredBM25Retriever.from_documents(_docs(), **kw)
    assert isinstance(cl.index, MilvusClusteredBM25Index) and isinstance(mem.index, ClusteredBM25Index)

    def view(docs):
        return [(d.id, d.metadata["funnel"]["cluster_id"], round(d.metadata["funnel"]["score"], 4))
                for d in docs]

    for q in QUERIES:
        assert view(cl.invoke(q)) == view(mem.invoke(q))
    flt = Comparison(comparator=Comparator.EQ, attribute="topic", value="lit")
    lit = cl.invoke("Shakespeare tragedy capital", filter=flt)
    assert lit and all(d.metadata["topic"] == "lit" for d in lit)
    assert view(lit) == view(mem.invoke("Shakespeare tragedy capital", filter={"topic": "lit"}))
    reopened = ClusteredBM25Retriever.from_backend(MilvusBackend(db, collection="lc_cl"), k=3, k_clusters=2)
    assert view(reopened.invoke(QUESTION)) == view(cl.invoke(QUESTION))
    with tempfile.TemporaryDirectory() as tmp:
        cl.save(tmp)
        assert snapshot_info(tmp)["files"] == {}
        again = ClusteredBM25Retriever.load(tmp, backend=db)
        assert again.k_clusters == 2 and view(again.invoke(QUESTION)) == view(cl.invoke(QUESTION))


def test_ensemble_retriever_beside_milvus(bm25, memory):
    """langchain's own EnsembleRetriever (weighted RRF) over our Milvus retriever and an
    in-memory one: the same fused list as over two in-memory retrievers."""
    from langchain_classic.retrievers import EnsembleRetriever

    lit = BM25Retriever.from_documents([d for d in _docs() if d.metadata["topic"] == "lit"], k=2)
    got = EnsembleRetriever(retrievers=[bm25, lit], weights=[0.5, 0.5]).invoke("capital Shakespeare")
    want = EnsembleRetriever(retrievers=[memory, lit], weights=[0.5, 0.5]).invoke("capital Shakespeare")
    assert [d.id for d in got] == [d.id for d in want] and {"d5", "d6"} <= {d.id for d in got}


# -- LangChain's standard retriever suite over a Milvus Lite collection ---------------------------
_STD: dict = {}


def _std_retriever_index() -> MilvusBM25Index:
    """One Milvus Lite collection for the whole standard suite (built on first use)."""
    if "index" not in _STD:
        folder = tempfile.mkdtemp(prefix="milvus_std_")
        texts = [t for _, t, _ in CORPUS] * 2
        metas = [dict(m, n=i) for i, (_, _, m) in enumerate(CORPUS * 2)]
        _STD["index"] = MilvusBM25Index.from_texts(texts, metadatas=metas, uri=f"{folder}/std.db",
                                                   collection="std")
    return _STD["index"]


class TestMilvusBM25RetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[BM25Retriever]:
        return BM25Retriever

    @property
    def retriever_constructor_params(self) -> dict:
        return {"index": _std_retriever_index(), "k": 3}

    @property
    def retriever_query_example(self) -> str:
        return "capital city of France Paris"


def _std_clustered_index() -> MilvusClusteredBM25Index:
    if "clustered" not in _STD:
        from funnel_core.units import Unit

        folder = tempfile.mkdtemp(prefix="milvus_std_cl_")
        units = [Unit(id=str(i), text=t, metadata=dict(m, n=i))
                 for i, (_, t, m) in enumerate(CORPUS * 2)]
        _STD["clustered"] = MilvusClusteredBM25Index(f"{folder}/std.db", "std_cl", max_tokens=40, knn_k=3,
                                                     knn_threshold=0.05).index(units)
    return _STD["clustered"]


class TestMilvusClusteredBM25RetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[ClusteredBM25Retriever]:
        return ClusteredBM25Retriever

    @property
    def retriever_constructor_params(self) -> dict:
        return {"index": _std_clustered_index(), "k": 3, "k_clusters": 5}

    @property
    def retriever_query_example(self) -> str:
        return "capital city of France Paris"
