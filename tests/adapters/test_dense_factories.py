"""Both frameworks' ``DenseRetriever`` factories honour every in-memory index setting.

Reference: :class:`funnel_core.embeddings.DenseIndex`'s documented keywords (``index``,
``ef_search``, ``hnsw_m``, ...). Wrong implementation caught: a factory that builds
``DenseIndex(embedder)`` and drops ``index="hnsw"``/``ef_search`` when no Milvus backend is
given, and one that swallows a misspelt keyword.
"""

from __future__ import annotations

import pytest

pytest.importorskip("faiss", reason="faiss-cpu is not installed")

TEXTS = ["Paris is the capital of France.", "Berlin is the capital of Germany.",
         "Hamlet is a tragedy by Shakespeare.", "BM25 ranks documents."]


@pytest.fixture(scope="module")
def embedder(minilm_path):
    from funnel_core.embeddings import SentenceEmbedder

    return SentenceEmbedder(minilm_path)


def test_llamaindex_from_defaults_keeps_index_settings(embedder):
    from llama_index.core.schema import TextNode

    from llama_index_funnel import DenseRetriever

    nodes = [TextNode(id_=f"n{i}", text=t) for i, t in enumerate(TEXTS)]
    r = DenseRetriever.from_defaults(nodes, embedder, index="hnsw", ef_search=7, hnsw_m=8)
    assert (r.index.kind, r.index.backend, r.index.ef_search, r.index.hnsw_m) == ("hnsw", "hnsw", 7, 8)
    assert r.retrieve("capital of France")[0].node.node_id == "n0"
    with pytest.raises(TypeError, match="ef_serach"):
        DenseRetriever.from_defaults(nodes, embedder, ef_serach=7)


def test_langchain_from_documents_keeps_index_settings(embedder):
    from langchain_core.documents import Document

    from langchain_funnel import DenseRetriever

    docs = [Document(id=f"d{i}", page_content=t) for i, t in enumerate(TEXTS)]
    r = DenseRetriever.from_documents(docs, embedder, index="hnsw", ef_search=9)
    assert (r.index.kind, r.index.backend, r.index.ef_search) == ("hnsw", "hnsw", 9)
    assert r.invoke("capital of France")[0].id == "d0"
    with pytest.raises(TypeError, match="ef_serach"):
        DenseRetriever.from_documents(docs, embedder, ef_serach=9)
