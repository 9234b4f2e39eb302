"""Dense retrieval and hybrid search on Milvus in both frameworks, with the packaged
all-MiniLM-L6-v2 (a real model): the Milvus side (exact FLAT index) must return what the
in-memory numpy side returns, filters are pushed down, and the fused hybrid lists equal the
in-memory ones inside a RetrieverQueryEngine / an LCEL chain."""

from __future__ import annotations

import pytest

pytest.importorskip("pymilvus", reason="pymilvus is not installed (pip install 'funnel-rag[milvus]')")
pytest.importorskip("milvus_lite", reason="milvus-lite is not installed (pip install 'funnel-rag[milvus]')")

from funnel_core.backends.milvus import MilvusBackend, MilvusDenseIndex  # noqa: E402
from tests.conftest import CORPUS  # noqa: E402

QUESTION = "Which city is the capital of France?"
QUERIES = [QUESTION, "Who wrote Hamlet?", "how do search engines rank documents", "neural vectors"]


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("milvus_dense") / "dense.db")


@pytest.fixture(scope="module")
def embedder(minilm_path):
    from funnel_core.embeddings import SentenceEmbedder

    return SentenceEmbedder(minilm_path)


def _ids_scores(pairs):
    return [i for i, _ in pairs], [s for _, s in pairs]


# -- LlamaIndex -----------------------------------------------------------------------------------
def test_llamaindex_dense_and_hybrid_on_milvus(db, embedder):
    from llama_index.core.llms import MockLLM
    from llama_index.core.query_engine import RetrieverQueryEngine
    from llama_index.core.schema import TextNode
    from llama_index.core.vector_stores.types import FilterOperator, MetadataFilter, MetadataFilters

    from llama_index_funnel import DenseRetriever
    from llama_index_funnel.best_practices import HybridRetriever
    from llama_index_funnel.filters import to_predicate
    from llama_index_funnel.retrievers import BM25Retriever

    nodes = [TextNode(id_=i, text=t, metadata=dict(m, n=k)) for k, (i, t, m) in enumerate(CORPUS)]
    backend = MilvusBackend(db)
    dense = DenseRetriever.from_defaults(nodes, embedder, backend=backend.with_collection("li_dense"),
                                         index_type="FLAT", batch_size=3, similarity_top_k=4)
    ref = DenseRetriever.from_defaults(nodes, embedder, similarity_top_k=4)
    assert isinstance(dense.index, MilvusDenseIndex)
    for q in QUERIES:
        gi, gs = _ids_scores([(n.node.node_id, n.score) for n in dense.retrieve(q)])
        wi, ws = _ids_scores([(n.node.node_id, n.score) for n in ref.retrieve(q)])
        assert gi == wi and gs == pytest.approx(ws, abs=1e-5)
    # MetadataFilters pushed down: the filtered top-k is the predicate-filtered full ranking
    flt = MetadataFilters(filters=[MetadataFilter(key="n", value=3, operator=FilterOperator.GTE),
                                   MetadataFilter(key="topic", value="geo", operator=FilterOperator.NE)])
    keep = to_predicate(flt)
    full = [n.node.node_id for n in ref.search(QUESTION, k=len(nodes)) if keep(n.node.metadata)]
    assert [n.node.node_id for n in dense.search(QUESTION, filters=flt, k=3)] == full[:3]
    # the in-memory index takes the same filter with the same meaning: the same nodes
    assert [n.node.node_id for n in ref.search(QUESTION, filters=flt, k=3)] == full[:3]
    # re-open without re-embedding the corpus
    again = DenseRetriever.from_backend(backend.with_collection("li_dense"), embedder, similarity_top_k=4)
    assert [n.node.node_id for n in again.retrieve(QUESTION)] == [n.node.node_id for n in ref.retrieve(QUESTION)]

    # hybrid: both sides on Milvus, inside a RetrieverQueryEngine; equal to both sides in memory
    sparse = BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=4, backend=backend.with_collection("li_sparse"))
    hybrid = HybridRetriever(sparse, dense, similarity_top_k=3)
    hybrid_ref = HybridRetriever(BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=4), ref,
                                 similarity_top_k=3)
    engine = RetrieverQueryEngine.from_args(hybrid, llm=MockLLM())
    for q in QUERIES:
        got = engine.query(q).source_nodes
        want = hybrid_ref.retrieve(q)
        assert [n.node.node_id for n in got] == [n.node.node_id for n in want]
        assert [n.score for n in got] == pytest.approx([n.score for n in want], abs=1e-4)
    assert engine.query(QUESTION).source_nodes[0].node.node_id == "d0"

    # the one-argument form: both sides built into Milvus, then re-opened without re-indexing
    one = HybridRetriever.from_defaults(nodes, backend=backend.with_collection("li_h"), embedder=embedder,
                                        candidates=4, dense_config={"index_type": "FLAT"},
                                        similarity_top_k=3)
    assert one._sparse.index.collection == "li_h_bm25" and one._dense.index.collection == "li_h_dense"
    in_memory = HybridRetriever.from_defaults(nodes, embedder=embedder, candidates=4, similarity_top_k=3)
    reopened = HybridRetriever.from_backend(backend.with_collection("li_h"), embedder=embedder,
                                            candidates=4, similarity_top_k=3)
    for q in QUERIES:
        want = [n.node.node_id for n in in_memory.retrieve(q)]
        assert [n.node.node_id for n in one.retrieve(q)] == want
        assert [n.node.node_id for n in reopened.retrieve(q)] == want


