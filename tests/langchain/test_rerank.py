"""LangChain: CrossEncoderReranker, MonoT5Reranker, LaterChunkingTransformer and the
CompressionRetriever, in LCEL chains and the standard retriever test suite."""

import asyncio

import pytest
from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda
from langchain_tests.integration_tests import RetrieversIntegrationTests

from funnel_core.bm25 import BM25Index
from funnel_core.errors import ModelLoadError
from funnel_core.rerank.cross_encoder import CrossEncoderScorer
from funnel_core.scoring import sigmoid
from funnel_core.testing import tiny_cross_encoder
from langchain_funnel._base import UnitRetriever
from langchain_funnel.compression import CompressionRetriever
from langchain_funnel.funnel import rerank_chain
from langchain_funnel.rerank import CrossEncoderReranker, LaterChunkingTransformer, MonoT5Reranker
from tests.conftest import CORPUS

QUERY = "Paris capital of France city"


class BM25Docs(UnitRetriever):
    """A BM25 retriever over the test corpus (only to feed the compressors)."""

    def _search(self, query, k):
        if not hasattr(self, "_index_cache"):
            from funnel_core.units import Unit

            object.__setattr__(self, "_index_cache", BM25Index().index(
                [Unit(id=i, text=t, metadata=dict(m)) for i, t, m in CORPUS]))
        return self._index_cache.search(query, k=k)


def _docs():
    return [Document(id=i, page_content=t, metadata={**m, "score": float(10 - n)})
            for n, (i, t, m) in enumerate(CORPUS)]


def test_reranker_orders_by_model_and_keeps_metadata(tiny_cross_encoder_path):
    # fp32: this tiny random model's scores differ by ~1e-5, below bf16's resolution, and
    # dtype="auto" (or runtime="auto") runs bf16 on a CPU with native bf16
    rr = CrossEncoderReranker(model=tiny_cross_encoder_path, dtype="float32", library="transformers", top_n=3,
                              max_length=64)
    docs = _docs()
    out = rr.compress_documents(docs, QUERY)
    raw = [sigmoid(s) for s in  # the adapter's default scale: sigmoid probabilities
           CrossEncoderScorer(tiny_cross_encoder_path, dtype="float32", library="transformers",
                              max_length=64).score(QUERY, [d.page_content for d in docs])]
    best = sorted(zip(raw, [d.id for d in docs]), reverse=True)[:3]
    assert [d.id for d in out] == [i for _, i in best]
    assert [d.metadata["relevance_score"] for d in out] == pytest.approx([s for s, _ in best], abs=1e-5)
    for d in out:
        assert "topic" in d.metadata and type(d.metadata["relevance_score"]) is float
        assert d.metadata["funnel_score_cross_encoder"] == d.metadata["relevance_score"]
    assert docs[0].metadata["score"] == 10.0 and "funnel" not in docs[0].metadata  # inputs untouched
    a = asyncio.run(rr.acompress_documents(docs, QUERY))
    assert [d.id for d in a] == [d.id for d in out]


def test_lcel_chain_retriever_chunking_reranker_prompt(tiny_cross_encoder_path):
    retriever = BM25Docs(k=3)
    rr = CrossEncoderReranker(model=tiny_cross_encoder_path, library="transformers", top_n=2,
                              normalize=True)
    chain = rerank_chain(retriever, rr)
    docs = chain.invoke(QUERY)
    assert len(docs) == 2 and all(0 < d.metadata["relevance_score"] < 1 for d in docs)
    # retriever | later chunking, then rerank the passages, then format a prompt
    chunked = (retriever | LaterChunkingTransformer(words=5)).invoke(QUERY)
    assert all(d.metadata["funnel_level"] == "passage" and "funnel_parent_id" in d.metadata for d in chunked)
    prompt = ChatPromptTemplate.from_template("Context:\n{context}\n\nQ: {question}")
    full = (rerank_chain(retriever | LaterChunkingTransformer(words=5), rr)
            | RunnableLambda(lambda ds: {"context": "\n".join(d.page_content for d in ds),
                                         "question": QUERY})
            | prompt)
    msg = full.invoke(QUERY).to_messages()[0].content
    assert msg.startswith("Context:") and QUERY in msg
    assert asyncio.run(chain.ainvoke(QUERY))[0].id == docs[0].id


