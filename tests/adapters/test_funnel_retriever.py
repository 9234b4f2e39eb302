"""FunnelRetriever in both frameworks, with our stages and with the frameworks' own objects."""

import asyncio
import contextlib
import json

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore
from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.llms import MockLLM
from llama_index.core.postprocessor import LongContextReorder, SimilarityPostprocessor
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import NodeRelationship

from funnel_core import BM25Index, BM25Retrieve, Funnel, LaterChunking
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
from funnel_core.funnelrag.presets import funnelrag
from funnel_core.rerank.base import Reranker
from langchain_funnel.funnel import FunnelRetriever as LCFunnelRetriever
from langchain_funnel.retrievers import BM25Retriever as LCBM25Retriever
from llama_index_funnel.funnel import FunnelRetriever as LIFunnelRetriever
from llama_index_funnel.retrievers import ClusteredBM25Retriever

Settings.embed_model = MockEmbedding(embed_dim=8)


class KeywordScorer(Reranker):
    """Scores a text by how often it contains a word (a transparent, model-free reranker)."""

    def __init__(self, word, **kw):
        super().__init__(score_threshold=0.5, **kw)
        self.word = word.lower()

    def score(self, query, texts):
        return [float(t.lower().count(self.word)) for t in texts]


def keep_containing(word):
    return KeywordScorer(word, name=f"keep[{word}]")


def test_core_preset_builds_the_papers_funnel(corpus_units):
    funnel = funnelrag(corpus_units, pre_ranker=keep_containing("Paris"), post_ranker=keep_containing("tower"),
                       k_clusters=3, k_documents=2, k_passages=1, passage_words=6, max_tokens=40)
    res = funnel.search("Paris France tower", answers=["Eiffel"])
    names = [r.name for r in res.trace.stages]
    assert names == ["retrieval", "pre_ranking % 2", "later_chunking", "post_ranking % 1"]
    levels = [r.level for r in res.trace.stages]
    assert levels == ["document", None if not res.units else levels[1], "passage", levels[3]]
    assert res.trace.stages[2].units_out > res.trace.stages[2].units_in  # documents -> passages
    assert len(res.units) == 1 and "tower" in res.units[0].text.lower()
    assert set(res.units[0].scores) >= {"retrieval", "pre_ranking", "post_ranking"}


@contextlib.contextmanager
def _funnel_traces():
    """The FunnelTraceEvent traces sent to LlamaIndex's instrumentation while the block runs."""
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler

    from llama_index_funnel.funnel import FunnelTraceEvent

    got: list[dict] = []

    class Collect(BaseEventHandler):
        def handle(self, event, **kwargs):
            if isinstance(event, FunnelTraceEvent):
                got.append(event.trace)

    root = get_dispatcher()
    handler = Collect()
    root.add_event_handler(handler)
    try:
        yield got
    finally:
        root.event_handlers.remove(handler)


def test_llamaindex_funnel_traces_are_per_query_under_concurrency(source_linked_nodes):
    """Concurrent queries each send their own trace (in their own span); nothing is shared."""
    funnel = LIFunnelRetriever([ClusteredBM25Retriever.from_defaults(nodes=source_linked_nodes, similarity_top_k=2,
                                                                     max_tokens=40, knn_k=3, knn_threshold=0.05),
                                LaterChunking(words=6) % 3])
    queries = ["Eiffel Tower in Paris", "Berlin wall", "Rome Colosseum", "Paris museum"]

    async def run_all():
        return await asyncio.gather(*(funnel.aretrieve(q) for q in queries))

    with _funnel_traces() as traces:
        asyncio.run(run_all())
    assert sorted(t["query"] for t in traces) == sorted(queries)
    assert all(t["stages"][-1]["units_out"] <= 3 for t in traces)


