"""Document links steer FunnelRAG's clustering only under our own key (``funnel_links``) or an
explicit argument: a user's ``links`` metadata (web loaders write URLs there) changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.documents import Document

from funnel_core import Unit
from funnel_core.evaluation.datasets import load_squad
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
from funnel_core.funnelrag.clustering import LINKS_KEY, build_clusters, link_adjacency
from langchain_funnel.retrievers import ClusteredBM25Retriever

SQUAD = Path(__file__).resolve().parents[3] / "shared" / "data" / "squad" / "squad-v1.1-dev-a.json"


@pytest.fixture(scope="module")
def paragraphs():
    if not SQUAD.exists():
        pytest.skip(f"SQuAD dev file not found at {SQUAD}")
    arts = load_squad(SQUAD)[:3]
    return [(f"{a.title}/{i}", p) for a in arts for i, p in enumerate(a.paragraphs)]


def _units(paragraphs, extra=lambda i: {}):
    return [Unit(id=pid, text=t, metadata={"source": "squad", **extra(i)}, level="document")
            for i, (pid, t) in enumerate(paragraphs)]


def _url(i):
    return {"links": [f"https://example.org/page/{i}", f"https://example.org/page/{i + 1}"]}


def test_a_user_links_key_changes_no_cluster(paragraphs):
    plain = ClusteredBM25Index(max_tokens=600).index(_units(paragraphs))
    linked = ClusteredBM25Index(max_tokens=600).index(_units(paragraphs, _url))
    members = [c.metadata["members"] for c in plain.clusters]
    assert [c.metadata["members"] for c in linked.clusters] == members
    assert len(members) < len(paragraphs) / 2  # BM25 kNN clustering did merge documents
    # build_clusters' "auto" reads the same
    got, _ = build_clusters(_units(paragraphs, _url), max_tokens=600)
    assert [c.metadata["members"] for c in got] == members


def test_the_langchain_retriever_ignores_a_user_links_key(paragraphs):
    docs = [Document(id=pid, page_content=t, metadata={"source": "squad", **_url(i)})
            for i, (pid, t) in enumerate(paragraphs)]
    retriever = ClusteredBM25Retriever.from_documents(docs, k=10, k_clusters=3, max_tokens=600)
    got = retriever.invoke("What did the Broncos win?")
    assert len(got) == 10
    assert all(d.metadata["links"][0].startswith("https://") for d in got)  # kept as it was


def test_links_under_our_key_or_a_named_key_steer_the_clusters():
    units = [Unit(id="a", text="alpha words", metadata={LINKS_KEY: ["b"]}),
             Unit(id="b", text="beta words", metadata={}),
             Unit(id="c", text="gamma words", metadata={LINKS_KEY: []})]
    assert LINKS_KEY == "funnel_links"
    clusters, _ = build_clusters(units, max_tokens=100)  # "auto" sees our key
    assert sorted(c.metadata["members"] for c in clusters) == [["a", "b"], ["c"]]
    index = ClusteredBM25Index(max_tokens=100).index(units)
    assert sorted(c.metadata["members"] for c in index.clusters) == [["a", "b"], ["c"]]
    # a user's own key, named explicitly, through a precomputed graph
    user = [Unit(id=u.id, text=u.text, metadata={"links": u.metadata.get(LINKS_KEY, [])}) for u in units]
    adj = link_adjacency(user, key="links")
    index = ClusteredBM25Index(max_tokens=100).index(user, adjacency=adj)
    assert sorted(c.metadata["members"] for c in index.clusters) == [["a", "b"], ["c"]]
