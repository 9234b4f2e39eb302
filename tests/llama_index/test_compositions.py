"""LlamaIndex side: our objects inside the framework's own
compositions, checked against what LlamaIndex's own components do."""

from __future__ import annotations

from llama_index.core import VectorStoreIndex
from llama_index.core.callbacks import CallbackManager, CBEventType
from llama_index.core.callbacks.base_handler import BaseCallbackHandler
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.span_handlers import SimpleSpanHandler
from llama_index.core.llms import MockLLM
from llama_index.core.retrievers import QueryFusionRetriever
from llama_index.core.schema import (
    MetadataMode,
    NodeRelationship,
    NodeWithScore,
    QueryBundle,
    RelatedNodeInfo,
    TextNode,
)

from llama_index_funnel import (
    BM25Retriever,
    ClusteredBM25Retriever,
    CrossEncoderRerank,
    ExtractiveCompressorPostprocessor,
    FunnelRetriever,
    LaterChunkingPostprocessor,
)

Q = "Paris capital of France Eiffel Tower"


def _fusion(retrievers, mode):
    return QueryFusionRetriever(retrievers, mode=mode, num_queries=1, similarity_top_k=8, llm=MockLLM(),
                                use_async=False)


def _rrf_reference(lists, k=60.0):
    """Reciprocal rank fusion by node id (Cormack et al.), as LlamaIndex computes it per hash."""
    fused: dict[str, float] = {}
    for nodes in lists:
        for rank, n in enumerate(sorted(nodes, key=lambda x: x.score or 0.0, reverse=True)):
            fused[n.node.node_id] = fused.get(n.node.node_id, 0.0) + 1.0 / (rank + k)
    return fused


def test_query_fusion_rrf_merges_our_nodes_with_the_frameworks(source_linked_nodes):
    bm25 = BM25Retriever.from_defaults(nodes=source_linked_nodes, similarity_top_k=4)
    vector = VectorStoreIndex(source_linked_nodes, embed_model=MockEmbedding(embed_dim=8)) \
        .as_retriever(similarity_top_k=8)
    clustered = ClusteredBM25Retriever.from_defaults(nodes=source_linked_nodes, k_clusters=4,
                                                     similarity_top_k=4, max_tokens=40, knn_k=3,
                                                     knn_threshold=0.05)
    for others in ([vector], [clustered], [vector, clustered]):
        retrievers = [bm25, *others]
        lists = [r.retrieve(Q) for r in retrievers]
        out = _fusion(retrievers, "reciprocal_rerank").retrieve(Q)
        ids = [n.node.node_id for n in out]
        assert len(ids) == len(set(ids)), ids  # one entry per node, not one per retriever
        want = _rrf_reference(lists)
        assert {i: n.score for i, n in zip(ids, out)} == {i: want[i] for i in ids}
        found_by_all = set.intersection(*({n.node.node_id for n in nodes} for nodes in lists))
        assert found_by_all and all(want[i] > 1.0 / 61 for i in found_by_all)
        assert len(out) == min(8, len(set().union(*({n.node.node_id for n in x} for x in lists))))


def test_query_fusion_relative_score_dedups(source_linked_nodes):
    bm25 = BM25Retriever.from_defaults(nodes=source_linked_nodes, similarity_top_k=4)
    vector = VectorStoreIndex(source_linked_nodes, embed_model=MockEmbedding(embed_dim=8)) \
        .as_retriever(similarity_top_k=8)
    out = _fusion([bm25, vector], "relative_score").retrieve(Q)
    ids = [n.node.node_id for n in out]
    assert len(ids) == len(set(ids)) and len(ids) == 8


def _rich_node() -> NodeWithScore:
    text = ("Paris is the capital of France. The Eiffel Tower stands in Paris. "
            "Berlin is the capital of Germany. Rivers run through both cities.")
    node = TextNode(id_="rich", text=text,
                    metadata={"title": "Cities", "secret": "do-not-show", "level": "user-level",
                              "position": "user-position", "score": "user-score"},
                    excluded_llm_metadata_keys=["secret"], excluded_embed_metadata_keys=["secret"])
    node.relationships[NodeRelationship.SOURCE] = RelatedNodeInfo(node_id="doc-1")
    return NodeWithScore(node=node, score=3.0)


def _check_kept(out, original):
    for n in out:
        assert n.node.ref_doc_id == "doc-1"  # SOURCE relationship kept
        assert "secret" in n.node.excluded_llm_metadata_keys
        assert "secret" in n.node.excluded_embed_metadata_keys
        llm_text = n.node.get_content(metadata_mode=MetadataMode.LLM)
        assert "do-not-show" not in llm_text and "funnel" not in llm_text
        assert "do-not-show" not in n.node.get_content(metadata_mode=MetadataMode.EMBED)
        for key in ("title", "secret", "level", "position", "score"):  # user keys untouched
            assert n.node.metadata[key] == original.node.metadata[key]