def test_llamaindex_funnel_with_native_components_in_a_query_engine(source_linked_nodes):
    clustered = ClusteredBM25Retriever.from_defaults(nodes=source_linked_nodes, similarity_top_k=3, max_tokens=40,
                                                     knn_k=3, knn_threshold=0.05)
    funnel = LIFunnelRetriever([clustered, SimilarityPostprocessor(similarity_cutoff=0.0),
                                LaterChunking(words=6) % 6, LongContextReorder()])
    engine = RetrieverQueryEngine.from_args(funnel, llm=MockLLM())
    with _funnel_traces() as traces:
        response = engine.query("Eiffel Tower in Paris")
    assert len(response.source_nodes) == 6
    assert not any("trace" in k for k in response.source_nodes[0].node.metadata)  # not on nodes
    assert not hasattr(funnel, "last_trace")  # no state shared between queries
    (trace,) = traces
    assert [s["name"] for s in trace["stages"]] == ["ClusteredBM25Retriever", "SimilarityPostprocessor",
                                                    "later_chunking(6w) % 6", "LongContextReorder"]
    # passages point to their parent document node, which keeps its source relationship
    child = response.source_nodes[0].node
    assert child.relationships[NodeRelationship.PARENT].node_id in {n.node_id for n in source_linked_nodes}


def test_llamaindex_funnel_keeps_native_nodes_and_async(source_linked_nodes):
    vector = VectorStoreIndex(source_linked_nodes).as_retriever(similarity_top_k=4)
    funnel = LIFunnelRetriever([vector, LongContextReorder()])
    out = funnel.retrieve("Paris")
    assert len(out) == 4 and all(n.node.source_node.node_id.startswith("src-") for n in out)
    aout = asyncio.run(funnel.aretrieve("Paris"))
    assert [n.node.node_id for n in aout] == [n.node.node_id for n in out]


def test_llamaindex_funnel_search_reports_answer_recall(source_linked_nodes):
    index = BM25Index().index([__import__("funnel_core").Unit(id=n.node_id, text=n.text) for n in source_linked_nodes])
    funnel = LIFunnelRetriever([BM25Retrieve(index, k=5), keep_containing("Shakespeare")], nodes=source_linked_nodes)
    out, trace = funnel.search("Who wrote Hamlet, the tragedy?", answers=["William Shakespeare"])
    assert [r.answer_recall for r in trace.stages] == [1.0, 1.0]
    assert out[0].node.source_node.node_id.startswith("src-")  # copies of the given nodes


def test_langchain_funnel_with_native_components_in_lcel(corpus_units):
    docs = [Document(id=u.id, page_content=u.text, metadata=dict(u.metadata)) for u in corpus_units]
    store = InMemoryVectorStore(DeterministicFakeEmbedding(size=16))
    store.add_documents(docs)
    reverse = RunnableLambda(lambda x: list(reversed(x["documents"])), name="reverse")
    funnel = LCFunnelRetriever.from_stages(LCBM25Retriever.from_documents(docs, k=4), reverse,
                                           LaterChunking(words=6), k=3)
    prompt = ChatPromptTemplate.from_template("{context}\n\nQ: {question}")
    chain = {"context": funnel | (lambda ds: "\n".join(d.page_content for d in ds)),
             "question": RunnablePassthrough()} | prompt
    text = chain.invoke("Shakespeare playwright").to_string()
    assert "Q: Shakespeare playwright" in text
    out = funnel.invoke("Shakespeare playwright")
    assert len(out) == 3 and not any("trace" in k for k in out[0].metadata)  # not on documents
    _, trace = funnel.search("Shakespeare playwright")
    assert trace.stages[1].name == "reverse"
    assert out[0].metadata["funnel_parent_id"] in {d.id for d in docs}
    vec_funnel = LCFunnelRetriever.from_stages(store.as_retriever(search_kwargs={"k": 5}), LaterChunking(words=6), k=2)
    assert len(asyncio.run(vec_funnel.ainvoke("Paris"))) == 2


def test_langchain_funnel_accepts_our_transformers(corpus_units):
    from langchain_funnel.rerank import LaterChunkingTransformer

    docs = [Document(id=u.id, page_content=u.text) for u in corpus_units]
    funnel = LCFunnelRetriever.from_stages(LCBM25Retriever.from_documents(docs, k=2),
                                           LaterChunkingTransformer(words=4), k=10)
    out = funnel.invoke("Eiffel Tower Paris")
    assert len(out) > 2 and all(len(d.page_content.split()) <= 4 for d in out)
    assert all(d.metadata["funnel_level"] == "passage" and d.metadata["funnel_parent_id"] for d in out)


def test_langchain_funnel_rejects_bad_stage_output(corpus_units):
    docs = [Document(id=u.id, page_content=u.text) for u in corpus_units]
    bad = RunnableLambda(lambda x: "not documents")
    funnel = LCFunnelRetriever.from_stages(LCBM25Retriever.from_documents(docs), bad)
    with pytest.raises(TypeError, match="must return a list of Documents"):
        funnel.invoke("Paris")


