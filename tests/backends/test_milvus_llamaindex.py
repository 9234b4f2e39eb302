"""LlamaIndex retrievers over the Milvus backend, through embedded Milvus Lite.

Reference for "same results": the same retriever built in memory (bm25s). Covers: the one
argument (``backend=``) that builds into Milvus, results that are the caller's nodes, re-opening
without re-indexing (``from_backend``, ``persist``/``from_persist_dir`` of a manifest-only
snapshot), ``MetadataFilters`` pushed down (checked against :func:`to_predicate`), a
``RetrieverQueryEngine`` (with LlamaIndex's ``MockLLM``, as the other adapter tests), ``QueryFusionRetriever``
beside our retriever, and errors.
"""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("pymilvus", reason="pymilvus is not installed (pip install 'funnel-rag[milvus]')")
pytest.importorskip("milvus_lite", reason="milvus-lite is not installed (pip install 'funnel-rag[milvus]')")

from llama_index.core.llms import MockLLM  # noqa: E402
from llama_index.core.query_engine import RetrieverQueryEngine  # noqa: E402
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode  # noqa: E402
from llama_index.core.vector_stores.types import (  # noqa: E402
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)

from funnel_core.backends.milvus import (
    MilvusBackend,
    MilvusBM25Index,
    MilvusClusteredBM25Index,
    MilvusCollectionError,
    MilvusSettingsError,
    UnsupportedFilterError,
)
from funnel_core.persist import snapshot_info  # noqa: E402
from llama_index_funnel.filters import to_predicate  # noqa: E402
from llama_index_funnel.milvus import to_milvus_filter  # noqa: E402
from llama_index_funnel.retrievers import BM25Retriever, ClusteredBM25Retriever  # noqa: E402
from tests.conftest import CORPUS  # noqa: E402

QUESTION = "Which city is the capital of France?"
QUERIES = [QUESTION, "Shakespeare tragedy", "ranking documents search engines", "capital city",
           "vectors neural network"]
WIDE = "capital city Paris France Shakespeare BM25 ranking vectors tragedy"


def _nodes() -> list[TextNode]:
    out = []
    for n, (i, t, m) in enumerate(CORPUS):
        node = TextNode(id_=i, text=t, metadata=dict(m, year=2000 + n, tags=[m["topic"], f"n{n % 2}"]))
        node.relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id=f"src-{i}")
        out.append(node)
    return out


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("milvus_li") / "li.db")


@pytest.fixture(scope="module")
def bm25(db) -> BM25Retriever:
    return BM25Retriever.from_defaults(nodes=_nodes(), similarity_top_k=3,
                                       backend=MilvusBackend(db, collection="li_bm25"))


@pytest.fixture(scope="module")
def memory() -> BM25Retriever:
    return BM25Retriever.from_defaults(nodes=_nodes(), similarity_top_k=3)


def _view(nodes) -> list[tuple]:
    return [(n.node.node_id, round(n.score, 4)) for n in nodes]


def _same(got, want) -> None:
    """Same scores in the same (descending) order and the same ids; nodes with equal scores may
    come in either order, and at a tie at the cut-off either may be kept."""
    g, w = _view(got), _view(want)
    assert [s for _, s in g] == [s for _, s in w] == sorted([s for _, s in w], reverse=True)
    cut = w[-1][1] if w else None
    assert sorted(i for i, s in g if s != cut) == sorted(i for i, s in w if s != cut)


def test_backend_argument_builds_into_milvus_and_returns_the_callers_nodes(bm25, memory):
    assert isinstance(bm25.index, MilvusBM25Index) and bm25.index.collection == "li_bm25"
    for q in QUERIES:
        _same(bm25.retrieve(q), memory.retrieve(q))
        _same(bm25.search(q, k=6), memory.search(q, k=6))
    top = bm25.retrieve(QUESTION)[0].node
    assert top.node_id == "d0" and top.source_node.node_id == "src-d0"  # a copy of the user's node
    assert top.hash == _nodes()[0].hash and top.metadata["tags"] == ["geo", "n0"]
    _same(asyncio.run(bm25.aretrieve(QUESTION)), memory.retrieve(QUESTION))


def test_inside_a_retriever_query_engine(bm25, memory):
    engine = RetrieverQueryEngine.from_args(bm25, llm=MockLLM())
    response = engine.query(QUESTION)
    _same(response.source_nodes, memory.retrieve(QUESTION))
    assert response.source_nodes[0].node.node_id == "d0"
    aresponse = asyncio.run(engine.aquery("Shakespeare tragedy"))
    assert CORPUS[0][1] in str(response)  # MockLLM echoes the prompt: the retrieved context
    _same(aresponse.source_nodes, memory.retrieve("Shakespeare tragedy"))


