"""LangChain adapters of the best-practice components, inside LCEL: InMemoryVectorStore (real
MiniLM embeddings) + our BM25 -> HybridRetriever (standard retriever suite, HyDE step) ->
ExtractiveCompressor -> RepackTransformer; query_classifier_branch."""

from typing import Type

import pytest
from langchain_core.documents import Document
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.runnables import RunnableLambda
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_tests.integration_tests import RetrieversIntegrationTests

from funnel_core.best_practices.classify import NotFittedError, QueryClassifier
from funnel_core.bm25 import BM25Index
from funnel_core.embeddings import SentenceEmbedder
from funnel_core.units import Unit
from langchain_funnel._base import UnitRetriever
from langchain_funnel.best_practices import (
    ExtractiveCompressor,
    HybridRetriever,
    RepackTransformer,
    SentenceEmbedderEmbeddings,
    hyde_query,
    query_classifier_branch,
)
from langchain_funnel.funnel import rerank_chain
from tests.conftest import CORPUS

pytestmark = pytest.mark.models  # builds or loads a model in most tests

HYPOTHETICAL_DOC = "Hamlet is a tragedy by the English playwright William Shakespeare."
_EMBEDDER = SentenceEmbedder()  # one model for the whole module (loaded on first use)


class BM25DocRetriever(UnitRetriever):
    """Our BM25 as a LangChain retriever (records the queries it receives)."""

    index: BM25Index
    seen: list = []

    def _search(self, query: str, k: int):
        self.seen.append(query)
        return self.index.search(query, k=k)


def build_sides(k_sides: int = 5):
    index = BM25Index().index([Unit(id=i, text=t, metadata=dict(m)) for i, t, m in CORPUS])
    bm25 = BM25DocRetriever(index=index, k=k_sides, seen=[])
    store = InMemoryVectorStore(embedding=SentenceEmbedderEmbeddings(embedder=_EMBEDDER))
    store.add_documents([Document(id=i, page_content=t, metadata=dict(m)) for i, t, m in CORPUS])
    return bm25, store.as_retriever(search_kwargs={"k": k_sides})


class TestHybridRetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> Type[HybridRetriever]:
        return HybridRetriever

    @property
    def retriever_constructor_params(self) -> dict:
        bm25, dense = build_sides(8)
        return {"sparse": bm25, "dense": dense}

    @property
    def retriever_query_example(self) -> str:
        return "Who wrote Hamlet?"


@pytest.fixture(scope="module")
def sides():
    return build_sides()


def test_embeddings_adapter_is_real_minilm():
    emb = SentenceEmbedderEmbeddings(embedder=_EMBEDDER)
    a, b, c = emb.embed_documents(["Paris is in France.", "France's capital is Paris.", "Bananas."])
    q = emb.embed_query("Paris is in France.")
    dot = lambda x, y: sum(i * j for i, j in zip(x, y))  # noqa: E731
    assert len(a) == 384 and dot(a, b) > dot(a, c) + 0.2 and dot(a, q) == pytest.approx(1.0, abs=1e-4)


def test_hybrid_fuses_scores_into_metadata(sides):
    bm25, dense = sides
    retriever = HybridRetriever(sparse=bm25, dense=dense, k=3)
    docs = retriever.invoke("Which tragedy did Shakespeare write?")
    assert len(docs) == 3 and docs[0].id in {"d5", "d6"}
    m = docs[0].metadata["funnel"]
    assert m["score"] == m["scores"]["hybrid"] and "bm25" in m["scores"]
    assert 0.0 <= m["dense_score"] <= 1.0 and docs[0].metadata["title"] in {"Hamlet", "Shakespeare"}
    assert [d.metadata["funnel"]["score"] for d in docs] == sorted((d.metadata["funnel"]["score"] for d in docs), reverse=True)
    assert len(retriever.invoke("Shakespeare", k=1)) == 1
    rrf = HybridRetriever(sparse=bm25, dense=dense, method="rrf", rrf_k=10)
    assert rrf.invoke("Eiffel Tower in Paris")[0].id == "d2"
    assert retriever.invoke("   ") == []


async def test_hybrid_async_matches_sync(sides):
    bm25, dense = sides
    retriever = HybridRetriever(sparse=bm25, dense=dense, k=4)
    sync = retriever.invoke("capital of Germany")
    got = await retriever.ainvoke("capital of Germany")
    assert [d.id for d in got] == [d.id for d in sync]