def test_later_chunking_keeps_excluded_keys_relationships_and_user_metadata():
    nws = _rich_node()
    out = LaterChunkingPostprocessor(words=8).postprocess_nodes([nws], QueryBundle(Q))
    assert len(out) >= 2
    _check_kept(out, nws)
    assert [n.node.metadata["funnel_position"] for n in out] == list(range(len(out)))
    assert all(n.node.metadata["funnel_level"] == "passage" for n in out)
    assert all(n.node.parent_node.node_id == "rich" for n in out)


def test_compressor_keeps_excluded_keys_source_and_hides_its_bookkeeping():
    nws = _rich_node()
    out = ExtractiveCompressorPostprocessor(method="bm25", ratio=0.5).postprocess_nodes(
        [nws], QueryBundle(Q))
    assert len(out) == 1 and len(out[0].node.get_content()) < len(nws.node.get_content())
    _check_kept(out, nws)
    assert "funnel_compression_kept_tokens" in out[0].node.metadata
    assert "funnel_compression_kept_tokens" in out[0].node.excluded_llm_metadata_keys
    assert not any(k.startswith("funnel_") for k in nws.node.metadata)  # the input is not mutated


class _Spans(SimpleSpanHandler):
    pass


class _Events(BaseEventHandler):
    events: list = []

    @classmethod
    def class_name(cls) -> str:
        return "_Events17"

    def handle(self, event, **kwargs) -> None:
        self.events.append(type(event).__name__)


class _CB(BaseCallbackHandler):
    def __init__(self) -> None:
        super().__init__([], [])
        self.started: list = []

    def on_event_start(self, event_type, payload=None, event_id="", parent_id="", **kw):
        self.started.append(event_type)
        return event_id

    def on_event_end(self, event_type, payload=None, event_id="", **kw):
        pass

    def start_trace(self, trace_id=None):
        pass

    def end_trace(self, trace_id=None, trace_map=None):
        pass


def test_rerank_callback_event_and_events_inside_funnel(tiny_cross_encoder_path, source_linked_nodes):
    cb = _CB()
    rr = CrossEncoderRerank(model=tiny_cross_encoder_path, top_n=2,
                            callback_manager=CallbackManager([cb]))
    nodes = BM25Retriever.from_defaults(nodes=source_linked_nodes, similarity_top_k=4).retrieve(Q)
    rr.postprocess_nodes(nodes, QueryBundle(Q))
    assert CBEventType.RERANKING in cb.started  # as LlamaIndex's SentenceTransformerRerank does

    root = get_dispatcher()
    events = _Events()
    spans = _Spans()
    root.add_event_handler(events)
    root.add_span_handler(spans)
    try:
        funnel = FunnelRetriever([BM25Retriever.from_defaults(nodes=source_linked_nodes,
                                                              similarity_top_k=4), rr])
        out = funnel.retrieve(Q)
    finally:
        root.event_handlers.remove(events)
        root.span_handlers.remove(spans)
    assert len(out) == 2
    assert "ReRankStartEvent" in events.events and "ReRankEndEvent" in events.events
    span_names = [s.id_ for s in spans.completed_spans]
    assert any("CrossEncoderRerank" in name for name in span_names), span_names


def test_clustered_similarity_top_k_counts_nodes_in_both_frameworks(source_linked_nodes):
    from langchain_core.documents import Document

    from langchain_funnel import ClusteredBM25Retriever as LCClustered

    kw = dict(max_tokens=25, knn_k=3, knn_threshold=0.01)
    li = ClusteredBM25Retriever.from_defaults(nodes=source_linked_nodes, similarity_top_k=2,
                                              k_clusters=3, **kw)
    lc = LCClustered.from_documents([Document(id=n.node_id, page_content=n.text,
                                              metadata=n.metadata) for n in source_linked_nodes],
                                    k=2, k_clusters=3, **kw)
    q = "Paris France capital Hamlet Shakespeare BM25"
    assert len(li.index.search(q, k=3)) > 2  # three clusters hold more than two nodes
    a, b = li.retrieve(q), lc.invoke(q)
    assert len(a) == 2 and [n.node.node_id for n in a] == [d.id for d in b]
    assert len(li.retrieve(q)) == len(li.search(q, k=2)) == 2
    import pytest

    with pytest.raises(ValueError, match="k must be >= 1"):
        li.search(q, k=0)


def test_node_parser_keeps_user_keys():
    from llama_index.core import Document as LIDocument

    from llama_index_funnel import MultiGranularityNodeParser

    doc = LIDocument(text="Paris is the capital of France. The Eiffel Tower stands in Paris.",
                     metadata={"position": "user-position", "level": "user-level", "secret": "s"},
                     excluded_llm_metadata_keys=["secret"])
    nodes = MultiGranularityNodeParser(chunk_size=5, n_gra=2).get_nodes_from_documents([doc])
    assert nodes
    for n in nodes:
        assert n.metadata["position"] == "user-position" and n.metadata["level"] == "user-level"
        assert "secret" in n.excluded_llm_metadata_keys and "funnel_position" in n.excluded_llm_metadata_keys
        assert isinstance(n.metadata["funnel_position"], int)
