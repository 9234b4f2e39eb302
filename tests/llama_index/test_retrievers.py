"""LlamaIndex BM25Retriever and ClusteredBM25Retriever inside LlamaIndex's own compositions."""

import asyncio

import pytest
from llama_index.core import Settings
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.vector_stores.types import FilterOperator, MetadataFilter, MetadataFilters

from funnel_core import PersistError
from llama_index_funnel.retrievers import BM25Retriever, ClusteredBM25Retriever

Settings.embed_model = MockEmbedding(embed_dim=8)


@pytest.fixture
def clustered(source_linked_nodes):
    return ClusteredBM25Retriever.from_defaults(nodes=source_linked_nodes, similarity_top_k=2, max_tokens=40,
                                                knn_k=3, knn_threshold=0.05)


def test_bm25_retriever_in_a_query_engine(source_linked_nodes):
    retriever = BM25Retriever.from_defaults(nodes=source_linked_nodes, similarity_top_k=2)
    engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM())
    response = engine.query("Where is the Eiffel Tower?")
    assert response.source_nodes[0].node.node_id == "d2"
    assert response.source_nodes[0].score > 0
    # results are copies of the caller's nodes: relationships kept, metadata and hash unchanged
    node = response.source_nodes[0].node
    original = next(n for n in source_linked_nodes if n.node_id == "d2")
    assert node.source_node.node_id == "src-d2" and node is not original
    assert node.metadata == original.metadata and node.hash == original.hash


def test_clustered_retriever_in_a_query_engine(clustered):
    engine = RetrieverQueryEngine.from_args(clustered, llm=MockLLM())
    response = engine.query("Who wrote the tragedy Hamlet?")
    ids = [n.node.node_id for n in response.source_nodes]
    assert "d5" in ids
    # the user's node, unchanged
    assert not any(k.startswith("funnel_") for k in response.source_nodes[0].node.metadata)
    clustered.annotate = True  # opt in: cluster bookkeeping as flat funnel_ keys
    try:
        meta = clustered.retrieve("Who wrote the tragedy Hamlet?")[0].node.metadata
    finally:
        clustered.annotate = False
    assert {"funnel_cluster_id", "funnel_cluster_score", "funnel_cluster_rank"} <= set(meta)


def test_async_matches_sync(clustered):
    sync = clustered.retrieve("Shakespeare playwright")
    asyn = asyncio.run(clustered.aretrieve("Shakespeare playwright"))
    assert [(n.node.node_id, n.score) for n in sync] == [(n.node.node_id, n.score) for n in asyn]


def test_per_query_metadata_filters(source_linked_nodes, clustered):
    flat = BM25Retriever.from_defaults(nodes=source_linked_nodes, similarity_top_k=5)
    filters = MetadataFilters(filters=[MetadataFilter(key="topic", value="ir")])
    hits = flat.search("a ranking function for documents and queries", filters=filters)
    assert hits and all(h.node.metadata["topic"] == "ir" for h in hits)
    nin = MetadataFilters(filters=[MetadataFilter(key="title", value=["Paris"], operator=FilterOperator.NIN)])
    assert all(h.node.metadata["title"] != "Paris" for h in flat.search("Paris France", filters=nin))
    assert all(h.node.metadata["topic"] == "lit" for h in clustered.search("Paris Hamlet", filters={"topic": "lit"}))
    # the default (no filter) is untouched by a per-query filter
    assert {h.node.metadata["topic"] for h in flat.retrieve("Paris capital Shakespeare BM25")} > {"ir"}


def test_return_clusters(source_linked_nodes):
    r = ClusteredBM25Retriever.from_defaults(nodes=source_linked_nodes, similarity_top_k=1, return_clusters=True,
                                             max_tokens=40, knn_k=3, knn_threshold=0.05)
    out = r.retrieve("Eiffel Tower")
    assert len(out) == 1 and out[0].node.metadata["funnel_level"] == "cluster"


def test_persist_round_trip(tmp_path, source_linked_nodes, clustered):
    flat = BM25Retriever.from_defaults(nodes=source_linked_nodes, similarity_top_k=3, stemmer=None)
    flat.persist(str(tmp_path / "flat"))
    again = BM25Retriever.from_persist_dir(str(tmp_path / "flat"), similarity_top_k=3)
    assert again.index.config["stemmer"] is None
    q = "capital of Germany"
    assert [(n.node.node_id, n.score) for n in flat.retrieve(q)] == [(n.node.node_id, n.score) for n in again.retrieve(q)]
    clustered.persist(str(tmp_path / "cl"))
    again = ClusteredBM25Retriever.from_persist_dir(str(tmp_path / "cl"), similarity_top_k=2)
    assert [n.node.node_id for n in again.retrieve(q)] == [n.node.node_id for n in clustered.retrieve(q)]
    assert again.retrieve(q)[0].node.source_node.node_id.startswith("src-")


def test_bad_input(tmp_path, source_linked_nodes):
    with pytest.raises(ValueError, match="empty corpus"):
        BM25Retriever.from_defaults(nodes=[])
    with pytest.raises(ValueError, match="pass nodes"):
        ClusteredBM25Retriever.from_defaults()
    with pytest.raises(TypeError, match="expected LlamaIndex nodes"):
        BM25Retriever.from_defaults(nodes=["text"])
    with pytest.raises(ValueError, match="similarity_top_k must be >= 1"):
        BM25Retriever.from_defaults(nodes=source_linked_nodes, similarity_top_k=0)
    with pytest.raises(PersistError, match="missing manifest.json|no docstore|does not exist"):
        BM25Retriever.from_persist_dir(str(tmp_path / "nowhere"))
    retriever = BM25Retriever.from_defaults(nodes=source_linked_nodes)
    assert retriever.retrieve("   ") == []