def test_hyde_step_feeds_dense_side_only(sides):
    bm25, dense = sides
    llm = FakeListLLM(responses=[HYPOTHETICAL_DOC])
    retriever = HybridRetriever(sparse=bm25, dense=dense, k=2,
                                dense_query=hyde_query(llm, include_original=False))
    bm25.seen.clear()
    q = "who is the author of the Danish prince play?"
    docs = retriever.invoke(q)
    assert bm25.seen == [q]  # the sparse side got the user's words (and found nothing)
    assert docs[0].id in {"d5", "d6"}
    assert hyde_query(FakeListLLM(responses=["a passage"])).invoke("q?") == "q?\na passage"
    # a per-call dense query overrides the HyDE step
    assert retriever.invoke(q, dense_query="The Eiffel Tower is in Paris.")[0].id == "d2"


def test_lcel_chain_hybrid_compress_repack(sides):
    bm25, dense = sides
    retriever = HybridRetriever(sparse=bm25, dense=dense, k=4)
    compressor = ExtractiveCompressor(embedder=_EMBEDDER, ratio=0.5)
    assert compressor.stage.embedder is _EMBEDDER
    chain = rerank_chain(retriever, compressor) | RepackTransformer(order="reverse")
    docs = chain.invoke("Who wrote Hamlet?")
    assert 1 <= len(docs) <= 4
    assert docs[-1].metadata["funnel"]["retrieval_rank"] == 0 and "Hamlet" in " ".join(d.page_content for d in docs)
    kept = sum(d.metadata["funnel"]["compression"]["kept_tokens"] for d in docs)
    before = sum(len(d.page_content.split()) for d in retriever.invoke("Who wrote Hamlet?"))
    assert kept <= 0.5 * before
    fmt = chain | RunnableLambda(lambda ds: "\n".join(d.page_content for d in ds))
    assert isinstance(fmt.invoke("Who wrote Hamlet?"), str)


async def test_compressor_and_repack_async_and_orders():
    topics = ["apples", "rivers", "engines", "violins", "glaciers"]
    docs = [Document(id=f"x{i}", page_content=f"Sentence about {t}. Filler words here.")
            for i, t in enumerate(topics)]
    assert [d.id for d in RepackTransformer(order="sides").transform_documents(docs)] == \
        ["x0", "x2", "x4", "x3", "x1"]
    assert [d.id for d in await RepackTransformer().ainvoke(docs)] == ["x4", "x3", "x2", "x1", "x0"]
    comp = ExtractiveCompressor(method="bm25", ratio=0.1)  # 30 tokens in, budget 3
    out = await comp.acompress_documents(docs, "violins")
    assert len(out) == 1
    assert out[0].id == "x3" and out[0].page_content == "Sentence about violins."
    assert docs[3].page_content.endswith("Filler words here.")


def test_bad_input(sides):
    bm25, dense = sides
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\]"):
        HybridRetriever(sparse=bm25, dense=dense, alpha=2)
    with pytest.raises(ValueError, match="k must be >= 1"):
        HybridRetriever(sparse=bm25, dense=dense, k=0)
    with pytest.raises(ValueError, match="k must be >= 1"):
        HybridRetriever(sparse=bm25, dense=dense).invoke("q", k=-1)
    with pytest.raises(ValueError, match="unknown normalization"):
        HybridRetriever(sparse=bm25, dense=dense, normalization="softmax")
    with pytest.raises(ValueError, match="unknown repack order"):
        RepackTransformer(order="random")
    with pytest.raises(ValueError, match=r"ratio must be in \(0, 1\]"):
        ExtractiveCompressor(ratio=1.2)
    with pytest.raises(NotFittedError):
        query_classifier_branch(QueryClassifier(embedder=_EMBEDDER), RunnableLambda(str), RunnableLambda(str))


def test_query_classifier_branch_routes(sides):
    bm25, dense = sides
    clf = QueryClassifier.pretrained(embedder=_EMBEDDER)
    rag = HybridRetriever(sparse=bm25, dense=dense, k=2) | RunnableLambda(
        lambda ds: {"route": "rag", "ids": [d.id for d in ds]})
    direct = RunnableLambda(lambda q: {"route": "direct", "ids": []})
    branch = query_classifier_branch(clf, rag, direct)
    assert branch.invoke("Who wrote the tragedy Hamlet?")["route"] == "rag"
    assert branch.invoke("Rewrite this more politely: send me the file now.")["route"] == "direct"
    keyed = query_classifier_branch(clf, RunnableLambda(lambda x: "rag"),
                                    RunnableLambda(lambda x: "direct"), query_key="question")
    assert keyed.invoke({"question": "What is 7 times 8?"}) == "direct"
    with pytest.raises(TypeError, match="key 'question'"):
        keyed.invoke("What is 7 times 8?")
