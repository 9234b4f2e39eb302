"""LangChain side: our objects inside the
framework's own compositions and with its conventions."""

from __future__ import annotations

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.vectorstores import InMemoryVectorStore

from langchain_funnel import (
    BM25Retriever,
    ClusteredBM25Retriever,
    CompressionRetriever,
    CrossEncoderReranker,
    FunnelRetriever,
    LaterChunkingTransformer,
    MixOfGranularityRetriever,
    MultiGranularityTextSplitter,
    rerank_chain,
)
from tests.conftest import CORPUS

Q = "Paris capital of France Eiffel Tower"


def _docs(**extra):
    return [Document(id=i, page_content=t, metadata={**m, **extra}) for i, t, m in CORPUS]


def test_ensemble_retriever_fuses_ours_with_the_frameworks():
    from langchain_classic.retrievers import EnsembleRetriever

    bm25 = BM25Retriever.from_documents(_docs(), k=4)
    store = InMemoryVectorStore(DeterministicFakeEmbedding(size=16))
    store.add_documents(_docs())
    vector = store.as_retriever(search_kwargs={"k": 8})
    ens = EnsembleRetriever(retrievers=[bm25, vector], weights=[0.5, 0.5])
    out = ens.invoke(Q)
    texts = [d.page_content for d in out]
    assert len(texts) == len(set(texts)) == 8  # one entry per document
    # weighted RRF (the EnsembleRetriever's formula, c=60) computed by hand, by text
    lists = [bm25.invoke(Q), vector.invoke(Q)]
    want: dict[str, float] = {}
    for docs in lists:
        for rank, d in enumerate(docs, start=1):
            want[d.page_content] = want.get(d.page_content, 0.0) + 0.5 / (rank + 60)
    assert texts == sorted(want, key=lambda t: -want[t])
    ours = next(d for d in out if d.page_content == lists[0][0].page_content)
    assert ours.metadata["title"] and "funnel_score_bm25" in ours.metadata


def test_user_metadata_is_never_overwritten_or_read_as_ours(tiny_cross_encoder_path):
    plain = _docs()
    clash = _docs(score=1000.0, level="user-level", position="user-position")
    for d, p in zip(clash, plain):  # a prior score the cross-encoder may fuse (LangChain's key)
        d.metadata["relevance_score"] = 1.0
        p.metadata["relevance_score"] = 1.0
    rr = CrossEncoderReranker(model=tiny_cross_encoder_path, top_n=4, fuse_weight=0.5)
    a, b = rr.compress_documents(plain, Q), rr.compress_documents(clash, Q)
    assert [d.id for d in a] == [d.id for d in b]
    assert [d.metadata["relevance_score"] for d in a] == [d.metadata["relevance_score"] for d in b]
    for d in b:
        assert (d.metadata["score"], d.metadata["level"], d.metadata["position"]) == \
            (1000.0, "user-level", "user-position")
    chunks = LaterChunkingTransformer(words=4).transform_documents(clash[:1])
    assert all(c.metadata["position"] == "user-position" for c in chunks)
    assert [c.metadata["funnel_position"] for c in chunks] == list(range(len(chunks)))


def test_splitter_ids_unique_across_calls_and_empty_input():
    splitter = MultiGranularityTextSplitter(chunk_size=5, n_gra=2)
    texts = ["Paris is the capital of France. The Eiffel Tower stands there, tall and old."]
    first = splitter.create_documents(texts)
    second = splitter.create_documents(texts)
    assert not {d.id for d in first} & {d.id for d in second}
    store = InMemoryVectorStore(DeterministicFakeEmbedding(size=8))
    store.add_documents(first)
    store.add_documents(second)
    assert len(store.store) == len(first) + len(second)
    assert splitter.split_documents([]) == [] and splitter.create_documents([""]) == []
    assert splitter.split_text("") == []
    # a document with its own id keeps stable chunk ids (re-adding it updates, not duplicates)
    doc = Document(id="mine", page_content=texts[0])
    assert [d.id for d in splitter.split_documents([doc])] == [d.id for d in splitter.split_documents([doc])]
    # split_text and split_documents agree
    assert splitter.split_text(texts[0]) == [d.page_content for d in splitter.split_documents(
        [Document(page_content=texts[0])])]