FILTERS = [
    MetadataFilters(filters=[MetadataFilter(key="topic", value="geo")]),
    MetadataFilters(filters=[MetadataFilter(key="topic", value="geo", operator=FilterOperator.NE)]),
    MetadataFilters(filters=[MetadataFilter(key="year", value=2003, operator=FilterOperator.GTE)]),
    MetadataFilters(filters=[MetadataFilter(key="year", value=2002, operator=FilterOperator.LT)]),
    MetadataFilters(filters=[MetadataFilter(key="title", value=["Paris", "Hamlet", "X"],
                                            operator=FilterOperator.IN)]),
    MetadataFilters(filters=[MetadataFilter(key="title", value=["Paris"], operator=FilterOperator.NIN)]),
    MetadataFilters(filters=[MetadataFilter(key="tags", value="n1", operator=FilterOperator.CONTAINS)]),
    MetadataFilters(filters=[MetadataFilter(key="tags", value=["lit", "ir"], operator=FilterOperator.ANY)]),
    MetadataFilters(filters=[MetadataFilter(key="tags", value=["geo", "n0"], operator=FilterOperator.ALL)]),
    MetadataFilters(filters=[MetadataFilter(key="title", value="ar", operator=FilterOperator.TEXT_MATCH)]),
    MetadataFilters(filters=[MetadataFilter(key="missing", value="x")]),
    MetadataFilters(filters=[MetadataFilter(key="missing", value="x", operator=FilterOperator.NE)]),
    MetadataFilters(filters=[MetadataFilter(key="topic", value="geo"),
                             MetadataFilter(key="year", value=2001, operator=FilterOperator.GT)],
                    condition=FilterCondition.AND),
    MetadataFilters(filters=[MetadataFilter(key="topic", value="lit"),
                             MetadataFilters(filters=[MetadataFilter(key="title", value="Paris"),
                                                      MetadataFilter(key="year", value=2002,
                                                                     operator=FilterOperator.GT)],
                                             condition=FilterCondition.AND)],
                    condition=FilterCondition.OR),
    MetadataFilters(filters=[MetadataFilter(key="topic", value="geo"),
                             MetadataFilter(key="missing", value=1)], condition=FilterCondition.NOT),
]


@pytest.mark.parametrize("filters", FILTERS, ids=lambda f: (to_milvus_filter(f) or "none")[:60])
def test_metadata_filters_pushed_down_keep_what_the_predicate_keeps(bm25, memory, filters):
    got = bm25.search(WIDE, filters=filters, k=8)
    want = memory.search(WIDE, filters=to_predicate(filters), k=8)
    _same(got, want)


def test_filter_forms_and_refusals(bm25):
    assert [n.node.node_id for n in bm25.search("capital", filters={"title": "Berlin"})] == ["d1"]
    assert [n.node.node_id for n in bm25.search("capital", filters='metadata["year"] >= 2001')] == ["d1"]
    bm25.filters = MetadataFilters(filters=[MetadataFilter(key="topic", value="lit")])
    try:
        assert {n.node.node_id for n in bm25.retrieve("Shakespeare capital tragedy")} == {"d5", "d6"}
    finally:
        bm25.filters = None
    with pytest.raises(UnsupportedFilterError, match="callable.*Milvus expression"):
        bm25.search("capital", filters=lambda m: True)
    empty = MetadataFilters(filters=[MetadataFilter(key="tags", value=None, operator=FilterOperator.IS_EMPTY)])
    with pytest.raises(UnsupportedFilterError, match="is_empty.*expression yourself"):
        bm25.search("capital", filters=empty)


def test_persist_writes_a_manifest_only_and_reopens(db, bm25, memory, tmp_path):
    bm25.filters = MetadataFilters(filters=[MetadataFilter(key="topic", value="geo")])
    try:
        bm25.persist(str(tmp_path / "p"))
    finally:
        bm25.filters = None
    info = snapshot_info(tmp_path / "p" / BM25Retriever._index_dir)
    assert info["files"] == {}  # no data, no nodes: they stay in Milvus
    raw = json.dumps(info)
    assert "Paris is the capital" not in raw and '"token"' not in raw
    assert info["meta"]["index"]["collection"] == "li_bm25"
    again = BM25Retriever.from_persist_dir(str(tmp_path / "p"), backend=db)
    assert isinstance(again.index, MilvusBM25Index) and again.similarity_top_k == 3
    assert isinstance(again.filters, MetadataFilters)
    _same(again.retrieve("capital"), memory.search("capital", filters={"topic": "geo"}))
    # no nodes in memory: rebuilt from Milvus, the same node as the caller's (text, metadata,
    # relationships, hash), with nothing of ours left in its metadata
    node = again.retrieve("capital")[0].node
    original = {n.node_id: n for n in _nodes()}[node.node_id]
    assert (node.text, node.metadata) == (original.text, original.metadata)
    assert node.source_node.node_id == f"src-{node.node_id}" and node.hash == original.hash
    wider = BM25Retriever.from_persist_dir(str(tmp_path / "p"), similarity_top_k=5, filters=None,
                                           backend=MilvusBackend(db))
    _same(wider.retrieve("Shakespeare"), memory.search("Shakespeare", k=5))


