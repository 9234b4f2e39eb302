"""Mix-of-Granularity in LangChain: splitters, MixOfGranularityRetriever, LCEL, standard tests."""

import json
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from langchain_tests.integration_tests import RetrieversIntegrationTests

from langchain_funnel.granularity import (
    GraphGranularitySplitter,
    MixOfGranularityRetriever,
    MultiGranularityTextSplitter,
)

TEXTS = [
    "Paris is the capital of France. The Eiffel Tower stands in Paris. It was built in 1889 for a "
    "world fair. Gustave Eiffel's company designed the tower. The Louvre is the largest art museum. "
    "It holds the Mona Lisa. The Seine river flows through the city. Many bridges cross the Seine.",
    "Hamlet is a tragedy by William Shakespeare. It is set in Denmark. Prince Hamlet seeks revenge "
    "for his father's murder. Shakespeare also wrote Macbeth and Othello. The Globe theatre staged "
    "his plays in London.",
    "BM25 is a ranking function. It scores documents by term frequency and inverse document "
    "frequency. Dense retrieval encodes queries as vectors. A query about BM25 finds this text.",
]


def _docs():
    return [Document(page_content=t, metadata={"title": f"T{i}"}, id=f"d{i}") for i, t in enumerate(TEXTS)]


def _hierarchy_docs():
    return MultiGranularityTextSplitter(chunk_size=10, n_gra=3).split_documents(_docs())


def test_splitter_puts_the_hierarchy_in_metadata():
    splitter = MultiGranularityTextSplitter(chunk_size=10, n_gra=3)
    out = splitter.split_documents(_docs())
    by_id = {d.id: d for d in out}
    assert [d.metadata["funnel_granularity"] for d in out] == sorted(d.metadata["funnel_granularity"] for d in out)
    for d in out:
        g = d.metadata["funnel_granularity"]
        assert d.metadata["title"].startswith("T") and d.metadata["funnel_doc_id"].startswith("d")
        if g < 3:
            parent = by_id[d.metadata["funnel_parent_id"]]
            assert parent.metadata["funnel_granularity"] == g + 1 and d.id in json.loads(parent.metadata["funnel_child_ids_json"])
            assert d.page_content in parent.page_content
        else:
            assert "funnel_parent_id" not in d.metadata
    assert splitter.split_text(TEXTS[0]) == [d.page_content for d in out
                                             if d.metadata["funnel_doc_id"] == "d0"]
    finest = MultiGranularityTextSplitter(chunk_size=10, n_gra=3, levels="finest")
    assert finest.split_text(TEXTS[0]) == [d.page_content for d in out
                                           if d.metadata["funnel_doc_id"] == "d0" and d.metadata["funnel_granularity"] == 1]
    assert splitter.transform_documents(_docs()) == out
    created = splitter.create_documents(["Tiny note."], [{"src": "x"}])
    assert [d.page_content for d in created] == ["Tiny note."] * 3 and created[0].metadata["src"] == "x"
    with pytest.raises(ValueError, match="n_gra"):
        MultiGranularityTextSplitter(n_gra=0)
    with pytest.raises(TypeError, match="list of Documents"):
        splitter.split_documents(_docs()[0])


def test_retriever_mog_rule_k_and_metadata():
    retriever = MixOfGranularityRetriever(documents=_hierarchy_docs(), k=2)
    docs = retriever.invoke("Who designed the Eiffel Tower?")
    assert len(docs) == 2 and "Eiffel" in docs[0].page_content
    assert docs[0].metadata["funnel_chosen_level"] == 1  # no router: uniform weights -> finest level
    assert json.loads(docs[0].metadata["funnel_router_weights_json"]) == [1.0, 1.0, 1.0]
    assert isinstance(docs[0].metadata["relevance_score"], float)
    assert len(retriever.invoke("Shakespeare Hamlet Denmark", k=3)) == 3
    assert retriever.invoke("   ") == []
    with pytest.raises(ValueError, match="k must be >= 1"):
        retriever.invoke("Paris", k=0)
    with pytest.raises(ValueError, match="needs documents"):
        MixOfGranularityRetriever(documents=[])


async def test_retriever_async_and_graph_splitter():
    splitter = GraphGranularitySplitter(sentences_per_node=1, k_graph=2, t_graph=0.05, n_gra=2)
    nodes = splitter.split_documents(_docs())
    assert splitter.last_build_seconds is not None
    assert any(json.loads(d.metadata["funnel_graph_neighbors_json"]) for d in nodes)
    retriever = MixOfGranularityRetriever(documents=nodes, k=1, n_gra=2)
    out = await retriever.ainvoke("Who designed the Eiffel Tower?")
    assert len(out) == 1 and "Eiffel" in out[0].page_content
    assert out[0].metadata["funnel_center_id"] == out[0].metadata["funnel_finest_id"]
    with pytest.warns(UserWarning, match="no edges"):
        empty = GraphGranularitySplitter(t_graph=1.0, n_gra=2).split_documents(_docs())
    assert all(json.loads(d.metadata["funnel_graph_neighbors_json"]) == [] for d in empty)
    with pytest.warns(UserWarning, match="no edges"):
        empty_retriever = MixOfGranularityRetriever(documents=empty, n_gra=2)
    assert empty_retriever.invoke("Hamlet")[0].page_content.startswith("Hamlet")


def test_lcel_chain_with_mog_retriever():
    retriever = MixOfGranularityRetriever(documents=_hierarchy_docs(), k=2)
    prompt = ChatPromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}")
    fmt = RunnableLambda(lambda docs: "\n\n".join(d.page_content for d in docs))
    chain = {"context": retriever | fmt, "question": RunnablePassthrough()} | prompt | \
        RunnableLambda(lambda p: p.to_string()) | StrOutputParser()
    text = chain.invoke("Which river flows through Paris?")
    assert "Seine" in text and "Question: Which river flows through Paris?" in text


class TestMixOfGranularityRetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[MixOfGranularityRetriever]:
        return MixOfGranularityRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"documents": _hierarchy_docs()}

    @property
    def retriever_query_example(self) -> str:
        return "Paris Eiffel Tower Seine Louvre"


@pytest.mark.parametrize("make", [
    lambda: MultiGranularityTextSplitter(chunk_size=8, n_gra=2),
    lambda: GraphGranularitySplitter(sentences_per_node=1, k_graph=2, t_graph=0.05, n_gra=2),
], ids=["multi_granularity", "graph"])
def test_splitters_are_text_splitters_inside_parent_document_retriever(make):
    """ParentDocumentRetriever (langchain-classic) validates
    ``child_splitter: TextSplitter``; ours were plain document transformers and were rejected
    ("Input should be an instance of TextSplitter")."""
    from langchain_classic.retrievers import ParentDocumentRetriever
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_core.stores import InMemoryStore
    from langchain_core.vectorstores import InMemoryVectorStore
    from langchain_text_splitters import TextSplitter

    splitter = make()
    assert isinstance(splitter, TextSplitter)
    store = InMemoryVectorStore(DeterministicFakeEmbedding(size=16))
    pdr = ParentDocumentRetriever(vectorstore=store, docstore=InMemoryStore(),
                                  child_splitter=splitter)
    pdr.add_documents(_docs(), ids=["p0", "p1", "p2"])
    children = list(store.store.values())
    # each parent was split into its own children (several per parent), linked by doc_id
    assert {c["metadata"]["doc_id"] for c in children} == {"p0", "p1", "p2"}
    assert len(children) > len(TEXTS)
    for c in children:
        parent = TEXTS[int(c["metadata"]["doc_id"][1])]
        assert c["text"] in parent or all(w in parent for w in c["text"].split())
        assert c["metadata"]["title"] == f"T{c['metadata']['doc_id'][1]}"  # user key kept
    got = pdr.invoke("Who designed the Eiffel Tower?")
    assert got and all(d.page_content in TEXTS for d in got)  # whole parents come back
    assert splitter.split_text(TEXTS[0])  # the TextSplitter API on a plain text


@pytest.mark.parametrize("make", [
    lambda: MultiGranularityTextSplitter(chunk_size=10, n_gra=3),
    lambda: GraphGranularitySplitter(sentences_per_node=1, k_graph=2, t_graph=0.05, n_gra=2),
], ids=["multi_granularity", "graph"])
def test_splitter_and_mog_retriever_inside_lcel_and_an_ensemble(make):
    """The splitter is a Runnable (``load | splitter`` in LCEL, sync and async, the same chunks
    as ``split_documents``), and the MoG retriever over its output takes part in LangChain's own
    ``EnsembleRetriever`` (reciprocal rank fusion with another retriever) inside an LCEL chain."""
    import asyncio

    from langchain_classic.retrievers import EnsembleRetriever

    from langchain_funnel.retrievers import BM25Retriever

    splitter = make()
    load = RunnableLambda(lambda _: _docs(), name="load")
    chunks = (load | splitter).invoke("corpus")
    assert [d.id for d in chunks] == [d.id for d in splitter.split_documents(_docs())]
    assert [d.id for d in asyncio.run((load | splitter).ainvoke("corpus"))] == [d.id for d in chunks]
    mog = MixOfGranularityRetriever(documents=chunks, k=2, n_gra=2)
    ensemble = EnsembleRetriever(retrievers=[mog, BM25Retriever.from_documents(_docs(), k=2)],
                                 weights=[0.5, 0.5])
    chain = {"context": ensemble | RunnableLambda(lambda ds: "\n".join(d.page_content for d in ds)),
             "question": RunnablePassthrough()} | ChatPromptTemplate.from_template(
        "{context}\n\nQ: {question}")
    text = chain.invoke("Who designed the Eiffel Tower?").to_string()
    assert "Eiffel" in text and "Q: Who designed the Eiffel Tower?" in text
    fused = ensemble.invoke("Who designed the Eiffel Tower?")
    assert any(d.metadata.get("funnel_chosen_level") is not None or "funnel_granularity" in d.metadata
               for d in fused)  # the MoG retriever's documents are among the fused ones


def test_splitter_edits_reach_the_core_splitter():
    """A splitter's settings are fields (the ones LlamaIndex's node parsers have, declared once in
    funnel_core.granularity.fields); an edit is validated by the core splitter before the field
    changes, and honoured at the next call."""
    splitter = MultiGranularityTextSplitter(chunk_size=10, n_gra=3)
    assert {d.metadata["funnel_granularity"] for d in splitter.split_documents(_docs())} == {1, 2, 3}
    splitter.n_gra = 2
    assert splitter.stage.n_gra == 2
    assert {d.metadata["funnel_granularity"] for d in splitter.split_documents(_docs())} == {1, 2}
    with pytest.raises(ValueError, match="n_gra"):
        splitter.n_gra = 0
    assert splitter.n_gra == 2 and splitter.stage.n_gra == 2  # a refused edit changes nothing
    with pytest.raises(TypeError, match=r"\['chunk_sise'\].*accepted"):
        MultiGranularityTextSplitter(chunk_sise=10)
    with pytest.raises(ValueError, match="levels must be 'all'"):
        MultiGranularityTextSplitter(levels="coarsest")
    graph = GraphGranularitySplitter(sentences_per_node=1, k_graph=2, t_graph=0.05)
    graph.k_graph = 1
    assert graph.stage.k_graph == 1
    assert graph.split_documents(_docs()) and graph.last_build_seconds is not None
