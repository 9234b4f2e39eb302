"""LlamaIndex: CrossEncoderRerank, MonoT5Rerank and LaterChunkingPostprocessor inside a
RetrieverQueryEngine, with events, async, metadata and bad input."""

import asyncio

import pytest
from llama_index.core import Settings
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
from llama_index.core.llms import MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import (
    ImageNode,
    MediaResource,
    Node,
    NodeRelationship,
    NodeWithScore,
    QueryBundle,
    TextNode,
)

from funnel_core.bm25 import BM25Index
from funnel_core.errors import ModelLoadError
from funnel_core.rerank.cross_encoder import CrossEncoderScorer
from funnel_core.scoring import sigmoid
from llama_index_funnel._base import UnitRetriever
from llama_index_funnel.rerank import CrossEncoderRerank, LaterChunkingPostprocessor, MonoT5Rerank

QUERY = "capital of France"


class _BM25(UnitRetriever):
    """A BM25 retriever over the test corpus (only to feed the postprocessors)."""

    def __init__(self, units, k=6):
        super().__init__()
        self._index = BM25Index().index(units)
        self._k = k

    def _search(self, query):
        return self._index.search(query, k=self._k)


@pytest.fixture(autouse=True)
def _mock_embed():
    Settings.embed_model = MockEmbedding(embed_dim=8)


@pytest.fixture
def nodes(corpus_units):
    return [NodeWithScore(node=TextNode(id_=u.id, text=u.text, metadata=dict(u.metadata)),
                          score=float(10 - i)) for i, u in enumerate(corpus_units)]


def test_cross_encoder_in_query_engine(tiny_cross_encoder_path, corpus_units):
    # fp32: this tiny random model's scores differ by ~1e-5, below bf16's resolution, and
    # dtype="auto" (or runtime="auto") runs bf16 on a CPU with native bf16
    rerank = CrossEncoderRerank(model=tiny_cross_encoder_path, dtype="float32", library="transformers", top_n=3,
                                device="cpu", max_length=64, batch_size=4)
    engine = RetrieverQueryEngine.from_args(_BM25(corpus_units), llm=MockLLM(),
                                            node_postprocessors=[rerank])
    response = engine.query("Paris capital of France city")
    got = response.source_nodes
    assert 1 <= len(got) <= 3
    # the order is the model's: recompute the scores with the core scorer
    retrieved = _BM25(corpus_units).retrieve("Paris capital of France city")
    core = CrossEncoderScorer(tiny_cross_encoder_path, dtype="float32", library="transformers", max_length=64)
    raw = [sigmoid(s) for s in  # the adapter's default scale: sigmoid probabilities
           core.score("Paris capital of France city", [n.node.get_content() for n in retrieved])]
    best = sorted(zip(raw, [n.node.node_id for n in retrieved]), reverse=True)[:3]
    assert [n.node.node_id for n in got] == [i for _, i in best]
    assert [n.score for n in got] == pytest.approx([s for s, _ in best], abs=1e-5)
    for n in got:  # metadata survives, the BM25 score is kept, internal keys hidden from the LLM
        assert "topic" in n.node.metadata and "funnel_score_bm25" in n.node.metadata
        assert "funnel_score_bm25" in n.node.excluded_llm_metadata_keys
    assert asyncio.run(engine.aquery("Paris capital of France city")).source_nodes[0].node.node_id \
        == got[0].node.node_id


def test_events_threshold_normalize_and_copies(tiny_cross_encoder_path, nodes):
    # fp32: this tiny random model's scores differ by ~1e-5, below bf16's resolution, and
    # dtype="auto" (or runtime="auto") runs bf16 on a CPU with native bf16
    seen = []

    class Handler(BaseEventHandler):
        @classmethod
        def class_name(cls):
            return "H"

        def handle(self, event, **kwargs):
            if isinstance(event, (ReRankStartEvent, ReRankEndEvent)):
                seen.append(type(event).__name__)

    handler = Handler()
    get_dispatcher().add_event_handler(handler)
    try:
        rr = CrossEncoderRerank(model=tiny_cross_encoder_path, dtype="float32", library="transformers",
                                normalize=True)
        out = rr.postprocess_nodes(nodes, query_str=QUERY)
    finally:
        get_dispatcher().event_handlers.remove(handler)
    assert seen == ["ReRankStartEvent", "ReRankEndEvent"]
    assert all(0 < n.score < 1 for n in out)
    assert [n.score for n in out] == sorted((n.score for n in out), reverse=True)
    assert nodes[0].score == 10.0 and "scores" not in nodes[0].node.metadata  # input untouched
    cut = out[2].score
    thr = CrossEncoderRerank(model=tiny_cross_encoder_path, dtype="float32", library="transformers",
                             normalize=True, score_threshold=cut)
    assert [n.node.node_id for n in thr.postprocess_nodes(nodes, query_str=QUERY)] == \
        [n.node.node_id for n in out[:3]]
    a = asyncio.run(rr.apostprocess_nodes(nodes, query_bundle=QueryBundle(QUERY)))
    assert [n.node.node_id for n in a] == [n.node.node_id for n in out]
    assert rr.class_name() == "CrossEncoderRerank"


