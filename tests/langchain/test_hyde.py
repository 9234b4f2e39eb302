"""HyDERetriever inside LangChain's own compositions: over an InMemoryVectorStore and over our
dense index, as the dense side of HybridRetriever (hybrid with HyDE), and in an LCEL chain with a
prompt and an LLM. The embeddings are word counts (a real ``Embeddings`` over four words), so the
HyDE vector ``v = 1/(N+1) [f(q) + sum_k f(d_k)]`` and the similarities are worked by hand."""

from __future__ import annotations

import numpy as np
import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import FakeListLLM
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import PromptTemplate
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_tests.integration_tests import RetrieversIntegrationTests

from funnel_core.best_practices import HyDE
from funnel_core.embeddings import DenseIndex
from funnel_core.testing import ScriptedLLM
from funnel_core.units import Unit
from langchain_funnel.best_practices import HybridRetriever, HyDERetriever
from langchain_funnel.retrievers import BM25Retriever
from tests.best_practices.test_hyde import CountEmbedder

TEXTS = {"u1": "paris paris paris", "u2": "berlin", "u3": "hamlet", "u4": "bm25"}


class CountEmbeddings(Embeddings):
    """LangChain embeddings: the counts of four words (``f("paris") = [1, 0, 0, 0]``)."""

    def embed_documents(self, texts):
        return CountEmbedder().encode(list(texts)).tolist()

    def embed_query(self, text):
        return CountEmbedder().encode([text])[0].tolist()


class TestHyDERetrieverStandard(RetrieversIntegrationTests):
    """LangChain's standard retriever suite (k in the constructor and per call, async, ...)."""

    @property
    def retriever_constructor(self):
        return HyDERetriever

    @property
    def retriever_constructor_params(self) -> dict:
        store = InMemoryVectorStore(embedding=CountEmbeddings())
        store.add_documents([Document(id=f"x{i}", page_content=f"paris hamlet {'berlin ' * i}") for i in range(8)])
        return {"hyde": HyDE(ScriptedLLM("hamlet")), "vectorstore": store}

    @property
    def retriever_query_example(self) -> str:
        return "paris"


@pytest.fixture
def docs():
    return [Document(id=i, page_content=t) for i, t in TEXTS.items()]


@pytest.fixture
def store(docs):
    s = InMemoryVectorStore(embedding=CountEmbeddings())
    s.add_documents(docs)
    return s


def cos(a, b):
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def scores(documents):
    return {d.id: d.metadata["relevance_score"] for d in documents}


def test_over_a_vector_store_the_scores_follow_the_equation(store):
    llm = FakeListLLM(responses=["berlin\n\nhamlet hamlet"])  # a LangChain LLM
    r = HyDERetriever.from_llm(llm, vectorstore=store, k=3)
    out = r.invoke("paris")
    # v = 1/2 ([1,0,0,0] + f("berlin hamlet hamlet") = [0,1,2,0]) = [1/2, 1/2, 1, 0];
    # InMemoryVectorStore scores by cosine
    v = [0.5, 0.5, 1.0, 0.0]
    assert [d.id for d in out] == ["u3", "u2", "u1"]
    assert scores(out) == pytest.approx({"u3": cos(v, [0, 0, 1, 0]), "u2": cos(v, [0, 1, 0, 0]),
                                         "u1": cos(v, [3, 0, 0, 0])})
    assert out[0].metadata["funnel_hyde_documents"] == 1
    assert [d.id for d in r.invoke("paris", k=1)] == ["u3"]


def test_over_our_dense_index_n_documents_and_the_query(docs):
    index = DenseIndex(CountEmbedder(), index="exact").index([Unit(id=d.id, text=d.page_content) for d in docs])
    llm = ScriptedLLM(["berlin", "hamlet hamlet"])  # a funnel_core LLM
    r = HyDERetriever(hyde=HyDE(llm, n=2, temperature=0.7), index=index, k=4)
    # v = 1/3 ([1,0,0,0] + [0,1,0,0] + [0,0,2,0]); inner product with the counts
    assert scores(r.invoke("paris")) == pytest.approx({"u1": 1.0, "u3": 2 / 3, "u2": 1 / 3, "u4": 0.0})
    assert r.hyde.n == 2 and len(llm.calls) == 1


async def test_async_matches_sync(store):
    r = HyDERetriever(hyde=HyDE(ScriptedLLM("hamlet hamlet")), vectorstore=store, k=2)
    assert scores(await r.ainvoke("paris")) == pytest.approx(scores(r.invoke("paris")))


def test_hybrid_with_hyde_in_an_lcel_chain(docs, store):
    bm25 = BM25Retriever.from_documents(docs, k=4)
    writer = ScriptedLLM("hamlet hamlet")
    dense = HyDERetriever(hyde=HyDE(writer), vectorstore=store, k=4)
    hybrid = HybridRetriever(sparse=bm25, dense=dense, k=2, alpha=0.3)
    prompt = PromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}\nAnswer:")
    seen = []

    def reader_input(p):
        seen.append(p.to_string())
        return p

    chain = ({"context": hybrid | RunnableLambda(lambda ds: "\n".join(d.page_content for d in ds)),
              "question": RunnablePassthrough()}
             | prompt | RunnableLambda(reader_input) | FakeListLLM(responses=["Paris."]) | StrOutputParser())
    assert chain.invoke("paris") == "Paris."
    # BM25 (over "paris") finds u1 alone; the HyDE side (cosine with v = [1/2, 0, 1, 0]) ranks u3 first:
    # fused by hand with S_h = 0.3 S_sparse + S_dense (min-max): u3 = 0.3 * 1 + 1, u1 = 0.3 * 1 + 1/2
    fused = hybrid.invoke("paris")
    assert [d.id for d in fused] == ["u3", "u1"]
    assert [d.metadata["relevance_score"] for d in fused] == pytest.approx([1.3, 0.8])
    assert seen[0].startswith("Context:\nhamlet\nparis paris paris\n")
    assert [c["prompts"][0].split("\n")[1] for c in writer.calls] == ["Question: paris"]  # written once


def test_settings_are_checked(store):
    with pytest.raises(ValueError, match="exactly one of vectorstore"):
        HyDERetriever(hyde=HyDE(ScriptedLLM("x")))
    with pytest.raises(TypeError, match="unknown argument"):
        HyDERetriever(hyde=HyDE(ScriptedLLM("x")), vectorstore=store, top_k=3)
    with pytest.raises(TypeError, match="unknown argument"):
        HyDERetriever(hyde=HyDE(ScriptedLLM("x")), vectorstore=store).invoke("q", top_k=3)


def test_hyde_over_faiss_scores_relevance_not_distance(docs):
    """FAISS answers L2 distances by vector; the relevance written is the store's own conversion
    (higher = nearer), so the nearest document has the highest score, as over InMemory."""
    pytest.importorskip("faiss")
    from langchain_community.vectorstores import FAISS

    hyde = HyDE(ScriptedLLM("paris"))
    store = FAISS.from_documents(docs, CountEmbeddings(), normalize_L2=True)  # L2 order = cosine order
    faiss = HyDERetriever(hyde=hyde, vectorstore=store, k=4)
    mem_store = InMemoryVectorStore(embedding=CountEmbeddings())
    mem_store.add_documents(docs)
    mem = HyDERetriever(hyde=hyde, vectorstore=mem_store, k=4)
    got, want = faiss.invoke("paris"), mem.invoke("paris")
    assert got[0].id == want[0].id == "u1"
    scores = [d.metadata["relevance_score"] for d in got]
    assert scores == sorted(scores, reverse=True) and scores[0] > scores[-1]
