"""A FunnelRetriever converts between framework objects and units once on the way in and once on
the way out, whatever the number of this package's stages in it; a user's own framework stage in
the middle is run through its framework, converted only around it; and a funnel gives the same
results whether or not callbacks / event handlers listen (while they do, each of our stages is
still a child run / emits its events).

The counts come from wrapping the one conversion pair of each adapter package
(``documents_to_units`` / ``units_to_documents``, ``nodes_to_units`` / ``units_to_nodes``) in every
module of that package that holds it: instrumentation of our own code, the stages are real."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import Counter
from typing import Sequence

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.vectorstores import InMemoryVectorStore
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeRelationship

Q = "Eiffel Tower in Paris France"


@contextlib.contextmanager
def count_calls(monkeypatch, package: str, *names: str):
    """Count the calls of ``names`` made through any module of ``package``."""
    counts: Counter = Counter()
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not (mod_name == package or mod_name.startswith(package + ".")):
            continue
        for name in names:
            fn = getattr(mod, name, None)
            if fn is None:
                continue

            def counted(*args, __fn=fn, __name=name, **kwargs):
                counts[__name] += 1
                return __fn(*args, **kwargs)

            monkeypatch.setattr(mod, name, counted)
    yield counts


# -- LangChain -------------------------------------------------------------------------------

def _lc_docs(corpus_units):
    return [Document(id=u.id, page_content=u.text, metadata=dict(u.metadata)) for u in corpus_units]


def _lc_stages(corpus_units, tiny_cross_encoder_path):
    from langchain_funnel import CrossEncoderReranker, LaterChunkingTransformer, RepackTransformer
    from langchain_funnel.retrievers import BM25Retriever

    return [BM25Retriever.from_documents(_lc_docs(corpus_units), k=5),
            CrossEncoderReranker(model=tiny_cross_encoder_path, top_n=3, device="cpu"),
            LaterChunkingTransformer(words=5), RepackTransformer(order="reverse")]


class KeepContaining(BaseDocumentCompressor):
    """A user's own LangChain compressor: keeps the documents that contain ``word``."""

    word: str

    def compress_documents(self, documents: Sequence[Document], query: str, callbacks=None):
        return [d for d in documents if self.word in d.page_content]


def test_langchain_funnel_of_our_stages_builds_documents_once(
        monkeypatch, corpus_units, tiny_cross_encoder_path):
    from langchain_funnel import FunnelRetriever

    funnel = FunnelRetriever.from_stages(*_lc_stages(corpus_units, tiny_cross_encoder_path), k=None)
    with count_calls(monkeypatch, "langchain_funnel", "documents_to_units",
                     "units_to_documents") as counts:
        out = funnel.invoke(Q)
        assert counts == {"units_to_documents": 1}  # none between the four stages
        aout = asyncio.run(funnel.ainvoke(Q))
        assert counts == {"units_to_documents": 2}
    assert [d.id for d in aout] == [d.id for d in out]
    assert len(out) > 3 and all(d.metadata["funnel_level"] == "passage" for d in out)
    # the whole funnel ran: scores of BM25 and the cross-encoder, repacked best last
    assert {"funnel_score_bm25", "funnel_score_cross_encoder", "funnel_repack_position"} \
        <= set(out[0].metadata)


def test_langchain_funnel_after_a_vector_store_converts_in_once(
        monkeypatch, corpus_units, tiny_cross_encoder_path):
    from langchain_funnel import FunnelRetriever

    store = InMemoryVectorStore(DeterministicFakeEmbedding(size=16))
    store.add_documents(_lc_docs(corpus_units))
    _, *ours = _lc_stages(corpus_units, tiny_cross_encoder_path)
    funnel = FunnelRetriever.from_stages(store.as_retriever(search_kwargs={"k": 5}), *ours, k=4)
    with count_calls(monkeypatch, "langchain_funnel", "documents_to_units",
                     "units_to_documents") as counts:
        out = funnel.invoke(Q)
    assert counts == {"documents_to_units": 1, "units_to_documents": 1}
    assert len(out) == 4


def test_langchain_users_own_compressor_in_the_middle_runs(
        monkeypatch, corpus_units, tiny_cross_encoder_path):
    from langchain_funnel import FunnelRetriever

    bm25, rerank, chunk, repack = _lc_stages(corpus_units, tiny_cross_encoder_path)
    mine = KeepContaining(word="Eiffel")
    funnel = FunnelRetriever.from_stages(bm25, rerank, mine, chunk, repack, k=None)
    with count_calls(monkeypatch, "langchain_funnel", "documents_to_units",
                     "units_to_documents") as counts:
        out, trace = funnel.search(Q)
    assert [s.name for s in trace.stages][2] == "KeepContaining"
    assert trace.stages[2].units_out < trace.stages[2].units_in  # it filtered
    # converted only around the user's stage, and once for the output
    assert counts == {"units_to_documents": 2, "documents_to_units": 1}
    parents = {d.metadata["funnel_parent_id"] for d in out}
    assert parents and all("Eiffel" in next(u.text for u in corpus_units if u.id == p) for p in parents)