def test_persisted_retriever_refuses_a_collection_rebuilt_with_other_settings(db, tmp_path):
    backend = MilvusBackend(db, collection="li_moved")
    BM25Retriever.from_defaults(nodes=_nodes()[:3], backend=backend).persist(str(tmp_path / "m"))
    BM25Retriever.from_defaults(nodes=_nodes()[:3], backend=backend, stemmer=None)
    with pytest.raises(MilvusSettingsError, match=r"stemmer=None.*stemmer='english'.*rebuild"):
        BM25Retriever.from_persist_dir(str(tmp_path / "m"), backend=db)
    BM25Retriever.from_defaults(nodes=_nodes()[:3], backend=backend)  # back to the saved settings
    assert BM25Retriever.from_persist_dir(str(tmp_path / "m"), backend=db).retrieve("Paris")[0].node.node_id == "d0"


def test_from_backend_reopens_without_reindexing(db, bm25, memory):
    before = sorted(bm25.index.client.list_collections())
    again = BM25Retriever.from_backend(MilvusBackend(db, collection="li_bm25"), similarity_top_k=3)
    for q in QUERIES:
        _same(again.retrieve(q), memory.retrieve(q))
    assert sorted(bm25.index.client.list_collections()) == before
    top = again.retrieve(QUESTION)[0].node
    assert top.source_node.node_id == "src-d0" and top.hash == _nodes()[0].hash
    assert "funnel" not in top.metadata
    with pytest.raises(MilvusCollectionError, match="no collection 'nope'.*index"):
        BM25Retriever.from_backend(MilvusBackend(db, collection="nope")).retrieve("x")
    with pytest.raises(ValueError, match="re-opens a Milvus collection"):
        BM25Retriever.from_backend("memory")


def test_clustered_retriever_on_milvus(db, tmp_path):
    kw = dict(similarity_top_k=3, k_clusters=2, max_tokens=25, knn_k=3, knn_threshold=0.05)
    cl = ClusteredBM25Retriever.from_defaults(nodes=_nodes(), backend=MilvusBackend(db, collection="li_cl"), **kw)
    mem = ClusteredBM25Retriever.from_defaults(nodes=_nodes(), **kw)
    assert isinstance(cl.index, MilvusClusteredBM25Index)
    engine = RetrieverQueryEngine.from_args(cl, llm=MockLLM())
    for q in QUERIES:
        got = engine.query(q).source_nodes
        want = mem.retrieve(q)
        assert [(n.node.node_id, round(n.score, 4)) for n in got] == \
            [(n.node.node_id, round(n.score, 4)) for n in want]
    flt = MetadataFilters(filters=[MetadataFilter(key="topic", value="lit")])
    _same(cl.search("Shakespeare capital", filters=flt), mem.search("Shakespeare capital", filters=flt))
    cl.persist(str(tmp_path / "c"))
    assert snapshot_info(tmp_path / "c" / ClusteredBM25Retriever._index_dir)["files"] == {}
    again = ClusteredBM25Retriever.from_persist_dir(str(tmp_path / "c"), backend=db)
    assert again.k_clusters == 2 and isinstance(again.index, MilvusClusteredBM25Index)
    assert [n.node.node_id for n in again.retrieve(QUESTION)] == [n.node.node_id for n in cl.retrieve(QUESTION)]
    reopened = ClusteredBM25Retriever.from_backend(MilvusBackend(db, collection="li_cl"),
                                                   similarity_top_k=3, k_clusters=2)
    assert [n.node.node_id for n in reopened.retrieve(QUESTION)] == [n.node.node_id for n in cl.retrieve(QUESTION)]
    assert all(n.node.source_node.node_id == f"src-{n.node.node_id}" for n in reopened.retrieve(QUESTION))


def test_query_fusion_retriever_beside_milvus(bm25, memory):
    """LlamaIndex's own QueryFusionRetriever (RRF) over our Milvus retriever and an in-memory
    one: the same fused list as over two in-memory retrievers (nodes dedup'd by hash)."""
    from llama_index.core.retrievers import QueryFusionRetriever

    lit = BM25Retriever.from_defaults(nodes=[n for n in _nodes() if n.metadata["topic"] == "lit"],
                                      similarity_top_k=2)

    def fusion(first):
        return QueryFusionRetriever([first, lit], mode="reciprocal_rerank", num_queries=1,
                                    similarity_top_k=5, llm=MockLLM(), use_async=False)

    got = fusion(bm25).retrieve("capital Shakespeare")
    want = fusion(memory).retrieve("capital Shakespeare")
    assert [n.node.node_id for n in got] == [n.node.node_id for n in want]
    assert {"d5", "d6"} <= {n.node.node_id for n in got}
    assert len({n.node.node_id for n in got}) == len(got)  # our copies dedup with the others