def test_funnel_bad_input(corpus_units):
    with pytest.raises(ValueError, match="at least one stage"):
        Funnel([])
    with pytest.raises(TypeError, match="a funnel stage must be"):
        Funnel([42])
    with pytest.raises(ValueError, match="k_documents must be >= 1"):
        funnelrag(corpus_units, pre_ranker=keep_containing("x"), k_documents=0)
    with pytest.raises(TypeError, match="pre_ranking must be"):
        funnelrag(ClusteredBM25Index(max_tokens=40).index(corpus_units), pre_ranker=3.5)


def test_langchain_funnel_keeps_one_score_per_stage_and_no_trace_on_documents(
        corpus_units, tiny_cross_encoder_path):
    """A FunnelRetriever over our retriever recorded the retriever's score twice
    (``bm25`` and ``ClusteredBM25Retriever``), two cross-encoder stages wrote one
    ``cross_encoder`` entry (the second overwrote the first), and every document carried the
    whole trace (~1.15 KB of JSON). Now: one key per scoring, the second cross-encoder under
    ``cross_encoder_2``, and the trace goes to the run's callbacks (a custom event)."""
    from langchain_core.callbacks import BaseCallbackHandler

    from langchain_funnel import CrossEncoderReranker, LaterChunkingTransformer
    from langchain_funnel.retrievers import ClusteredBM25Retriever as LCClustered

    docs = [Document(id=u.id, page_content=u.text, metadata=dict(u.metadata)) for u in corpus_units]
    clustered = LCClustered.from_documents(docs, k=8, max_tokens=40, knn_k=3, knn_threshold=0.05)
    pre = CrossEncoderReranker(model=tiny_cross_encoder_path, top_n=4, device="cpu")
    post = CrossEncoderReranker(model=tiny_cross_encoder_path, top_n=2, device="cpu")
    funnel = LCFunnelRetriever.from_stages(clustered, pre, LaterChunkingTransformer(words=6), post, k=2)

    class Events(BaseCallbackHandler):
        def __init__(self):
            self.events = []

        def on_custom_event(self, name, data, **kwargs):
            self.events.append((name, data))

    events = Events()
    out = funnel.invoke("Eiffel Tower in Paris", config={"callbacks": [events]})
    assert len(out) == 2
    for d in out:
        scores = {k: v for k, v in d.metadata.items() if k.startswith("funnel_score_")}
        assert set(scores) == {"funnel_score_bm25", "funnel_score_cross_encoder",
                               "funnel_score_cross_encoder_2"}, scores
        assert scores["funnel_score_cross_encoder_2"] == d.metadata["relevance_score"]
        assert not any("trace" in k for k in d.metadata)
        assert len(json.dumps(d.metadata)) < 900  # the user's keys plus a few scalars
    # the passage's first cross-encoder score is its document's (scored before chunking)
    pre_scores = {d.id: d.metadata["relevance_score"]
                  for d in pre.compress_documents(clustered.invoke("Eiffel Tower in Paris"),
                                                  "Eiffel Tower in Paris")}
    for d in out:
        assert d.metadata["funnel_score_cross_encoder"] == pytest.approx(
            pre_scores[d.metadata["funnel_parent_id"]])
    [(name, trace)] = [e for e in events.events if e[0] == "funnel_trace"]
    assert len(trace["stages"]) == 4 and trace["stages"][0]["name"] == "ClusteredBM25Retriever"
    assert trace["stages"][1]["units_out"] <= 4 and trace["stages"][3]["units_out"] == 2
    # async: the same event
    events.events.clear()
    asyncio.run(funnel.ainvoke("Eiffel Tower in Paris", config={"callbacks": [events]}))
    assert [e[0] for e in events.events] == ["funnel_trace"]


def test_two_stages_of_one_name_keep_both_scores():
    from funnel_core import Unit

    u = Unit(id="a", text="t").rescored(1.0, "cross_encoder").rescored(2.0, "cross_encoder")
    assert u.scores == {"cross_encoder": 1.0, "cross_encoder_2": 2.0} and u.score == 2.0
    assert u.metadata == {}  # the user's metadata is never written