def test_langchain_funnel_gives_the_same_documents_while_callbacks_listen(
        corpus_units, tiny_cross_encoder_path):
    """With a callback handler, each of our stages is a child run of the funnel's run (named as
    its own invoke names it, with Documents in and out); the documents are the same."""
    from langchain_funnel import FunnelRetriever

    funnel = FunnelRetriever.from_stages(*_lc_stages(corpus_units, tiny_cross_encoder_path), k=None)

    class Runs(BaseCallbackHandler):
        def __init__(self):
            self.started, self.ended_with = [], {}

        def on_chain_start(self, serialized, inputs, *, run_id, name=None, **kw):
            self.started.append(name or kw.get("name"))
            self.names = getattr(self, "names", {})
            self.names[run_id] = name

        def on_chain_end(self, outputs, *, run_id, **kw):
            self.ended_with[self.names.get(run_id)] = outputs

        def on_retriever_start(self, serialized, query, *, run_id, name=None, **kw):
            self.started.append(name)

    quiet = funnel.invoke(Q)
    runs = Runs()
    heard = funnel.invoke(Q, config={"callbacks": [runs]})
    assert [(d.id, d.page_content, d.metadata) for d in heard] == \
        [(d.id, d.page_content, d.metadata) for d in quiet]
    assert runs.started[:1] == ["FunnelRetriever"]
    assert {"BM25Retriever", "CrossEncoderReranker", "LaterChunkingTransformer",
            "RepackTransformer"} <= set(runs.started)
    assert [d.id for d in runs.ended_with["RepackTransformer"]] == [d.id for d in heard]
    aheard = asyncio.run(funnel.ainvoke(Q, config={"callbacks": [Runs()]}))
    assert [d.metadata for d in aheard] == [d.metadata for d in quiet]


# -- LlamaIndex ------------------------------------------------------------------------------

def _li_stages(nodes, tiny_cross_encoder_path):
    from llama_index_funnel import CrossEncoderRerank, LaterChunkingPostprocessor, RepackPostprocessor
    from llama_index_funnel.retrievers import BM25Retriever

    return [BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=5),
            CrossEncoderRerank(model=tiny_cross_encoder_path, top_n=3, device="cpu"),
            LaterChunkingPostprocessor(words=5), RepackPostprocessor(order="reverse")]


class KeepContainingNodes(BaseNodePostprocessor):
    """A user's own LlamaIndex postprocessor: keeps the nodes that contain ``word``."""

    word: str

    @classmethod
    def class_name(cls) -> str:
        return "KeepContainingNodes"

    def _postprocess_nodes(self, nodes, query_bundle=None):
        return [n for n in nodes if self.word in n.node.get_content()]


def test_llamaindex_funnel_of_our_stages_builds_nodes_once(
        monkeypatch, source_linked_nodes, tiny_cross_encoder_path):
    from llama_index_funnel import FunnelRetriever

    funnel = FunnelRetriever(_li_stages(source_linked_nodes, tiny_cross_encoder_path))
    with count_calls(monkeypatch, "llama_index_funnel", "nodes_to_units",
                     "units_to_nodes") as counts:
        out = funnel.retrieve(Q)
        assert counts == {"units_to_nodes": 1}  # none between the four stages
        aout = asyncio.run(funnel.aretrieve(Q))
        assert counts == {"units_to_nodes": 2}
    assert [n.node.node_id for n in aout] == [n.node.node_id for n in out]
    assert len(out) > 3
    by_id = {n.node_id: n for n in source_linked_nodes}
    for n in out:  # passages of the user's nodes: PARENT to it, its SOURCE inherited
        parent = n.node.relationships[NodeRelationship.PARENT].node_id
        assert n.node.relationships[NodeRelationship.SOURCE].node_id == f"src-{parent}"
        assert n.node.metadata["topic"] == by_id[parent].metadata["topic"]
        assert {"funnel_score_bm25", "funnel_score_cross_encoder"} <= set(n.node.metadata)