def test_maxp_rerank_in_query_engine(tiny_cross_encoder_path, corpus_units):
    rerank = CrossEncoderRerank(model=tiny_cross_encoder_path, library="transformers", top_n=2,
                                max_length=64, window_words=4, dtype="bfloat16")
    assert rerank.stage.window_words == 4 and rerank.stage.dtype == "bfloat16"
    engine = RetrieverQueryEngine.from_args(_BM25(corpus_units, k=4), llm=MockLLM(),
                                            node_postprocessors=[rerank])
    got = engine.query("Paris capital of France city").source_nodes
    assert len(got) == 2 and got[0].score >= got[1].score


def test_later_chunking_then_rerank(tiny_cross_encoder_path, corpus_units):
    chunk = LaterChunkingPostprocessor(words=5)
    rerank = CrossEncoderRerank(model=tiny_cross_encoder_path, library="transformers", top_n=4)
    engine = RetrieverQueryEngine.from_args(_BM25(corpus_units, k=3), llm=MockLLM(),
                                            node_postprocessors=[chunk, rerank])
    got = engine.query("Paris capital of France city").source_nodes
    assert len(got) == 4
    parents = {n.node.node_id for n in _BM25(corpus_units, k=3).retrieve("Paris capital of France city")}
    for n in got:
        parent = n.node.relationships[NodeRelationship.PARENT].node_id
        assert parent in parents and n.node.node_id.startswith(parent + "#")
        assert n.node.metadata["funnel_level"] == "passage" and "funnel_parent_score" in n.node.metadata
        assert len(n.node.get_content().split()) <= 5


def test_monot5_rerank_in_query_engine(tiny_t5_path, corpus_units):
    rr = MonoT5Rerank(model=tiny_t5_path, top_n=2, device="cpu", max_length=64, normalize=True)
    engine = RetrieverQueryEngine.from_args(_BM25(corpus_units), llm=MockLLM(),
                                            node_postprocessors=[rr])
    got = engine.query("Paris capital of France city").source_nodes
    assert len(got) == 2 and all(0 < n.score < 1 for n in got)
    assert got[0].score >= got[1].score and "funnel_score_monot5" in got[0].node.metadata
    assert MonoT5Rerank.class_name() == "MonoT5Rerank"


def test_bad_input(tiny_cross_encoder_path, nodes):
    rr = CrossEncoderRerank(model=tiny_cross_encoder_path, library="transformers")
    assert rr.postprocess_nodes([], query_str=QUERY) == []
    with pytest.raises(ValueError, match="top_n must be >= 1"):
        CrossEncoderRerank(model=tiny_cross_encoder_path, top_n=0)
    with pytest.raises(ValueError, match="unknown cross-encoder library 'nope'"):
        CrossEncoderRerank(model=tiny_cross_encoder_path, library="nope")
    with pytest.raises(ValueError, match="words must be >= 1"):
        LaterChunkingPostprocessor(words=0)
    offline = CrossEncoderRerank(model="no-such-org/reranker", library="transformers")
    with pytest.raises(ModelLoadError, match="no-such-org/reranker"):
        offline.postprocess_nodes(nodes, query_str=QUERY)
    long = [NodeWithScore(node=TextNode(text="word " * 5000), score=1.0)] + nodes[:1]
    assert len(rr.postprocess_nodes(long, query_str=QUERY)) == 2  # truncated, no crash
    image = NodeWithScore(node=Node(image_resource=MediaResource(path="x.png")), score=1.0)
    with pytest.raises(TypeError, match="has no text to score"):
        rr.postprocess_nodes([image] + nodes[:1], query_str=QUERY)
    # an ImageNode is a TextNode: its (empty) text is scored, nothing crashes
    empty = NodeWithScore(node=ImageNode(image_path="x.png"), score=1.0)
    assert len(rr.postprocess_nodes([empty] + nodes[:1], query_str=QUERY)) == 2
