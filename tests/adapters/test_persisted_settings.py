"""Persisting a retriever keeps its settings (top-k, cluster count, caps,
filters), in both frameworks; explicit arguments at load time win."""

from __future__ import annotations

import pytest
from langchain_core.documents import Document
from llama_index.core.vector_stores.types import MetadataFilter, MetadataFilters

from langchain_funnel import BM25Retriever as LCBM25
from langchain_funnel import ClusteredBM25Retriever as LCClustered
from llama_index_funnel import BM25Retriever, ClusteredBM25Retriever
from tests.conftest import CORPUS

Q = "Paris capital Shakespeare BM25 ranking"


def test_llamaindex_persist_keeps_settings(tmp_path, source_linked_nodes):
    geo = MetadataFilters(filters=[MetadataFilter(key="topic", value="geo")])
    flat = BM25Retriever.from_defaults(nodes=source_linked_nodes, similarity_top_k=2, filters=geo)
    flat.persist(str(tmp_path / "flat"))
    back = BM25Retriever.from_persist_dir(str(tmp_path / "flat"))
    assert back.similarity_top_k == 2 and isinstance(back.filters, MetadataFilters)
    assert [n.node.node_id for n in back.retrieve(Q)] == [n.node.node_id for n in flat.retrieve(Q)]
    assert all(n.node.metadata["topic"] == "geo" for n in back.retrieve(Q))
    assert BM25Retriever.from_persist_dir(str(tmp_path / "flat"), similarity_top_k=1).similarity_top_k == 1

    cl = ClusteredBM25Retriever.from_defaults(nodes=source_linked_nodes, similarity_top_k=3,
                                              k_clusters=2,
                                              filters={"topic": "lit"}, max_tokens=40, knn_k=3,
                                              knn_threshold=0.05)
    cl.persist(str(tmp_path / "cl"))
    again = ClusteredBM25Retriever.from_persist_dir(str(tmp_path / "cl"))
    assert (again.similarity_top_k, again.k_clusters, again.filters) == (3, 2, {"topic": "lit"})
    assert [n.node.node_id for n in again.retrieve(Q)] == [n.node.node_id for n in cl.retrieve(Q)]

    # a predicate cannot be persisted: refused (naming the fix), the folder keeps the last persist
    again.filters = lambda m: m["topic"] == "lit"
    with pytest.raises(ValueError, match=r"ClusteredBM25Retriever.persist: a predicate filter.*per call"):
        again.persist(str(tmp_path / "cl"))
    assert ClusteredBM25Retriever.from_persist_dir(str(tmp_path / "cl")).filters == {"topic": "lit"}


def test_llamaindex_snapshot_with_the_removed_max_documents_still_loads(tmp_path, source_linked_nodes,
                                                                        monkeypatch):
    """A clustered retriever persisted while ``max_documents`` existed (it capped the nodes
    returned) loads, the cap folded into ``similarity_top_k``."""
    cl = ClusteredBM25Retriever.from_defaults(nodes=source_linked_nodes, similarity_top_k=3,
                                              max_tokens=40, knn_k=3, knn_threshold=0.05)
    monkeypatch.setattr(ClusteredBM25Retriever, "_settings",
                        (*ClusteredBM25Retriever._settings, "max_documents"))
    object.__setattr__(cl, "max_documents", 2)  # what the old version wrote
    cl.persist(str(tmp_path / "old"))
    monkeypatch.undo()
    again = ClusteredBM25Retriever.from_persist_dir(str(tmp_path / "old"))
    assert again.similarity_top_k == 2 and len(again.retrieve(Q)) <= 2


def test_langchain_save_keeps_settings(tmp_path):
    docs = [Document(id=i, page_content=t, metadata=m) for i, t, m in CORPUS]
    flat = LCBM25.from_documents(docs, k=2)
    flat.filter = {"topic": "geo"}
    flat.save(tmp_path / "flat")
    back = LCBM25.load(tmp_path / "flat")
    assert back.k == 2 and back.filter == {"topic": "geo"}
    assert [d.id for d in back.invoke(Q)] == [d.id for d in flat.invoke(Q)]
    assert LCBM25.load(tmp_path / "flat", k=1).k == 1
    with pytest.raises(TypeError, match="accepted"):
        LCBM25.load(tmp_path / "flat", kk=1)

    cl = LCClustered.from_documents(docs, k=3, k_clusters=2, max_tokens=40, knn_k=3,
                                    knn_threshold=0.05)
    cl.return_clusters = True
    cl.filter = {"topic": "lit"}
    cl.save(tmp_path / "cl")
    again = LCClustered.load(tmp_path / "cl")
    assert (again.k, again.k_clusters, again.return_clusters, again.filter) == \
        (3, 2, True, {"topic": "lit"})
    # a predicate cannot be saved: the save refuses (naming the fix) and writes nothing, never a
    # warning and a loaded retriever without the filter
    with pytest.raises(ValueError, match=r"predicate filter \(<lambda>\).*dict filter.*per call"):
        LCBM25(index=flat.index, filter=lambda m: True).save(tmp_path / "pred")
    assert not (tmp_path / "pred").exists()
