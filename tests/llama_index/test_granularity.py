"""Mix-of-Granularity in LlamaIndex: parsers, AutoMergingRetriever on our hierarchy, MoG retriever."""

import asyncio
import json

import numpy as np
import pytest
from llama_index.core import Document, Settings, StorageContext
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import MockLLM
from llama_index.core.node_parser import get_leaf_nodes, get_root_nodes
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.retrievers import AutoMergingRetriever
from llama_index.core.schema import MetadataMode, NodeRelationship, QueryBundle

from funnel_core.bm25 import BM25Index
from funnel_core.granularity import GranularityRouter
from llama_index_funnel._base import UnitRetriever, nodes_to_units
from llama_index_funnel.granularity import (
    GraphGranularityNodeParser,
    MixOfGranularityRetriever,
    MultiGranularityNodeParser,
)

TEXTS = [
    "Paris is the capital of France. The Eiffel Tower stands in Paris. It was built in 1889 for a "
    "world fair. Gustave Eiffel's company designed the tower. The Louvre is the largest art museum. "
    "It holds the Mona Lisa. The Seine river flows through the city. Many bridges cross the Seine.",
    "Hamlet is a tragedy by William Shakespeare. It is set in Denmark. Prince Hamlet seeks revenge "
    "for his father's murder. Shakespeare also wrote Macbeth and Othello. The Globe theatre staged "
    "his plays in London.",
    "Tiny note.",
]


@pytest.fixture(autouse=True)
def _mock_embed():
    Settings.embed_model = MockEmbedding(embed_dim=8)


@pytest.fixture(scope="module")
def docs():
    return [Document(text=t, id_=f"doc{i}", metadata={"title": f"T{i}"}) for i, t in enumerate(TEXTS)]


@pytest.fixture(scope="module")
def nodes(docs):
    return MultiGranularityNodeParser(chunk_size=10, n_gra=3).get_nodes_from_documents(docs)


class LeafBM25(UnitRetriever):
    """A small BM25 retriever over leaf nodes: AutoMergingRetriever's base retriever."""

    def __init__(self, leaves, k):
        self.index, self.k, self.leaves = BM25Index().index(nodes_to_units(leaves)), k, leaves
        super().__init__()

    def _search(self, query):
        return self.index.search(query, k=self.k)

    def _originals(self):
        return self.leaves


def test_parser_emits_parent_child_hierarchy(nodes):
    by_id = {n.node_id: n for n in nodes}
    leaves, roots = get_leaf_nodes(nodes), get_root_nodes(nodes)
    assert {n.metadata["funnel_granularity"] for n in leaves} == {1}
    assert {n.metadata["funnel_granularity"] for n in roots} == {3}
    for n in nodes:
        parent = n.relationships.get(NodeRelationship.PARENT)
        if parent is not None:
            p = by_id[parent.node_id]
            assert n.node_id in [c.node_id for c in p.child_nodes]
            assert n.get_content() in p.get_content()
        assert n.relationships[NodeRelationship.SOURCE].node_id.startswith("doc")
        assert n.metadata["title"].startswith("T")
        llm_view = n.get_content(metadata_mode=MetadataMode.LLM)
        assert "granularity" not in llm_view and "title: T" in llm_view
    tiny = [n for n in nodes if n.metadata["funnel_doc_id"] == "doc2"]  # shorter than one chunk
    assert len(tiny) == 3 and {n.get_content() for n in tiny} == {"Tiny note."}
    with pytest.raises(ValueError, match="n_gra"):
        MultiGranularityNodeParser(n_gra=0)


def test_auto_merging_retriever_in_query_engine_over_our_hierarchy(nodes):
    storage = StorageContext.from_defaults()
    storage.docstore.add_documents(nodes)
    leaves = get_leaf_nodes(nodes)
    base = LeafBM25(leaves, k=4)
    retriever = AutoMergingRetriever(base, storage, simple_ratio_thresh=0.4)
    query = "Eiffel tower Paris built 1889 designed company"
    initial = base.retrieve(query)
    merged = retriever.retrieve(query)
    assert {n.node.metadata["funnel_granularity"] for n in initial} == {1}
    assert max(n.node.metadata["funnel_granularity"] for n in merged) >= 2  # children merged into parents
    assert len(merged) < len(initial)
    engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM())
    response = engine.query(query)
    assert response.source_nodes and "Eiffel" in " ".join(n.node.get_content() for n in response.source_nodes)


