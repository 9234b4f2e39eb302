"""``CompressionRetriever``'s fields read what it runs, and an edit of one is what the next query
runs (``ContextualCompressionRetriever``'s ``base_compressor`` is folded into ``compressors``)."""

from __future__ import annotations

import pytest
from langchain_core.documents import Document

from langchain_funnel import CompressionRetriever, LaterChunkingTransformer, RepackTransformer
from langchain_funnel.retrievers import BM25Retriever
from tests.conftest import CORPUS

Q = "Paris capital city tower France"


def _bm25(k=4):
    return BM25Retriever.from_documents(
        [Document(id=i, page_content=t, metadata=dict(m)) for i, t, m in CORPUS], k=k)


def test_base_compressor_is_read_back_among_the_compressors():
    chunker = LaterChunkingTransformer(words=3, sentence_aware=False)
    repack = RepackTransformer(order="reverse")
    r = CompressionRetriever(base_retriever=_bm25(), base_compressor=chunker, k=20)
    assert r.compressors == [chunker] and r.base_compressor is chunker
    both = CompressionRetriever(base_retriever=_bm25(), base_compressor=chunker,
                                compressors=[repack], k=20)
    assert both.compressors == [chunker, repack] and both.base_compressor is chunker
    assert [s.name for s in both.funnel.stages][1:] == ["LaterChunkingTransformer", "RepackTransformer"]


def test_an_edit_of_the_compressors_is_what_the_next_query_runs():
    r = CompressionRetriever(base_retriever=_bm25(), k=20)
    whole = r.invoke(Q)
    r.compressors = [LaterChunkingTransformer(words=3, sentence_aware=False)]
    assert len(r.invoke(Q)) > len(whole)  # documents cut into 3-word passages
    assert r.base_compressor is r.compressors[0]
    r.base_compressor = RepackTransformer(order="reverse")
    assert [d.id for d in r.invoke(Q)] == [d.id for d in whole][::-1]
    assert r.compressors == [r.base_compressor]
    r.base_retriever = _bm25(k=2)
    assert len(r.invoke(Q)) == 2
    with pytest.raises(TypeError, match="BaseDocumentCompressor"):
        r.compressors = ["not a compressor"]
    assert len(r.invoke(Q)) == 2  # a refused edit changes nothing
