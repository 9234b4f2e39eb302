"""LangChain BM25Retriever and ClusteredBM25Retriever: standard tests, LCEL, k, filters, save/load."""

import asyncio
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_tests.integration_tests import RetrieversIntegrationTests

from funnel_core import PersistError
from langchain_funnel.retrievers import BM25Retriever, ClusteredBM25Retriever
from tests.conftest import CORPUS

TEXTS = [t for _, t, _ in CORPUS] * 2  # enough documents for the standard suite's k checks
METAS = [dict(m, n=i) for i, (_, _, m) in enumerate(CORPUS * 2)]


class TestBM25RetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[BM25Retriever]:
        return BM25Retriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        from funnel_core import BM25Index

        return {"index": BM25Index.from_texts(TEXTS, metadatas=METAS), "k": 3}

    @property
    def retriever_query_example(self) -> str:
        return "capital city of France Paris"


class TestClusteredBM25RetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[ClusteredBM25Retriever]:
        return ClusteredBM25Retriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
        from funnel_core.units import Unit

        units = [Unit(id=str(i), text=t, metadata=m) for i, (t, m) in enumerate(zip(TEXTS, METAS))]
        return {"index": ClusteredBM25Index(max_tokens=40, knn_k=3, knn_threshold=0.05).index(units),
                "k": 3, "k_clusters": 5}

    @property
    def retriever_query_example(self) -> str:
        return "capital city of France Paris tower"


def format_docs(docs: list[Document]) -> str:
    return "\n\n".join(d.page_content for d in docs)


def test_lcel_chain_with_clustered_retriever():
    retriever = ClusteredBM25Retriever.from_texts(TEXTS[:8], metadatas=METAS[:8], k=2, max_tokens=40,
                                                  knn_k=3, knn_threshold=0.05)
    prompt = ChatPromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}")
    chain = {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt
    value = chain.invoke("Who wrote Hamlet?")
    assert "Shakespeare" in value.to_string()


def test_scores_and_k_per_call():
    r = BM25Retriever.from_texts(TEXTS[:8], metadatas=METAS[:8], k=4)
    docs = r.invoke("Eiffel Tower")
    assert docs[0].page_content.startswith("The Eiffel Tower")
    assert isinstance(docs[0].metadata["relevance_score"], float) and docs[0].metadata["funnel_score_bm25"] > 0
    assert len(r.invoke("Paris capital France tower", k=1)) == 1
    assert asyncio.run(r.ainvoke("Eiffel Tower", k=1))[0].page_content == docs[0].page_content


def test_per_call_filter_and_no_padding():
    r = BM25Retriever.from_texts(TEXTS[:8], metadatas=METAS[:8], k=5)
    docs = r.invoke("Paris capital", filter={"topic": "lit"})
    assert docs == []
    docs = r.invoke("Paris capital", filter=lambda m: m["title"] == "Berlin")
    assert [d.metadata["title"] for d in docs] == ["Berlin"]


def test_save_load(tmp_path):
    r = ClusteredBM25Retriever.from_texts(TEXTS[:8], metadatas=METAS[:8], k=3, max_tokens=40,
                                          knn_k=3, knn_threshold=0.05)
    r.save(tmp_path / "c")
    again = ClusteredBM25Retriever.load(tmp_path / "c", k=3)
    q = "playwright poet"
    assert [d.page_content for d in r.invoke(q)] == [d.page_content for d in again.invoke(q)]
    flat = BM25Retriever.from_documents([Document(page_content=t, metadata=m) for t, m in zip(TEXTS[:8], METAS[:8])])
    flat.save(tmp_path / "f")
    assert BM25Retriever.load(tmp_path / "f").invoke("Berlin")[0].metadata["title"] == "Berlin"
    with pytest.raises(PersistError):
        BM25Retriever.load(tmp_path / "missing")


def test_bad_input():
    with pytest.raises(ValueError, match="empty corpus"):
        BM25Retriever.from_texts([])
    with pytest.raises(TypeError, match="single str"):
        ClusteredBM25Retriever.from_texts("just one string")
    with pytest.raises(ValueError, match="k must be >= 1"):
        BM25Retriever.from_texts(TEXTS[:3], k=0)
    r = BM25Retriever.from_texts(TEXTS[:3])
    with pytest.raises(ValueError, match="k must be >= 1"):
        r.invoke("Paris", k=-1)
    with pytest.raises(TypeError, match="query must be a str"):
        r.invoke(3)
    assert r.invoke("  ") == []