def test_runs_are_visible_in_astream_events_and_run_name(tiny_cross_encoder_path):
    import asyncio

    bm25 = BM25Retriever.from_documents(_docs(), k=5)
    rr = CrossEncoderReranker(model=tiny_cross_encoder_path, top_n=2)
    funnel = FunnelRetriever.from_stages(bm25, LaterChunkingTransformer(words=6), rr, k=2)

    async def names(runnable, inp):
        return [(e["event"], e["name"]) async for e in runnable.astream_events(inp, version="v2")]

    events = asyncio.run(names(funnel, Q))
    started = [n for ev, n in events if ev.endswith("_start")]
    assert "FunnelRetriever" in started and "BM25Retriever" in started
    assert "CrossEncoderReranker" in started and "LaterChunkingTransformer" in started
    events = asyncio.run(names(rr.with_config(run_name="my-rerank"),
                               {"query": Q, "documents": _docs()}))
    assert ("on_chain_start", "my-rerank") in events and ("on_chain_end", "my-rerank") in events


def test_one_way_to_chain():
    bm25 = BM25Retriever.from_documents(_docs(), k=5)
    chunker = LaterChunkingTransformer(words=6)
    comp = CompressionRetriever(base_retriever=bm25, compressors=[chunker], k=3)
    chain = rerank_chain(bm25, chunker)
    funnel = FunnelRetriever.from_stages(bm25, chunker, k=None)
    assert isinstance(comp, FunnelRetriever) and isinstance(chain, FunnelRetriever)
    ids = [d.id for d in funnel.invoke(Q)]
    assert [d.id for d in chain.invoke(Q)] == ids and [d.id for d in comp.invoke(Q)] == ids[:3]


def test_unknown_keyword_arguments_and_k_zero_are_errors():
    bm25 = BM25Retriever.from_documents(_docs(), k=3)
    clustered = ClusteredBM25Retriever.from_documents(_docs(), k=3, max_tokens=40, knn_k=3,
                                                      knn_threshold=0.05)
    assert len(bm25.invoke(Q, filter={"topic": "geo"})) >= 1
    with pytest.raises(TypeError, match=r"\['filters'\].*accepted: \['k', 'filter'\]"):
        bm25.invoke(Q, filters={"topic": "geo"})
    with pytest.raises(TypeError, match="filters"):
        clustered.invoke(Q, filters={"topic": "geo"})
    with pytest.raises(TypeError, match="accepted"):
        FunnelRetriever.from_stages(bm25, k=2).invoke(Q, filter={"topic": "geo"})
    for r in (bm25, clustered):
        with pytest.raises(ValueError, match="k must be >= 1"):
            r.invoke(Q, k=0)
    with pytest.raises(ValueError, match="k must be >= 1"):
        BM25Retriever.from_documents(_docs(), k=0)
    with pytest.raises(ValueError, match="k_clusters"):
        clustered.invoke(Q, k_clusters=0)
    mog_docs = MultiGranularityTextSplitter(chunk_size=5, n_gra=2).split_documents(_docs())
    with pytest.raises(TypeError, match="accepted"):
        MixOfGranularityRetriever(documents=mog_docs).invoke(Q, filter={})
    from langchain_funnel import HybridRetriever

    with pytest.raises(TypeError, match=r"\['filters'\].*accepted: \['dense_query', 'k'\]"):
        HybridRetriever(sparse=bm25, dense=clustered, k=2).invoke(Q, filters={})


def test_from_documents_duplicate_id_raises_like_from_texts():
    docs = _docs()
    docs[1].id = docs[0].id
    with pytest.raises(ValueError, match="duplicate unit id 'd0'"):
        BM25Retriever.from_texts(["a b", "c d"], ids=["d0", "d0"])
    with pytest.raises(ValueError, match="duplicate unit id 'd0'"):
        BM25Retriever.from_documents(docs)
    with pytest.raises(ValueError, match="duplicate unit id 'd0'"):
        ClusteredBM25Retriever.from_documents(docs)
    # documents without ids get positional ids, as from_texts does
    out = BM25Retriever.from_documents([Document(page_content="same text"),
                                        Document(page_content="same text")], k=2).invoke("text")
    assert sorted(d.id for d in out) == ["0", "1"]
