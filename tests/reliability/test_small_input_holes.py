"""Small input holes: ids that cannot be ``None``, bytes queries, and cluster ids
that do not move when unrelated documents are added or deleted.

Wrong implementations caught: ``Unit(id=None)`` silently becoming ``"None"`` (and
``delete([None])`` then deleting it); LlamaIndex's ``retrieve(b"...")`` failing with
``AttributeError: query_str``; an add/delete that re-clusters and renumbers every cluster.
"""

from __future__ import annotations

import asyncio

import pytest

from funnel_core.bm25 import BM25Index
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
from funnel_core.units import Unit


def test_unit_id_none_is_refused_and_delete_none_too():
    with pytest.raises(TypeError, match="Unit.id is None"):
        Unit(id=None, text="x")  # type: ignore[arg-type]
    assert Unit(id=7, text="x").id == "7"  # ints are still accepted
    ix = BM25Index().index([Unit(id="None", text="alpha"), Unit(id="b", text="beta")])
    with pytest.raises(TypeError, match="None among the ids"):
        ix.delete([None])  # type: ignore[list-item]
    assert len(ix) == 2


def test_llamaindex_retrieve_bytes_is_a_clear_type_error():
    from llama_index.core.schema import TextNode

    from llama_index_funnel.retrievers import BM25Retriever

    r = BM25Retriever.from_defaults(nodes=[TextNode(id_="a", text="alpha beta")])
    with pytest.raises(TypeError, match=r"str or a QueryBundle, got bytes.*decode"):
        r.retrieve(b"alpha")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got bytes"):
        asyncio.run(r.aretrieve(b"alpha"))  # type: ignore[arg-type]
    assert [n.node.node_id for n in r.retrieve("alpha")] == ["a"]


def _cluster_of(ix):
    return {d: c.id for c in ix.clusters for d in c.metadata["members"]}


def test_cluster_ids_stay_when_unrelated_documents_come_and_go():
    topics = ["paris capital france", "hamlet tragedy shakespeare", "bm25 ranking search",
              "dense vectors neural"]
    docs = [Unit(id=f"d{i}", text=f"{topics[i % 4]} note {i}") for i in range(16)]
    ix = ClusteredBM25Index(max_tokens=20, knn_k=3, knn_threshold=0.05).index(docs)
    before = _cluster_of(ix)
    ix.add([Unit(id="new", text="quantum chromodynamics gluon lattice")])
    after_add = _cluster_of(ix)
    assert {d: after_add[d] for d in before} == before
    ix.delete(["d5"])
    after_delete = _cluster_of(ix)
    assert {d: after_delete[d] for d in before if d != "d5"} == {d: c for d, c in before.items() if d != "d5"}