# -- LangChain ------------------------------------------------------------------------------------
def test_langchain_dense_and_hybrid_on_milvus(db, embedder):
    from langchain_core.documents import Document
    from langchain_core.runnables import RunnableLambda
    from langchain_core.structured_query import Comparator, Comparison

    from langchain_funnel import DenseRetriever
    from langchain_funnel.best_practices import HybridRetriever
    from langchain_funnel.retrievers import BM25Retriever

    docs = [Document(id=i, page_content=t, metadata=dict(m, n=k)) for k, (i, t, m) in enumerate(CORPUS)]
    backend = MilvusBackend(db)
    dense = DenseRetriever.from_documents(docs, embedder, backend=backend.with_collection("lc_dense"),
                                          index_type="FLAT", k=4)
    ref = DenseRetriever.from_documents(docs, embedder, k=4)

    def view(ds):
        return [d.id for d in ds], [d.metadata["relevance_score"] for d in ds]

    for q in QUERIES:
        (gi, gs), (wi, ws) = view(dense.invoke(q)), view(ref.invoke(q))
        assert gi == wi and gs == pytest.approx(ws, abs=1e-5)
    lit = dense.invoke(QUESTION, filter=Comparison(comparator=Comparator.EQ, attribute="topic", value="lit"))
    full = [d.id for d in ref.invoke(QUESTION, k=len(docs)) if d.metadata["topic"] == "lit"]
    assert [d.id for d in lit] == full[:4]
    assert [d.id for d in dense.invoke(QUESTION, filter={"topic": "lit"})] == full[:4]
    # filter= given to from_documents is the retriever's floor (as for BM25Retriever), not an
    # unknown keyword handed to MilvusDenseIndex.__init__
    floored = DenseRetriever.from_documents(docs, embedder, backend=backend.with_collection("lc_floor"),
                                            index_type="FLAT", k=4, filter={"topic": "lit"})
    assert floored.filter == {"topic": "lit"}
    assert [d.id for d in floored.invoke(QUESTION)] == full[:4]
    assert [d.id for d in floored.invoke(QUESTION, filter={"topic": "geo"})] == []  # AND, never wider
    again = DenseRetriever.from_backend(backend.with_collection("lc_dense"), embedder, k=2)
    assert [d.id for d in again.invoke(QUESTION)] == [d.id for d in ref.invoke(QUESTION, k=2)]

    sparse = BM25Retriever.from_documents(docs, k=4, backend=backend.with_collection("lc_sparse"))
    hybrid = HybridRetriever(sparse=sparse, dense=dense, k=3)
    hybrid_ref = HybridRetriever(sparse=BM25Retriever.from_documents(docs, k=4), dense=ref, k=3)
    chain = hybrid | RunnableLambda(lambda ds: [d.id for d in ds])
    for q in QUERIES:
        assert chain.invoke(q) == [d.id for d in hybrid_ref.invoke(q)]
    assert chain.invoke(QUESTION)[0] == "d0"

    one = HybridRetriever.from_documents(docs, backend=backend.with_collection("lc_h"), embedder=embedder,
                                         candidates=4, dense_config={"index_type": "FLAT"}, k=3)
    in_memory = HybridRetriever.from_documents(docs, embedder=embedder, candidates=4, k=3)
    reopened = HybridRetriever.from_backend(backend.with_collection("lc_h"), embedder=embedder,
                                            candidates=4, k=3)
    assert one.dense.index.collection == "lc_h_dense"
    for q in QUERIES:
        want = [d.id for d in in_memory.invoke(q)]
        assert [d.id for d in one.invoke(q)] == want == [d.id for d in reopened.invoke(q)]


def test_llamaindex_dense_retriever_on_milvus_searches_with_a_hyde_bundle(db, embedder):
    """A QueryBundle's embedding (HyDETransform's v) reaches Milvus with the retriever's filter,
    and Milvus returns what the in-memory index returns for the same vector."""
    from llama_index.core.retrievers import TransformRetriever
    from llama_index.core.schema import TextNode

    from funnel_core.testing import ScriptedLLM
    from llama_index_funnel import DenseRetriever
    from llama_index_funnel.best_practices import HyDETransform, SentenceEmbedderEmbedding

    nodes = [TextNode(id_=i, text=t, metadata=dict(m, n=k)) for k, (i, t, m) in enumerate(CORPUS)]
    milvus = DenseRetriever.from_defaults(nodes, embedder, backend=MilvusBackend(db).with_collection("li_hyde"),
                                          index_type="FLAT", similarity_top_k=3)
    memory = DenseRetriever.from_defaults(nodes, embedder, similarity_top_k=3)
    hyde = HyDETransform(ScriptedLLM("Shakespeare wrote the tragedy Hamlet around 1600."),
                         embed_model=SentenceEmbedderEmbedding(embedder=embedder))
    got = TransformRetriever(milvus, hyde).retrieve("the Danish prince play")
    want = TransformRetriever(memory, hyde).retrieve("the Danish prince play")
    assert [n.node.node_id for n in got] == [n.node.node_id for n in want]
    assert [n.score for n in got] == pytest.approx([n.score for n in want], abs=1e-5)
    assert got[0].node.node_id in {"d5", "d6"}
    filtered = DenseRetriever(milvus.index, nodes, similarity_top_k=3, filters={"topic": "geo"})
    assert {n.node.metadata["topic"] for n in TransformRetriever(filtered, hyde).retrieve("the Danish prince play")} == {"geo"}
