"""A Milvus-backed retriever pickles and deep-copies as the in-memory ones do (the copy
connects again and answers the same), and misused factory arguments name the method the user
called.

Reference: the original retriever's answers. Wrong implementations caught: an index that keeps
its ``threading.Lock`` in the pickled state (a bare ``TypeError: cannot pickle
'_thread.lock' object``); a copy pinned to the opened state of the original; a factory that
hands unknown keywords to ``MilvusDenseIndex.__init__`` / ``DenseIndex.__init__``, whose error
names a class the user never called.
"""

from __future__ import annotations

import copy
import pickle

import pytest

pytest.importorskip("pymilvus", reason="pymilvus is not installed (pip install 'funnel-rag[milvus]')")
pytest.importorskip("milvus_lite", reason="milvus-lite is not installed (pip install 'funnel-rag[milvus]')")

from funnel_core.backends.milvus import MilvusBackend, MilvusBM25Index, MilvusClusteredBM25Index  # noqa: E402
from funnel_core.units import Unit  # noqa: E402
from tests.conftest import CORPUS  # noqa: E402

QUERIES = ["capital of France", "Shakespeare tragedy", "ranking documents"]


@pytest.fixture(scope="module")
def backend(tmp_path_factory) -> MilvusBackend:
    return MilvusBackend(str(tmp_path_factory.mktemp("milvus_copies") / "c.db"))


def _clones(obj):
    return [pickle.loads(pickle.dumps(obj)), copy.deepcopy(obj), copy.copy(obj)]


def test_core_milvus_indexes_pickle_and_copy(backend):
    units = [Unit(id=i, text=t, metadata=m) for i, t, m in CORPUS]
    for ix in (MilvusBM25Index(backend.uri, "core_bm25").index(units),
               MilvusClusteredBM25Index(backend.uri, "core_clusters", max_tokens=20).index(units)):
        want = [[(u.id, u.score) for u in ix.search(q, k=3)] for q in QUERIES]
        for clone in _clones(ix):
            assert [[(u.id, u.score) for u in clone.search(q, k=3)] for q in QUERIES] == want
        assert ix.search(QUERIES[0], k=3)  # the original still works after being copied


def test_langchain_and_llamaindex_retrievers_on_milvus_pickle_and_copy(backend):
    from langchain_core.documents import Document
    from llama_index.core.schema import TextNode

    from langchain_funnel.retrievers import BM25Retriever as LCBM25
    from llama_index_funnel.retrievers import BM25Retriever as LIBM25

    lc = LCBM25.from_documents([Document(id=i, page_content=t, metadata=m) for i, t, m in CORPUS], k=3,
                               backend=backend.with_collection("lc_copy"), filter={"topic": "geo"})
    li = LIBM25.from_defaults(nodes=[TextNode(id_=i, text=t, metadata=m) for i, t, m in CORPUS],
                              similarity_top_k=3, backend=backend.with_collection("li_copy"))
    for retriever, ask in ((lc, lambda r, q: [(d.id, d.metadata["relevance_score"]) for d in r.invoke(q)]),
                           (li, lambda r, q: [(n.node.node_id, n.score) for n in r.retrieve(q)])):
        want = [ask(retriever, q) for q in QUERIES]
        assert any(want)
        for clone in _clones(retriever):
            assert [ask(clone, q) for q in QUERIES] == want


def test_dense_factories_name_themselves_for_an_unknown_argument(backend):
    from langchain_core.documents import Document
    from llama_index.core.schema import TextNode

    from langchain_funnel import DenseRetriever as LCDense
    from llama_index_funnel import DenseRetriever as LIDense

    for where in (backend.with_collection("misuse"), None):
        with pytest.raises(TypeError, match=r"DenseRetriever\.from_documents got unknown argument\(s\) "
                                            r"\['search_kwargs'\]; accepted: \[.*'batch_size'|"
                                            r"DenseRetriever\.from_documents got unknown .*'ann_threshold'"):
            LCDense.from_documents([Document(page_content="x")], backend=where, search_kwargs={"k": 2})
        with pytest.raises(TypeError, match=r"DenseRetriever\.from_defaults got unknown argument\(s\) \['filter'\]"):
            LIDense.from_defaults([TextNode(text="x")], backend=where, filter={"a": 1})