@pytest.mark.models  # trains a router
def test_mog_retriever_in_query_engine_with_trained_router(nodes):
    qs = [f"What year was {x} built?" for x in ("the tower", "the bridge", "the museum", "the wall",
                                                  "the palace", "the church")]
    broad = [f"Give an overview of the history of {x}." for x in ("France", "Denmark", "theatre",
                                                                   "painting", "rivers", "drama")]
    router = GranularityRouter(3, hidden=16)
    router.fit(qs + broad, np.array([[0.8, 0.2, 0]] * 6 + [[0, 0.2, 0.8]] * 6), epochs=300, patience=20)
    retriever = MixOfGranularityRetriever(nodes, router, similarity_top_k=2, k_r=5)
    fine = retriever.retrieve("What year was the tower built for the world fair?")
    broad_out = retriever.retrieve("Give an overview of the history of Hamlet and Denmark.")
    assert fine[0].node.metadata["funnel_chosen_level"] == 1 and len(fine) == 2
    assert "1889" in " ".join(n.node.get_content() for n in fine)
    assert broad_out[0].node.metadata["funnel_chosen_level"] == 3 and "Hamlet" in broad_out[0].node.get_content()
    assert len(json.loads(broad_out[0].node.metadata["funnel_router_weights_json"])) == 3
    # the original hierarchy node comes back, relationships intact
    assert broad_out[0].node.relationships[NodeRelationship.SOURCE].node_id == "doc1"
    assert "router_weights" not in broad_out[0].node.get_content(metadata_mode=MetadataMode.LLM)
    engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM())
    assert engine.query("Who wrote Hamlet?").source_nodes
    assert asyncio.run(retriever.aretrieve("Who wrote Hamlet?"))
    assert retriever.retrieve(QueryBundle("   ")) == []


def test_graph_parser_and_mogg_retriever(docs):
    parser = GraphGranularityNodeParser(sentences_per_node=1, k_graph=2, t_graph=0.05, n_gra=2)
    gnodes = parser.get_nodes_from_documents(docs)
    assert parser.last_build_seconds is not None
    assert any(json.loads(n.metadata["funnel_graph_neighbors_json"]) for n in gnodes)
    assert "graph_neighbors" not in gnodes[0].get_content(metadata_mode=MetadataMode.LLM)
    retriever = MixOfGranularityRetriever(gnodes, None, similarity_top_k=1, n_gra=2)
    out = retriever.retrieve("Who designed the Eiffel Tower?")
    assert len(out) == 1 and "Eiffel" in out[0].node.get_content()
    assert out[0].node.metadata["funnel_chosen_level"] == 1
    engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM())
    assert engine.query("Eiffel").source_nodes
    with pytest.raises(ValueError, match="t_graph"):
        GraphGranularityNodeParser(t_graph=2.0)
    with pytest.raises(ValueError, match="needs nodes"):
        MixOfGranularityRetriever([])
    with pytest.raises(ValueError, match="similarity_top_k"):
        MixOfGranularityRetriever(gnodes, similarity_top_k=0)


@pytest.mark.slow  # starts two spawned worker processes (each imports llama_index)
def test_graph_parser_refuses_a_batched_ingestion_pipeline(docs):
    """Under IngestionPipeline(num_workers=2) each worker parsed its own batch
    and built its own graph: 84 instead of 108 edges, silently. The parser now refuses; run
    without workers it builds the one graph over all documents."""
    from llama_index.core.ingestion import IngestionPipeline

    parser = GraphGranularityNodeParser(sentences_per_node=1, k_graph=2, t_graph=0.05, n_gra=2)
    whole = IngestionPipeline(transformations=[parser]).run(documents=docs)
    direct = parser.get_nodes_from_documents(docs)
    assert [n.metadata["funnel_graph_neighbors_json"] for n in whole] == \
        [n.metadata["funnel_graph_neighbors_json"] for n in direct]
    with pytest.raises(ValueError, match=r"num_workers=None"):
        IngestionPipeline(transformations=[parser]).run(documents=docs, num_workers=2)


RIVER_TEXTS = [
    "The Seine river flows through Paris. Barges carry grain along the Seine river.",
    "The Thames river flows through London. A water mill once ground grain by the Thames.",
    "Mills on the Rhine river ground grain for centuries. The Rhine flows to the North Sea.",
]