def test_llamaindex_users_own_postprocessor_in_the_middle_runs(
        monkeypatch, source_linked_nodes, tiny_cross_encoder_path):
    from llama_index_funnel import FunnelRetriever

    bm25, rerank, chunk, repack = _li_stages(source_linked_nodes, tiny_cross_encoder_path)
    funnel = FunnelRetriever([bm25, rerank, KeepContainingNodes(word="Eiffel"), chunk, repack])
    with count_calls(monkeypatch, "llama_index_funnel", "nodes_to_units",
                     "units_to_nodes") as counts:
        out, trace = funnel.search(Q)
    assert trace.stages[2].name == "KeepContainingNodes"
    assert trace.stages[2].units_out < trace.stages[2].units_in
    assert counts == {"units_to_nodes": 2, "nodes_to_units": 1}
    # the user's stage got copies of the user's nodes (their SOURCE), and so does the output
    for n in out:
        parent = n.node.relationships[NodeRelationship.PARENT].node_id
        assert "Eiffel" in next(u.text for u in source_linked_nodes if u.node_id == parent)
        assert n.node.relationships[NodeRelationship.SOURCE].node_id == f"src-{parent}"


def test_llamaindex_funnel_gives_the_same_nodes_while_handlers_listen(
        source_linked_nodes, tiny_cross_encoder_path):
    """With an event handler, our stages run through retrieve / postprocess_nodes (retrieval
    and rerank events fire inside the funnel); the nodes are the same."""
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler

    from llama_index_funnel import FunnelRetriever

    funnel = FunnelRetriever(_li_stages(source_linked_nodes, tiny_cross_encoder_path))
    quiet = funnel.retrieve(Q)

    class Names(BaseEventHandler):
        names: list = []

        @classmethod
        def class_name(cls) -> str:
            return "Names"

        def handle(self, event, **kwargs):
            self.names.append(event.class_name())

    root, handler = get_dispatcher(), Names(names=[])
    root.add_event_handler(handler)
    try:
        heard = funnel.retrieve(Q)
        aheard = asyncio.run(funnel.aretrieve(Q))
    finally:
        root.event_handlers.remove(handler)
    for got in (heard, aheard):
        assert [(n.node.node_id, n.score, n.node.metadata) for n in got] == \
            [(n.node.node_id, n.score, n.node.metadata) for n in quiet]
    # per query: the funnel's retrieval and the BM25 retriever's, three reranks, one trace
    assert handler.names.count("RetrievalStartEvent") == 4
    assert handler.names.count("ReRankStartEvent") == 6
    assert handler.names.count("FunnelTraceEvent") == 2


@pytest.mark.parametrize("framework", ["langchain", "llama_index"])
def test_a_nested_funnel_is_run_on_units_too(monkeypatch, framework, corpus_units,
                                             source_linked_nodes, tiny_cross_encoder_path):
    """A FunnelRetriever used as the first stage of another one adds no conversion."""
    if framework == "langchain":
        from langchain_funnel import FunnelRetriever

        bm25, rerank, chunk, repack = _lc_stages(corpus_units, tiny_cross_encoder_path)
        inner = FunnelRetriever.from_stages(bm25, rerank, k=None)
        outer = FunnelRetriever.from_stages(inner, chunk, repack, k=None)
        names = ("documents_to_units", "units_to_documents")
        run = outer.invoke
    else:
        from llama_index_funnel import FunnelRetriever

        bm25, rerank, chunk, repack = _li_stages(source_linked_nodes, tiny_cross_encoder_path)
        outer = FunnelRetriever([FunnelRetriever([bm25, rerank]), chunk, repack])
        names = ("nodes_to_units", "units_to_nodes")
        run = outer.retrieve
    with count_calls(monkeypatch, framework + "_funnel", *names) as counts:
        out = run(Q)
    assert len(out) > 3 and dict(counts) == {names[1]: 1}


def test_both_frameworks_keep_the_same_bookkeeping(corpus_units, source_linked_nodes,
                                                   tiny_cross_encoder_path):
    """The same funnel in both frameworks hands back the same ids, scores and ``funnel_`` keys:
    what our retrievers record (``funnel_score_bm25``, ``funnel_bm25_rank``) reaches the output in
    LlamaIndex too, where a round trip through the BM25 retriever's own nodes (which carry none
    of it, so that their hash stays the user's) used to drop it and record the score again under
    the retriever's class name."""
    import langchain_funnel as lc
    import llama_index_funnel as li

    lc_out = lc.FunnelRetriever.from_stages(*_lc_stages(corpus_units, tiny_cross_encoder_path)[:3],
                                            k=None).invoke(Q)
    li_out = li.FunnelRetriever(_li_stages(source_linked_nodes, tiny_cross_encoder_path)[:3]).retrieve(Q)

    def ours(meta):
        return {k: v for k, v in meta.items() if k.startswith("funnel_")}

    assert [d.id for d in lc_out] == [n.node.node_id for n in li_out]
    assert [d.metadata.get("relevance_score") for d in lc_out] == pytest.approx(
        [n.score for n in li_out])
    for d, n in zip(lc_out, li_out):
        assert ours(d.metadata) == pytest.approx(ours(n.node.metadata))
        assert "funnel_score_BM25Retriever" not in n.node.metadata
