"""FiD and decoder-only attention rerankers inside LlamaIndex and LangChain compositions."""

from __future__ import annotations

import pytest
from langchain_core.documents import Document
from llama_index.core import Settings
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
from llama_index.core.llms import MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from funnel_core.bm25 import BM25Index
from funnel_core.rerank.attention_lm import AttentionLMScorer
from funnel_core.rerank.fid import FiDAttentionScorer
from langchain_funnel._base import UnitRetriever as LCUnitRetriever
from langchain_funnel.fid import AttentionLMReranker, FiDAttentionReranker
from langchain_funnel.funnel import rerank_chain
from llama_index_funnel._base import UnitRetriever as LIUnitRetriever
from llama_index_funnel.fid import AttentionLMRerank, FiDAttentionRerank

QUERY = "did Shakespeare write Hamlet in the capital, Paris?"


class _LIBM25(LIUnitRetriever):
    def __init__(self, index: BM25Index, k: int = 5) -> None:
        super().__init__()
        self._index, self._k = index, k

    def _search(self, query: str):
        return self._index.search(query, self._k)


class _LCBM25(LCUnitRetriever):
    index: BM25Index

    def _search(self, query: str, k: int):
        return self.index.search(query, k)


class _Events(BaseEventHandler):
    events: list = []

    @classmethod
    def class_name(cls) -> str:
        return "_Events"

    def handle(self, event, **kwargs):
        if isinstance(event, (ReRankStartEvent, ReRankEndEvent)):
            self.events.append(type(event).__name__)


@pytest.fixture(scope="module")
def index(corpus_units):
    return BM25Index().index(corpus_units)


@pytest.fixture(params=["fid", "attention_lm"])
def li_reranker(request, tiny_t5_path, tiny_llama_path):
    if request.param == "fid":
        return FiDAttentionRerank(model=tiny_t5_path, top_n=2, return_answer=True), "fid_attention"
    return AttentionLMRerank(model=tiny_llama_path, top_n=2), "attention_lm"


@pytest.fixture(params=["fid", "attention_lm"])
def lc_reranker(request, tiny_t5_path, tiny_llama_path):
    if request.param == "fid":
        return FiDAttentionReranker(model=tiny_t5_path, top_n=2), "fid_attention"
    return AttentionLMReranker(model=tiny_llama_path, top_n=2), "attention_lm"


def test_llamaindex_query_engine(index, li_reranker):
    post, stage_name = li_reranker
    Settings.embed_model = MockEmbedding(embed_dim=8)
    handler = _Events()
    handler.events = []
    dispatcher = get_dispatcher("llama_index_funnel._base")
    dispatcher.add_event_handler(handler)
    try:
        engine = RetrieverQueryEngine.from_args(_LIBM25(index, k=5), llm=MockLLM(),
                                                node_postprocessors=[post])
        response = engine.query(QUERY)
    finally:
        dispatcher.event_handlers.remove(handler)
    nodes = response.source_nodes
    assert len(nodes) == 2 and nodes[0].score >= nodes[1].score
    assert all(f"funnel_score_{stage_name}" in n.node.metadata
               and "funnel_score_bm25" in n.node.metadata for n in nodes)
    assert nodes[0].node.metadata["title"]                     # original metadata kept
    assert handler.events == ["ReRankStartEvent", "ReRankEndEvent"]
    assert post.class_name() in ("FiDAttentionRerank", "AttentionLMRerank")


async def test_llamaindex_async_matches_sync(index, li_reranker):
    post, _ = li_reranker
    nodes = _LIBM25(index, k=5).retrieve(QUERY)
    sync = post.postprocess_nodes(nodes, query_str=QUERY)
    asyn = await post.apostprocess_nodes(nodes, query_bundle=QUERY and QueryBundle(QUERY))
    assert [n.node.node_id for n in sync] == [n.node.node_id for n in asyn]
    assert [n.score for n in sync] == pytest.approx([n.score for n in asyn])


def test_llamaindex_scores_match_core_with_titles(tiny_t5_path):
    nodes = [NodeWithScore(node=TextNode(id_="a", text="Hamlet is a tragedy.", metadata={"title": "Hamlet"}), score=1.0),
             NodeWithScore(node=TextNode(id_="b", text="Paris is in France."), score=0.5)]
    out = FiDAttentionRerank(model=tiny_t5_path, return_answer=True).postprocess_nodes(nodes, query_str=QUERY)
    core, answer = FiDAttentionScorer(model=tiny_t5_path).score_with_titles(
        QUERY, ["Hamlet is a tragedy.", "Paris is in France."], ["Hamlet", None])
    by_id = {n.node.node_id: n.score for n in out}
    assert [by_id["a"], by_id["b"]] == pytest.approx(core)
    assert isinstance(out[0].node.metadata["funnel_fid_answer"], str)
    assert nodes[0].score == 1.0 and "scores" not in nodes[0].node.metadata


def test_langchain_lcel_chain(index, lc_reranker):
    comp, stage_name = lc_reranker
    chain = rerank_chain(_LCBM25(index=index, k=5), comp)
    docs = chain.invoke(QUERY)
    assert len(docs) == 2 and all(isinstance(d, Document) for d in docs)
    assert docs[0].metadata["relevance_score"] >= docs[1].metadata["relevance_score"]
    assert all(f"funnel_score_{stage_name}" in d.metadata for d in docs)
    assert docs[0].metadata["title"]


async def test_langchain_async_and_compress(index, lc_reranker):
    comp, _ = lc_reranker
    docs = _LCBM25(index=index, k=4).invoke(QUERY)
    sync = comp.compress_documents(docs, QUERY)
    asyn = await comp.acompress_documents(docs, QUERY)
    assert [d.id for d in sync] == [d.id for d in asyn]
    # empty query: nothing is scored, the order stays, and top_n still caps
    assert comp.compress_documents(docs, "  ") == docs[: comp.top_n or len(docs)]


def test_langchain_scores_match_core(tiny_llama_path):
    docs = [Document(page_content="Hamlet is a tragedy.", id="a"),
            Document(page_content="Paris is in France.", id="b")]
    out = AttentionLMReranker(model=tiny_llama_path).compress_documents(docs, QUERY)
    core = AttentionLMScorer(model=tiny_llama_path).score(QUERY, [d.page_content for d in docs])
    by_id = {d.id: d.metadata["relevance_score"] for d in out}
    assert [by_id["a"], by_id["b"]] == pytest.approx(core)


def test_bad_configuration_fails_at_construction(tiny_t5_path):
    with pytest.raises(ValueError, match="aggregation"):
        FiDAttentionRerank(model=tiny_t5_path, aggregation="median")
    with pytest.raises(ValueError, match="aggregation"):
        FiDAttentionReranker(model=tiny_t5_path, aggregation="median")
    with pytest.raises(ValueError, match="attend_from"):
        AttentionLMReranker(model="x", attend_from="docs")
    with pytest.raises(ValueError, match="top_n"):
        AttentionLMRerank(model="x", top_n=0)