def _cross_document_edges(nodes):
    doc_of = {n.node_id: n.metadata["funnel_doc_id"] for n in nodes}
    return sum(doc_of.get(m) not in (None, doc_of[n.node_id])
               for n in nodes for m in json.loads(n.metadata["funnel_graph_neighbors_json"]))


@pytest.mark.parametrize("strategy", ["upserts", "duplicates_only"])
def test_graph_parser_refuses_a_docstore_pipeline_that_parses_only_changed_documents(strategy):
    """An IngestionPipeline with a docstore hands its transformations only the new or changed
    documents: the graph parser would build a graph over those alone (no edge to the unchanged
    ones) without any sign. It refuses; the first run, which parses every document, builds the
    whole graph."""
    from llama_index.core.ingestion import DocstoreStrategy, IngestionPipeline
    from llama_index.core.storage.docstore import SimpleDocumentStore
    from llama_index.core.vector_stores import SimpleVectorStore

    docs = [Document(text=t, id_=f"river{i}") for i, t in enumerate(RIVER_TEXTS)]
    parser = GraphGranularityNodeParser(sentences_per_node=1, k_graph=2, t_graph=0.05, n_gra=2)
    pipeline = IngestionPipeline(transformations=[parser], docstore=SimpleDocumentStore(),
                                 vector_store=SimpleVectorStore() if strategy == "upserts" else None,
                                 docstore_strategy=DocstoreStrategy(strategy))
    first = pipeline.run(documents=list(docs))
    direct = parser.get_nodes_from_documents(docs)
    assert [n.metadata["funnel_graph_neighbors_json"] for n in first] == \
        [n.metadata["funnel_graph_neighbors_json"] for n in direct]
    assert _cross_document_edges(first) > 0
    assert pipeline.run(documents=list(docs)) == []  # nothing changed: nothing to parse
    changed = [Document(text=d.text + " A new closing sentence about the river.", id_=d.id_,
                        metadata=dict(d.metadata)) if i == 0 else d for i, d in enumerate(docs)]
    if strategy == "duplicates_only":  # a new document with the old ones
        changed = list(docs) + [Document(text="The river mill ground wheat by the river.", id_="new")]
    with pytest.raises(ValueError, match=r"GraphGranularityNodeParser.*docstore.*1 of"):
        pipeline.run(documents=changed)
    # the same through arun, on a fresh docstore (the refused run above already recorded the
    # changed documents' hashes there: the pipeline does that before it runs transformations)
    fresh = IngestionPipeline(transformations=[parser], docstore=SimpleDocumentStore(),
                              vector_store=SimpleVectorStore() if strategy == "upserts" else None,
                              docstore_strategy=DocstoreStrategy(strategy))
    assert len(asyncio.run(fresh.arun(documents=list(docs)))) == len(first)
    with pytest.raises(ValueError, match=r"GraphGranularityNodeParser.*docstore.*1 of"):
        asyncio.run(fresh.arun(documents=changed))


@pytest.mark.parametrize("cls,settings", [
    (MultiGranularityNodeParser, {"chunk_size": 10, "n_gra": 3}),
    (GraphGranularityNodeParser, {"sentences_per_node": 1, "k_graph": 2, "t_graph": 0.05, "n_gra": 2}),
])
def test_granularity_parsers_round_trip_through_to_dict_and_json(cls, settings, docs):
    """``from_dict(to_dict())`` (and JSON) give the same parser: NodeParser's ``id_func`` is
    saved by name, and the default one is read back."""
    from llama_index.core.node_parser.node_utils import default_id_func

    parser = cls(**settings)
    again = cls.from_dict(parser.to_dict())
    assert again.to_dict() == parser.to_dict() and again.id_func is default_id_func
    assert cls.from_json(parser.to_json()).to_dict() == parser.to_dict()
    assert [n.node_id for n in again.get_nodes_from_documents(docs)] == \
        [n.node_id for n in parser.get_nodes_from_documents(docs)]
    # the parsers name nodes by document, level and position (the retriever and the
    # PARENT/CHILD links read those ids): a custom id_func would be ignored, so it is refused
    with pytest.raises(ValueError, match="id_func"):
        cls(id_func=lambda i, doc: f"node-{i}", **settings)
    with pytest.raises(ValueError, match="id_func"):
        cls.from_dict({**parser.to_dict(), "id_func": {"id_func_name": "my_ids", "title": "id_func"}})
