"""Every public class of both adapter packages (enumerated from ``__all__``, so a new class
cannot be forgotten): a misspelt keyword raises (for pydantic classes naming the accepted
fields, as LlamaIndex's SentenceTransformerRerank and langchain-classic's CrossEncoderReranker
do), and the object pickles and deep-copies before and after one use, the copy giving the same
result as the original (loaded models reload lazily in the copy)."""

from __future__ import annotations

import copy
import inspect
import pickle
from typing import Any, Callable

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.vectorstores import InMemoryVectorStore
from llama_index.core import Document as LIDocument
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import MockLLM
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from pydantic import BaseModel

import langchain_funnel as lc
import llama_index_funnel as li
from funnel_core.best_practices.classify import QueryClassifier
from funnel_core.embeddings import DenseIndex, SentenceEmbedder
from funnel_core.testing import ScriptedLLM
from funnel_core.units import Unit
from tests.conftest import CORPUS

pytestmark = pytest.mark.models

Q = "Who wrote Hamlet?"
CONTEXT = " ".join(t for _, t, _ in CORPUS)
#: Abstract bases in ``__all__`` (subclassed by the classes below, never built by a user).
ABSTRACT = {"StagePostprocessor", "UnitRetriever", "StageCompressor"}


class Ctx:
    """Model folders and shared corpora, built on first use (only the models a case needs)."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self.request = request

    def path(self, fixture: str) -> str:
        return self.request.getfixturevalue(fixture)

    @property
    def ce(self) -> str:
        return self.path("tiny_cross_encoder_path")

    @property
    def t5(self) -> str:
        return self.path("tiny_t5_path")

    @property
    def llama(self) -> str:
        return self.path("tiny_llama_path")

    def embedder(self) -> SentenceEmbedder:  # a tiny BERT loads as a sentence embedder too
        return SentenceEmbedder(self.ce, device="cpu")

    def classifier(self) -> QueryClassifier:
        queries = ["Who wrote Hamlet?", "Where is the Eiffel Tower?", "What is BM25?",
                   "Translate: hello", "What is 2 plus 2?", "Say hi"]
        labels = ["retrieval"] * 3 + ["sufficient"] * 3
        return QueryClassifier(embedder=self.embedder()).fit(queries, labels)


def nodes() -> list[NodeWithScore]:
    return [NodeWithScore(node=TextNode(id_=i, text=t, metadata=dict(m)), score=1.0)
            for i, t, m in CORPUS]


def docs() -> list[Document]:
    return [Document(id=i, page_content=t, metadata=dict(m)) for i, t, m in CORPUS]


def units() -> list[Unit]:
    return [Unit(id=i, text=t, metadata=dict(m)) for i, t, m in CORPUS]


def li_bm25(**kw: Any) -> Any:
    return li.BM25Retriever.from_defaults(nodes=[n.node for n in nodes()], similarity_top_k=4, **kw)


def lc_bm25(**kw: Any) -> Any:
    return lc.BM25Retriever.from_documents(docs(), k=4, **kw)


def li_ids(out: Any) -> list[str]:
    return [n.node.node_id for n in out]


def lc_ids(out: Any) -> list[str]:
    return [d.id for d in out]


def rerank_li(obj: Any) -> Any:
    return li_ids(obj.postprocess_nodes(nodes(), QueryBundle(Q)))


def rerank_lc(obj: Any) -> Any:
    return lc_ids(obj.compress_documents(docs(), Q))


def retrieve_li(obj: Any) -> Any:
    return li_ids(obj.retrieve(Q))


def retrieve_lc(obj: Any) -> Any:
    return lc_ids(obj.invoke(Q))


def texts(out: Any) -> list[str]:
    return [getattr(x, "text", None) or getattr(x, "page_content", "") for x in out]


def run_stage(obj: Any) -> Any:
    return [u.id for u in obj(Q, units())]


# name -> (build(ctx, **extra), use(obj)); ``extra`` is where the misspelt keyword goes
Case = tuple[Callable[..., Any], Callable[[Any], Any]]

LI_CASES: dict[str, Case] = {
    "LlamaIndexLLM": (lambda c, **kw: li.LlamaIndexLLM(MockLLM(max_tokens=3), **kw),
                      lambda o: o.generate(["a prompt"])),
    "ForwardLookupQueryBundle": (lambda c, **kw: li.ForwardLookupQueryBundle(query_str=Q, **kw),
                                 lambda o: o.query_str),
    "ForwardLookupQueryTransform": (
        lambda c, **kw: li.ForwardLookupQueryTransform(MockLLM(max_tokens=3), context=CONTEXT,
                                                       samples=1, chunk_words=20, **kw),
        lambda o: o.run(Q).query_str),
    "ForwardLookupRetriever": (
        lambda c, **kw: li.ForwardLookupRetriever(MockLLM(max_tokens=3), context=CONTEXT,
                                                  variant="B", chunk_words=12, **kw),
        lambda o: texts(n.node for n in o.retrieve(Q))),
    "RankRAGRerank": (lambda c, **kw: li.RankRAGRerank(llm=c.llama, top_n=2, **kw), rerank_li),
    "AttentionLMRerank": (lambda c, **kw: li.AttentionLMRerank(model=c.llama, top_n=2, **kw),
                          rerank_li),
    "FiDAttentionRerank": (lambda c, **kw: li.FiDAttentionRerank(model=c.t5, top_n=2, **kw),
                           rerank_li),
    "CrossEncoderRerank": (lambda c, **kw: li.CrossEncoderRerank(model=c.ce, top_n=2, **kw),
                           rerank_li),
    "MonoT5Rerank": (lambda c, **kw: li.MonoT5Rerank(model=c.t5, top_n=2, **kw), rerank_li),
    "LaterChunkingPostprocessor": (lambda c, **kw: li.LaterChunkingPostprocessor(words=4, **kw),
                                   lambda o: texts(n.node for n in o.postprocess_nodes(
                                       nodes(), QueryBundle(Q)))),
    "ExtractiveCompressorPostprocessor": (
        lambda c, **kw: li.ExtractiveCompressorPostprocessor(method="bm25", ratio=0.5, **kw),
        lambda o: texts(n.node for n in o.postprocess_nodes(nodes(), QueryBundle(Q)))),
    "RepackPostprocessor": (lambda c, **kw: li.RepackPostprocessor(**kw), rerank_li),
    "HybridRetriever": (lambda c, **kw: li.HybridRetriever(li_bm25(), li_bm25(), **kw),
                        retrieve_li),
    "QueryClassifierGate": (lambda c, **kw: li.QueryClassifierGate(li_bm25(), c.classifier(),
                                                                   **kw), retrieve_li),
    "QueryClassifierQueryEngine": (
        lambda c, **kw: li.QueryClassifierQueryEngine(
            query_engine=__import__("llama_index.core.query_engine", fromlist=["x"])
            .RetrieverQueryEngine.from_args(li_bm25(), llm=MockLLM(max_tokens=3)),
            llm=MockLLM(max_tokens=3), classifier=c.classifier(), **kw),
        lambda o: o.query(Q).metadata["needs_retrieval"]),
    "SentenceEmbedderEmbedding": (
        lambda c, **kw: li.SentenceEmbedderEmbedding(embedder=c.embedder(), **kw),
        lambda o: [round(x, 4) for x in o.get_text_embedding("a text")]),
    "GraphGranularityNodeParser": (
        lambda c, **kw: li.GraphGranularityNodeParser(sentences_per_node=1, t_graph=0.0, **kw),
        lambda o: texts(o.get_nodes_from_documents([LIDocument(text=CONTEXT, id_="doc")]))),
    "MultiGranularityNodeParser": (
        lambda c, **kw: li.MultiGranularityNodeParser(chunk_size=6, n_gra=2, **kw),
        lambda o: texts(o.get_nodes_from_documents([LIDocument(text=CONTEXT, id_="doc")]))),
    "MixOfGranularityRetriever": (
        lambda c, **kw: li.MixOfGranularityRetriever(
            li.MultiGranularityNodeParser(chunk_size=6, n_gra=2).get_nodes_from_documents(
                [LIDocument(text=CONTEXT, id_="doc")]), similarity_top_k=2, **kw),
        lambda o: texts(n.node for n in o.retrieve(Q))),
    "FunnelRetriever": (lambda c, **kw: li.FunnelRetriever(
        [li_bm25(), li.CrossEncoderRerank(model=c.ce, top_n=2)], **kw), retrieve_li),
    "PostprocessorStage": (lambda c, **kw: li.PostprocessorStage(
        li.CrossEncoderRerank(model=c.ce, top_n=2), **kw), run_stage),
    "RetrieverStage": (lambda c, **kw: li.RetrieverStage(li_bm25(), **kw), run_stage),
    "BM25Retriever": (lambda c, **kw: li_bm25(**kw), retrieve_li),
    "HyDETransform": (
        lambda c, **kw: li.HyDETransform(ScriptedLLM("Hamlet was written by Shakespeare."),
                                         embed_model=MockEmbedding(embed_dim=8), **kw),
        lambda o: o.run(Q).custom_embedding_strs),
    "ClusteredBM25Retriever": (
        lambda c, **kw: li.ClusteredBM25Retriever.from_defaults(
            nodes=[n.node for n in nodes()], similarity_top_k=3, max_tokens=40, knn_k=3,
            knn_threshold=0.05, **kw), retrieve_li),
    "DenseRetriever": (
        lambda c, **kw: li.DenseRetriever(DenseIndex(c.embedder()).index(units()),
                                          [n.node for n in nodes()], similarity_top_k=3, **kw),
        retrieve_li),
}

LC_CASES: dict[str, Case] = {
    "LangChainLLM": (lambda c, **kw: lc.LangChainLLM(FakeListLLM(responses=["x"] * 9), **kw),
                     lambda o: o.generate(["a prompt"])),
    "ForwardLookupRetriever": (
        lambda c, **kw: lc.ForwardLookupRetriever(llm=FakeListLLM(responses=["A: x"] * 99),
                                                  context=CONTEXT, variant="B", chunk_words=12,
                                                  **kw),
        lambda o: texts(o.invoke(Q))),
    "RankRAGReranker": (lambda c, **kw: lc.RankRAGReranker(llm=c.llama, top_n=2, **kw), rerank_lc),
    "AttentionLMReranker": (lambda c, **kw: lc.AttentionLMReranker(model=c.llama, top_n=2, **kw),
                            rerank_lc),
    "FiDAttentionReranker": (lambda c, **kw: lc.FiDAttentionReranker(model=c.t5, top_n=2, **kw),
                             rerank_lc),
    "CrossEncoderReranker": (lambda c, **kw: lc.CrossEncoderReranker(model=c.ce, top_n=2, **kw),
                             rerank_lc),
    "MonoT5Reranker": (lambda c, **kw: lc.MonoT5Reranker(model=c.t5, top_n=2, **kw), rerank_lc),
    "CompressionRetriever": (
        lambda c, **kw: lc.CompressionRetriever(
            base_retriever=lc_bm25(), base_compressor=lc.CrossEncoderReranker(model=c.ce, top_n=2),
            **kw), retrieve_lc),
    "LaterChunkingTransformer": (lambda c, **kw: lc.LaterChunkingTransformer(words=4, **kw),
                                 lambda o: texts(o.transform_documents(docs()))),
    "ExtractiveCompressor": (lambda c, **kw: lc.ExtractiveCompressor(method="bm25", ratio=0.5,
                                                                      **kw),
                             lambda o: texts(o.compress_documents(docs(), Q))),
    "HybridRetriever": (lambda c, **kw: lc.HybridRetriever(sparse=lc_bm25(), dense=lc_bm25(), **kw),
                        retrieve_lc),
    "RepackTransformer": (lambda c, **kw: lc.RepackTransformer(**kw),
                          lambda o: lc_ids(o.transform_documents(docs()))),
    "SentenceEmbedderEmbeddings": (
        lambda c, **kw: lc.SentenceEmbedderEmbeddings(embedder=c.embedder(), **kw),
        lambda o: [round(x, 4) for x in o.embed_query("a text")]),
    "GraphGranularitySplitter": (
        lambda c, **kw: lc.GraphGranularitySplitter(sentences_per_node=1, t_graph=0.0, **kw),
        lambda o: texts(o.split_documents([Document(page_content=CONTEXT, id="doc")]))),
    "MultiGranularityTextSplitter": (
        lambda c, **kw: lc.MultiGranularityTextSplitter(chunk_size=6, n_gra=2, **kw),
        lambda o: texts(o.split_documents([Document(page_content=CONTEXT, id="doc")]))),
    "MixOfGranularityRetriever": (
        lambda c, **kw: lc.MixOfGranularityRetriever(
            documents=lc.MultiGranularityTextSplitter(chunk_size=6, n_gra=2).split_documents(
                [Document(page_content=CONTEXT, id="doc")]), k=2, **kw),
        lambda o: texts(o.invoke(Q))),
    "FunnelRetriever": (lambda c, **kw: lc.FunnelRetriever.from_stages(
        lc_bm25(), lc.CrossEncoderReranker(model=c.ce, top_n=2)).model_copy(update=kw)
        if not kw else lc.FunnelRetriever(funnel=lc.FunnelRetriever.from_stages(lc_bm25()).funnel,
                                          **kw),
        retrieve_lc),
    "LCCompressorStage": (lambda c, **kw: lc.LCCompressorStage(
        lc.CrossEncoderReranker(model=c.ce, top_n=2), **kw), run_stage),
    "LCRetrieverStage": (lambda c, **kw: lc.LCRetrieverStage(lc_bm25(), **kw), run_stage),
    "LCRunnableStage": (lambda c, **kw: lc.LCRunnableStage(
        lc.CrossEncoderReranker(model=c.ce, top_n=2), **kw), run_stage),
    "BM25Retriever": (lambda c, **kw: lc_bm25(**kw), retrieve_lc),
    "HyDERetriever": (
        lambda c, **kw: lc.HyDERetriever.from_llm(ScriptedLLM("Hamlet was written by Shakespeare."),
                                                  vectorstore=InMemoryVectorStore.from_documents(
                                                      docs(), DeterministicFakeEmbedding(size=8)), k=2, **kw),
        retrieve_lc),
    "ClusteredBM25Retriever": (
        lambda c, **kw: lc.ClusteredBM25Retriever.from_documents(
            docs(), k=3, max_tokens=40, knn_k=3, knn_threshold=0.05, **kw), retrieve_lc),
    "DenseRetriever": (
        lambda c, **kw: lc.DenseRetriever(index=DenseIndex(c.embedder()).index(units()), k=3, **kw),
        retrieve_lc),
}

PACKAGES = {"llama_index_funnel": (li, LI_CASES), "langchain_funnel": (lc, LC_CASES)}
ALL = [(pkg, name) for pkg, (_, cases) in PACKAGES.items() for name in cases]


@pytest.mark.parametrize("pkg", sorted(PACKAGES))
def test_every_public_class_has_a_case(pkg):
    module, cases = PACKAGES[pkg]
    public = {n for n in module.__all__ if inspect.isclass(getattr(module, n))}
    assert public - ABSTRACT == set(cases), "add the new class to the cases of this file"


@pytest.mark.parametrize("pkg,name", ALL, ids=[f"{p.split('_')[0]}-{n}" for p, n in ALL])
def test_a_misspelt_keyword_raises(pkg, name, request):
    module, cases = PACKAGES[pkg]
    build, _ = cases[name]
    cls = getattr(module, name)
    with pytest.raises((TypeError, ValueError)) as err:
        build(Ctx(request), tpo_k=3)
    assert "tpo_k" in str(err.value)
    assert "accepted" in str(err.value) and name in str(err.value)  # names class and fields
    if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
        assert "unexpected keyword argument" not in str(err.value)


@pytest.mark.parametrize("pkg,name", ALL, ids=[f"{p.split('_')[0]}-{n}" for p, n in ALL])
def test_pickle_and_deepcopy_before_and_after_use(pkg, name, request):
    _, cases = PACKAGES[pkg]
    build, use = cases[name]
    obj = build(Ctx(request))
    clones = [pickle.loads(pickle.dumps(obj)), copy.deepcopy(obj)]  # before first use
    expected = use(obj)
    for clone in clones:
        assert use(clone) == expected
    for clone in (pickle.loads(pickle.dumps(obj)), copy.deepcopy(obj)):  # after use
        assert use(clone) == expected
    assert use(obj) == expected


def test_compression_retriever_takes_contextual_compression_retriever_names(request):
    """LangChain's ContextualCompressionRetriever(base_retriever=..., base_compressor=...)
    arguments rerank (they used to be ignored, returning BM25 order)."""
    ce = Ctx(request).ce
    reranker = lc.CrossEncoderReranker(model=ce)
    bm25 = lc_bm25()
    retriever = lc.CompressionRetriever(base_retriever=bm25, base_compressor=reranker, k=4)
    expected = lc_ids(reranker.compress_documents(bm25.invoke(Q), Q))
    assert lc_ids(retriever.invoke(Q)) == expected
    with pytest.raises(TypeError, match=r"base_compresor.*accepted.*base_compressor"):
        lc.CompressionRetriever(base_retriever=bm25, base_compresor=reranker)


def test_factories_accept_every_documented_field_and_name_the_class():
    flt = {"topic": "lit"}
    r = lc.BM25Retriever.from_documents(docs(), k=3, filter=flt)
    assert r.filter == flt and all(d.metadata["topic"] == "lit" for d in r.invoke(Q))
    r = lc.ClusteredBM25Retriever.from_documents(docs(), k=3, filter=flt, max_tokens=40)
    assert r.filter == flt
    for call in (lambda: lc.BM25Retriever.from_documents(docs(), preprocess_func=str.split),
                 lambda: lc.BM25Retriever.from_texts(["a b"], preprocess_func=str.split)):
        with pytest.raises(TypeError, match=r"^BM25Retriever got unknown.*preprocess_func.*accepted"):
            call()
    with pytest.raises(TypeError, match=r"^BM25Retriever got unknown.*'language'.*accepted.*stemmer"):
        li_bm25(language="en")


def test_bm25_numba_engine_is_reachable_from_both_adapters():
    """``engine=`` picks BM25's scoring engine (``backend=`` is storage: memory or Milvus);
    only the setting is checked here (numba JIT-compiles for 10-13 s on first search)."""
    assert li_bm25(engine="numba").index.config["engine"] == "numba"
    assert lc_bm25(engine="numba").index.config["engine"] == "numba"
    with pytest.raises(ValueError, match="memory.*Milvus|Milvus.*memory"):
        li_bm25(backend="numba")


@pytest.mark.parametrize("query", ["", "   "])
def test_an_empty_query_keeps_top_n(query, request):
    """10 nodes in, top_n=2 must give 2 out even when nothing is scored."""
    ce = Ctx(request).ce
    many = [NodeWithScore(node=TextNode(id_=f"n{i}", text=f"text {i}"), score=1.0) for i in range(10)]
    out = li.CrossEncoderRerank(model=ce, top_n=2).postprocess_nodes(many, query_str=query)
    assert li_ids(out) == ["n0", "n1"]  # the incoming order, capped
    lc_docs = [Document(id=f"d{i}", page_content=f"text {i}") for i in range(10)]
    assert lc_ids(lc.CrossEncoderReranker(model=ce, top_n=2).compress_documents(lc_docs, query)) \
        == ["d0", "d1"]
    assert len(li.CrossEncoderRerank(model=ce).postprocess_nodes(many, query_str=query)) == 10


# -- every factory: the classmethods that build a public class, and the factory functions -------
def _tmp(c: Ctx) -> Any:
    return c.request.getfixturevalue("tmp_path")


def _li_persisted(c: Ctx, retriever: Any) -> str:
    path = str(_tmp(c) / "persisted")
    retriever.persist(path)
    return path


def _lc_saved(c: Ctx, retriever: Any) -> str:
    path = str(_tmp(c) / "saved")
    retriever.save(path)
    return path


def _li_clustered() -> Any:
    return li.ClusteredBM25Retriever.from_defaults(nodes=[n.node for n in nodes()], max_tokens=40,
                                                   knn_k=3, knn_threshold=0.05)


def _lc_clustered() -> Any:
    return lc.ClusteredBM25Retriever.from_documents(docs(), max_tokens=40, knn_k=3, knn_threshold=0.05)


NEVER_OPENED = "never-opened.db"  # a Milvus URI: the keyword check must come before any connection

#: "package:Class.factory" or "package:function" -> build(ctx, **extra)
FACTORY_CASES: dict[str, Callable[..., Any]] = {
    "llama_index_funnel:HybridRetriever.from_defaults": lambda c, **kw: li.HybridRetriever.from_defaults(
        [n.node for n in nodes()], embedder=c.embedder(), **kw),
    "llama_index_funnel:HybridRetriever.from_backend": lambda c, **kw: li.HybridRetriever.from_backend(
        NEVER_OPENED, **kw),
    "llama_index_funnel:BM25Retriever.from_defaults": lambda c, **kw: li_bm25(**kw),
    "llama_index_funnel:BM25Retriever.from_backend": lambda c, **kw: li.BM25Retriever.from_backend(
        NEVER_OPENED, **kw),
    "llama_index_funnel:BM25Retriever.from_persist_dir": lambda c, **kw: li.BM25Retriever.from_persist_dir(
        _li_persisted(c, li_bm25()), **kw),
    "llama_index_funnel:ClusteredBM25Retriever.from_defaults": lambda c, **kw: li.ClusteredBM25Retriever
    .from_defaults(nodes=[n.node for n in nodes()], max_tokens=40, **kw),
    "llama_index_funnel:ClusteredBM25Retriever.from_backend": lambda c, **kw: li.ClusteredBM25Retriever
    .from_backend(NEVER_OPENED, **kw),
    "llama_index_funnel:ClusteredBM25Retriever.from_persist_dir": lambda c, **kw: li.ClusteredBM25Retriever
    .from_persist_dir(_li_persisted(c, _li_clustered()), **kw),
    "llama_index_funnel:DenseRetriever.from_defaults": lambda c, **kw: li.DenseRetriever.from_defaults(
        [n.node for n in nodes()], embedder=c.embedder(), **kw),
    "llama_index_funnel:DenseRetriever.from_backend": lambda c, **kw: li.DenseRetriever.from_backend(
        NEVER_OPENED, **kw),
    "llama_index_funnel:as_stage": lambda c, **kw: li.funnel.as_stage(li_bm25(), **kw),
    "llama_index_funnel:as_provider": lambda c, **kw: li.llm.as_provider(MockLLM(max_tokens=3), **kw),
    "langchain_funnel:CompressionRetriever.from_stages": lambda c, **kw: lc.CompressionRetriever.from_stages(
        lc_bm25(), **kw),
    "langchain_funnel:HyDERetriever.from_llm": lambda c, **kw: lc.HyDERetriever.from_llm(
        ScriptedLLM("x"), vectorstore=InMemoryVectorStore(DeterministicFakeEmbedding(size=8)), **kw),
    "langchain_funnel:HybridRetriever.from_documents": lambda c, **kw: lc.HybridRetriever.from_documents(
        docs(), embedder=c.embedder(), **kw),
    "langchain_funnel:HybridRetriever.from_backend": lambda c, **kw: lc.HybridRetriever.from_backend(
        NEVER_OPENED, **kw),
    "langchain_funnel:FunnelRetriever.from_stages": lambda c, **kw: lc.FunnelRetriever.from_stages(
        lc_bm25(), **kw),
    "langchain_funnel:BM25Retriever.from_texts": lambda c, **kw: lc.BM25Retriever.from_texts(
        [t for _, t, _ in CORPUS], **kw),
    "langchain_funnel:BM25Retriever.from_documents": lambda c, **kw: lc_bm25(**kw),
    "langchain_funnel:BM25Retriever.from_backend": lambda c, **kw: lc.BM25Retriever.from_backend(
        NEVER_OPENED, **kw),
    "langchain_funnel:BM25Retriever.load": lambda c, **kw: lc.BM25Retriever.load(_lc_saved(c, lc_bm25()), **kw),
    "langchain_funnel:ClusteredBM25Retriever.from_texts": lambda c, **kw: lc.ClusteredBM25Retriever.from_texts(
        [t for _, t, _ in CORPUS], max_tokens=40, **kw),
    "langchain_funnel:ClusteredBM25Retriever.from_documents": lambda c, **kw: lc.ClusteredBM25Retriever
    .from_documents(docs(), max_tokens=40, **kw),
    "langchain_funnel:ClusteredBM25Retriever.from_backend": lambda c, **kw: lc.ClusteredBM25Retriever
    .from_backend(NEVER_OPENED, **kw),
    "langchain_funnel:ClusteredBM25Retriever.load": lambda c, **kw: lc.ClusteredBM25Retriever.load(
        _lc_saved(c, _lc_clustered()), **kw),
    "langchain_funnel:DenseRetriever.from_documents": lambda c, **kw: lc.DenseRetriever.from_documents(
        docs(), embedder=c.embedder(), **kw),
    "langchain_funnel:DenseRetriever.from_backend": lambda c, **kw: lc.DenseRetriever.from_backend(
        NEVER_OPENED, **kw),
    "langchain_funnel:LCTransformerStage": lambda c, **kw: lc.funnel.LCTransformerStage(
        lc.LaterChunkingTransformer(words=4), **kw),
    "langchain_funnel:MilvusTranslator": lambda c, **kw: lc.milvus.MilvusTranslator(**kw),
    "langchain_funnel:hyde_query": lambda c, **kw: lc.hyde_query(FakeListLLM(responses=["x"]), **kw),
    "langchain_funnel:query_classifier_branch": lambda c, **kw: lc.query_classifier_branch(
        c.classifier(), lc_bm25(), lc_bm25(), **kw),
    "langchain_funnel:rerank_chain": lambda c, **kw: lc.rerank_chain(lc_bm25(), **kw),
    "langchain_funnel:as_stage": lambda c, **kw: lc.funnel.as_stage(lc_bm25(), **kw),
    "langchain_funnel:as_provider": lambda c, **kw: lc.llm.as_provider(FakeListLLM(responses=["x"]), **kw),
}
#: Public functions that convert or translate data rather than build a configured object.
NOT_FACTORIES = {
    "llama_index_funnel": {"nodes_to_units", "units_to_nodes", "nodes_from", "units_of",
                           "is_empty_metadata_filters", "to_predicate", "to_core_filter",
                           "to_milvus_filter", "is_milvus",
                           "with_shells", "restore_nodes", "search_filter"},
    "langchain_funnel": {"documents_to_units", "units_to_documents", "units_from_documents",
                         "message_text", "to_core_filter", "to_milvus_filter", "push_down",
                         "search_filter"},
}
#: Built by the package, not by its users (an instrumentation event carrying a trace).
NOT_BUILT_BY_USERS = {"llama_index_funnel:FunnelTraceEvent"}


def _public_factories(pkg: str) -> set[str]:
    """Every public class outside the top-level ``__all__`` (those have cases above), every
    from_* / load classmethod of a public class, every public function: from the ``__all__`` of
    the package and of its submodules."""
    import importlib
    import pkgutil

    top = importlib.import_module(pkg)
    modules = [top] + [importlib.import_module(f"{pkg}.{m.name}") for m in pkgutil.iter_modules(top.__path__)
                       if not m.name.startswith("_")]
    out: set[str] = set()
    for m in modules:
        for n in getattr(m, "__all__", []):
            obj = getattr(m, n)
            if (getattr(obj, "__module__", "") or "").split(".")[0] != pkg:
                continue
            if inspect.isclass(obj):
                if n not in top.__all__:
                    out.add(f"{pkg}:{n}")
                for klass in obj.__mro__:
                    if (klass.__module__ or "").split(".")[0] == pkg:
                        out |= {f"{pkg}:{n}.{a}" for a, v in vars(klass).items()
                                if isinstance(v, classmethod) and (a.startswith("from_") or a == "load")}
            elif inspect.isfunction(obj) and n not in NOT_FACTORIES[pkg]:
                out.add(f"{pkg}:{n}")
    return out - NOT_BUILT_BY_USERS


@pytest.mark.parametrize("pkg", sorted(PACKAGES))
def test_every_public_factory_has_a_case(pkg):
    assert _public_factories(pkg) == {k for k in FACTORY_CASES if k.startswith(pkg + ":")}, \
        "add the new factory to FACTORY_CASES (or a converter to NOT_FACTORIES)"


@pytest.mark.parametrize("name", sorted(FACTORY_CASES))
def test_a_misspelt_keyword_to_a_factory_names_the_accepted_ones(name, request):
    """A misspelt keyword to any constructor or factory raises a TypeError that names it and the
    accepted keywords (Python's bare 'unexpected keyword argument' names neither the fix nor, for
    a keyword forwarded to an inner class, the function the user called), before any Milvus
    connection is tried."""
    with pytest.raises(TypeError) as err:
        FACTORY_CASES[name](Ctx(request), tpo_k=3)
    msg = str(err.value)
    assert "tpo_k" in msg and "accepted" in msg and "unexpected keyword argument" not in msg, msg
    assert not (_tmp(Ctx(request)).parent / NEVER_OPENED).exists() and not __import__("os").path.exists(NEVER_OPENED)