def test_later_chunking_transformer_metadata():
    doc = Document(id="doc", page_content=" ".join(f"w{i}" for i in range(23)),
                   metadata={"title": "T", "score": "user", "relevance_score": 2.5})
    out = LaterChunkingTransformer(words=10).transform_documents([doc])
    assert [d.id for d in out] == ["doc#0", "doc#1", "doc#2"]
    assert [d.metadata["funnel_position"] for d in out] == [0, 1, 2]
    assert all(d.metadata["funnel_parent_id"] == "doc" and d.metadata["funnel_parent_score"] == 2.5 for d in out)
    assert all(d.metadata["title"] == "T" and d.metadata["score"] == "user" for d in out)
    assert " ".join(d.page_content for d in out).split() == doc.page_content.split()
    assert asyncio.run(LaterChunkingTransformer(words=10).atransform_documents([doc]))[2].id == "doc#2"
    with pytest.raises(ValueError, match="words must be >= 1"):
        LaterChunkingTransformer(words=0)


def test_monot5_reranker(tiny_t5_path):
    rr = MonoT5Reranker(model=tiny_t5_path, top_n=2, max_length=64, device="cpu")
    out = rr.compress_documents(_docs(), QUERY)
    assert len(out) == 2 and out[0].metadata["relevance_score"] >= out[1].metadata["relevance_score"]
    assert "funnel_score_monot5" in out[0].metadata


def test_compression_retriever_pipeline(tiny_cross_encoder_path):
    rr = CrossEncoderReranker(model=tiny_cross_encoder_path, library="transformers", top_n=4)
    ret = CompressionRetriever(base_retriever=BM25Docs(k=3),
                               compressors=[LaterChunkingTransformer(words=5), rr], k=3)
    docs = ret.invoke(QUERY)
    assert len(docs) == 3 and all("#" in d.id for d in docs)
    assert len(ret.invoke(QUERY, k=1)) == 1
    assert [d.metadata["relevance_score"] for d in docs] == sorted((d.metadata["relevance_score"] for d in docs),
                                                         reverse=True)
    assert ret.invoke("   ") == []
    with pytest.raises(ValueError, match="k must be >= 1"):
        CompressionRetriever(base_retriever=BM25Docs(k=3), compressors=[], k=0)
    with pytest.raises(TypeError, match="compressors must be"):
        CompressionRetriever(base_retriever=BM25Docs(k=3), compressors=["nope"])


def test_bad_input(tiny_cross_encoder_path):
    rr = CrossEncoderReranker(model=tiny_cross_encoder_path, library="transformers")
    assert rr.compress_documents([], QUERY) == []
    with pytest.raises(ValueError, match="top_n must be >= 1"):
        CrossEncoderReranker(model=tiny_cross_encoder_path, top_n=-1)
    with pytest.raises(ModelLoadError, match="no-such-org/reranker"):
        CrossEncoderReranker(model="no-such-org/reranker", library="transformers"
                             ).compress_documents(_docs(), QUERY)
    long = [Document(page_content="word " * 5000)] + _docs()[:1]
    assert len(rr.compress_documents(long, QUERY)) == 2
    with pytest.raises(TypeError, match="expected a langchain Document"):
        rr.compress_documents(["plain string"], QUERY)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="Runnable"):
        rr.invoke("not a dict")  # type: ignore[arg-type]


class TestCompressionRetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self):
        return CompressionRetriever

    @property
    def retriever_constructor_params(self):
        import tempfile

        path = tiny_cross_encoder(tempfile.gettempdir() + "/funnel-tiny-ce-lc")
        return {"base_retriever": BM25Docs(k=8),
                "compressors": [CrossEncoderReranker(model=path, library="transformers")]}

    @property
    def retriever_query_example(self):
        return "capital city of France or Germany"


def test_reranker_maxp_windows_in_a_chain(tiny_cross_encoder_path):
    long_text = " ".join(f"Sentence {i} is about Paris and topic {i}." for i in range(30))
    docs = _docs() + [Document(page_content=long_text, id="long", metadata={"topic": "long"})]
    rr = CrossEncoderReranker(model=tiny_cross_encoder_path, library="transformers", max_length=64,
                              window_words=20, window_overlap=5)
    assert rr.stage.window_words == 20 and rr.stage.window_overlap == 5
    out = (RunnableLambda(lambda q: {"query": q, "documents": docs}) | rr).invoke(QUERY)
    want = sigmoid(CrossEncoderScorer(tiny_cross_encoder_path, library="transformers", max_length=64,
                                      window_words=20, window_overlap=5).score(QUERY, [long_text])[0])
    got = {d.id: d.metadata["relevance_score"] for d in out}
    assert got["long"] == pytest.approx(want, abs=1e-5)
