"""RankRAG and FB-RAG inside LlamaIndex and LangChain, with all three providers.

Providers: a local causal LM (tiny random Llama) and the frameworks' own fake models
(LlamaIndex ``MockLLM``, LangChain fake chat models / LLMs) — fakes of the *provider*; the
reranker, transform and retrievers under test are the real ones.
"""

import json
from typing import Any, List

import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.language_models.fake_chat_models import FakeListChatModel, GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.retrievers import BaseRetriever as LCBaseRetriever
from langchain_core.runnables import RunnableLambda
from langchain_tests.integration_tests import RetrieversIntegrationTests
from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.base.llms.types import CompletionResponse
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
from llama_index.core.llms import MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine, TransformQueryEngine
from llama_index.core.retrievers import TransformRetriever
from llama_index.core.schema import NodeWithScore, TextNode

from funnel_core.llm import LLMError
from funnel_core.rerank.rankrag import RANKRAG_PROMPTS, conversation_query
from langchain_funnel.fbrag import ForwardLookupRetriever as LCForwardLookupRetriever
from langchain_funnel.funnel import rerank_chain
from langchain_funnel.llm import LangChainLLM, message_text
from langchain_funnel.rankrag import RankRAGReranker
from llama_index_funnel.fbrag import ForwardLookupQueryBundle, ForwardLookupQueryTransform, ForwardLookupRetriever
from llama_index_funnel.llm import LlamaIndexLLM
from llama_index_funnel.rankrag import RankRAGRerank
from tests.conftest import CORPUS

LONG_CONTEXT = "\n\n".join(t for _, t, _ in CORPUS) + "\n\n" + " ".join(
    f"Filler sentence number {i} talks about rivers and bread." for i in range(20))
MARLOWE = ("Rationale: Hamlet is a tragedy written by William Shakespeare around 1600. "
           "Answer: William Shakespeare")


class JudgeLLM(MockLLM):
    """A LlamaIndex LLM (provider fake): chatty True for passages about Paris, else False."""

    calls: int = 0

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self.calls += 1
        if "For the question" in prompt:
            passage = prompt.split("For the question")[0]
            text = "Well... True!" if "Paris" in passage else "I would say false, sorry."
        else:
            text = MARLOWE
        return CompletionResponse(text=text)

    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return self.complete(prompt)


class FailingLLM(MockLLM):
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        raise ConnectionError("provider down")


@pytest.fixture()
def nodes():
    return [NodeWithScore(node=TextNode(id_=i, text=t, metadata=dict(m)), score=1.0)
            for i, t, m in CORPUS]


@pytest.fixture()
def vector_retriever():
    Settings.embed_model = MockEmbedding(embed_dim=8)
    index = VectorStoreIndex([TextNode(id_=i, text=t, metadata=dict(m)) for i, t, m in CORPUS])
    return index.as_retriever(similarity_top_k=8)


# -- providers -------------------------------------------------------------------------------
def test_llama_index_provider_completion_and_chat():
    llm = LlamaIndexLLM(MockLLM())
    assert llm.generate(["echo me"], n=2) == [["echo me", "echo me"]]
    chat = LlamaIndexLLM(MockLLM(is_chat_model=True))
    assert "echo me" in chat.generate(["echo me"])[0][0]
    with pytest.raises(LLMError, match="ConnectionError: provider down"):
        LlamaIndexLLM(FailingLLM()).generate(["x"])
    with pytest.raises(TypeError, match="wraps a llama_index LLM"):
        LlamaIndexLLM("gpt")


async def test_llama_index_provider_async():
    assert await LlamaIndexLLM(MockLLM()).agenerate(["a", "b"], n=2) == [["a", "a"], ["b", "b"]]


def test_langchain_provider_chat_llm_and_content_blocks():
    chat = LangChainLLM(FakeListChatModel(responses=["one", "two", "three"]), max_concurrency=1)
    assert chat.generate(["p1", "p2"], n=1) + chat.generate(["p3"]) == [["one"], ["two"], ["three"]]
    plain = LangChainLLM(FakeListLLM(responses=["x", "y"]), max_concurrency=1)
    assert plain.generate(["a"], n=2) == [["x", "y"]]
    blocks = AIMessage(content=[{"type": "text", "text": "Tr"}, {"type": "text", "text": "ue"}])
    assert message_text(blocks) == "True"
    generic = LangChainLLM(GenericFakeChatModel(messages=iter([AIMessage(content="hi")])))
    assert generic.generate(["q"]) == [["hi"]]
    with pytest.raises(TypeError, match="LangChain chat model or LLM"):
        LangChainLLM(object())


# -- LlamaIndex ------------------------------------------------------------------------------
class _Events(BaseEventHandler):
    events: List[str] = []

    @classmethod
    def class_name(cls) -> str:
        return "_Events"

    def handle(self, event, **kwargs) -> None:
        if isinstance(event, (ReRankStartEvent, ReRankEndEvent)):
            self.events.append(type(event).__name__)


def test_rankrag_rerank_in_query_engine_with_local_model(tiny_llama_path, vector_retriever):
    handler = _Events(events=[])
    root = get_dispatcher()
    root.add_event_handler(handler)
    try:
        rerank = RankRAGRerank(llm=tiny_llama_path, top_n=3, batch_size=4)
        engine = RetrieverQueryEngine.from_args(vector_retriever, llm=MockLLM(),
                                                node_postprocessors=[rerank])
        response = engine.query("Who wrote Hamlet?")
    finally:
        root.event_handlers.remove(handler)
    assert len(response.source_nodes) == 3
    scores = [n.score for n in response.source_nodes]
    assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
    assert all("funnel_score_rankrag" in n.node.metadata for n in response.source_nodes)
    assert "funnel_score_rankrag" in response.source_nodes[0].node.excluded_llm_metadata_keys
    assert handler.events == ["ReRankStartEvent", "ReRankEndEvent"]
    assert rerank.stage.uses_logprobs and RankRAGRerank.class_name() == "RankRAGRerank"


async def test_rankrag_rerank_with_llama_index_llm_sync_and_async(nodes):
    rerank = RankRAGRerank(llm=JudgeLLM(), top_n=2)
    out = rerank.postprocess_nodes(nodes, query_str="What is the capital of France?")
    assert [n.node.node_id for n in out] == ["d0", "d2"] and out[0].score == 1.0
    assert not rerank.stage.uses_logprobs
    aout = await rerank.apostprocess_nodes(nodes, query_str="What is the capital of France?")
    assert [n.node.node_id for n in aout] == ["d0", "d2"]
    assert nodes[0].node.metadata.get("scores") is None          # input nodes untouched
    echo = RankRAGRerank(llm=MockLLM(), top_n=8)                  # echoes the prompt: still no crash
    assert len(echo.postprocess_nodes(nodes, query_str="anything")) == 8


def test_rankrag_rerank_bad_input(nodes):
    with pytest.raises(ValueError, match=r"missing \{passage\}"):
        RankRAGRerank(llm=MockLLM(), prompt="{question} only")
    with pytest.raises(ValueError, match="top_n must be >= 1"):
        RankRAGRerank(llm=MockLLM(), top_n=0)
    with pytest.raises(LLMError, match="provider down"):
        RankRAGRerank(llm=FailingLLM()).postprocess_nodes(nodes, query_str="q")


class RecordingJudgeLLM(MockLLM):
    """A LlamaIndex LLM that keeps the prompts it was sent: True for a passage about Paris."""

    prompts: list = []

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self.prompts.append(prompt)
        passage = prompt.split("Passage: ")[1].split("\n\n")[0]
        return CompletionResponse(text="True." if "Paris" in passage else "False.")


def test_rankrag_rerank_takes_the_fever_and_conversational_presets(nodes):
    """The named Appendix D.1 prompts reach the LLM through ``prompt=`` like any other."""
    fever = RankRAGRerank(llm=RecordingJudgeLLM(), prompt=RANKRAG_PROMPTS["fever"], top_n=2)
    out = fever.postprocess_nodes(nodes, query_str="Paris is the capital of France.")
    assert [n.node.node_id for n in out] == ["d0", "d2"]
    assert all("User: For the claim Paris is the capital of France., access whether the passage is "
               "relevant to the claim." in p for p in fever.llm.prompts)
    talk = RankRAGRerank(llm=RecordingJudgeLLM(), prompt=RANKRAG_PROMPTS["conversational"],
                         top_n=2)
    query = conversation_query([("Which country is it?", "France.")], "What is its capital?")
    assert [n.node.node_id for n in talk.postprocess_nodes(nodes, query_str=query)] == ["d0", "d2"]
    assert all("User: Which country is it?\n\nAssistant: France.\n\nUser: For the question What is "
               "its capital?, access whether" in p for p in talk.llm.prompts)


def test_forward_lookup_transform_attaches_samples_and_feeds_retrievers(vector_retriever):
    judge = JudgeLLM()
    transform = ForwardLookupQueryTransform(judge, context=LONG_CONTEXT, samples=3, chunk_words=30)
    bundle = transform.run("Who wrote Hamlet?")
    assert isinstance(bundle, ForwardLookupQueryBundle) and len(bundle.samples) == 3
    assert bundle.samples[0].answer == "William Shakespeare"
    assert bundle.custom_embedding_strs[0] == "Who wrote Hamlet?"
    assert "William Shakespeare" in bundle.custom_embedding_strs[1]
    assert "Hamlet" in bundle.reader_context
    # in a TransformRetriever in front of the FB-RAG retriever: samples are reused, not redrawn
    fb = ForwardLookupRetriever(judge, context=LONG_CONTEXT, variant="F", k=2, chunk_words=30)
    calls = judge.calls
    nodes = TransformRetriever(fb, transform).retrieve("Who wrote Hamlet?")
    assert judge.calls == calls + 3
    assert any("Shakespeare" in n.node.get_content() for n in nodes)
    assert json.loads(nodes[0].node.metadata["funnel_samples_json"])[0]["answer"] == "William Shakespeare"
    # in front of an embedding retriever, inside a TransformQueryEngine
    engine = TransformQueryEngine(RetrieverQueryEngine.from_args(vector_retriever, llm=MockLLM()),
                                  query_transform=ForwardLookupQueryTransform(judge, samples=2))
    assert len(engine.query("Who wrote Hamlet?").source_nodes) == 8


async def test_forward_lookup_retriever_llama_index(vector_retriever):
    fb = ForwardLookupRetriever(JudgeLLM(), context=LONG_CONTEXT, variant="FB", k=3, chunk_words=30)
    engine = RetrieverQueryEngine.from_args(fb, llm=MockLLM())
    nodes = engine.query("Who wrote the tragedy?").source_nodes
    assert len(nodes) == 3
    positions = [n.node.metadata["funnel_position"] for n in nodes]
    assert positions == sorted(positions)
    meta = nodes[0].node.metadata
    assert {"funnel_backward_score", "funnel_forward_scores_json", "funnel_samples_json"} <= set(meta)
    assert "funnel_samples_json" in nodes[0].node.excluded_llm_metadata_keys
    over_base = ForwardLookupRetriever(JudgeLLM(), retriever=vector_retriever, variant="F", k=1)
    best = over_base.retrieve("Who wrote the tragedy?")
    assert best[0].node.node_id == "d5"     # the Hamlet node, via the forward lookup
    abest = await over_base.aretrieve("Who wrote the tragedy?")
    assert abest[0].node.node_id == "d5"
    assert fb.retrieve("   ") == []


def test_forward_lookup_retriever_llama_index_bad_input():
    with pytest.raises(ValueError, match="exactly one of context"):
        ForwardLookupRetriever(JudgeLLM())
    with pytest.raises(ValueError, match="context is empty"):
        ForwardLookupRetriever(JudgeLLM(), context="  ")
    with pytest.raises(ValueError, match="samples \\(K"):
        ForwardLookupRetriever(JudgeLLM(), context=LONG_CONTEXT, samples=0)
    with pytest.raises(ValueError, match="smaller than one chunk"):
        ForwardLookupRetriever(JudgeLLM(), context=LONG_CONTEXT, budget_words=10)
    with pytest.raises(ValueError, match="unknown FB-RAG variant"):
        ForwardLookupRetriever(JudgeLLM(), context=LONG_CONTEXT, variant="Z")


# -- LangChain -------------------------------------------------------------------------------
class ListRetriever(LCBaseRetriever):
    docs: list

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                **kwargs) -> list:
        return list(self.docs)


@pytest.fixture()
def lc_docs():
    return [Document(id=i, page_content=t, metadata=dict(m)) for i, t, m in CORPUS]


def test_rankrag_reranker_langchain_chain_with_chat_model(lc_docs):
    replies = ["Yes! True." if "Paris" in t else "Nope, False." for _, t, _ in CORPUS]
    model = LangChainLLM(FakeListChatModel(responses=replies), max_concurrency=1)
    reranker = RankRAGReranker(llm=model, top_n=2, batch_size=8)
    chain = rerank_chain(ListRetriever(docs=lc_docs), reranker)
    out = chain.invoke("What is the capital of France?")
    assert [d.id for d in out] == ["d0", "d2"] and out[0].metadata["relevance_score"] == 1.0
    assert out[0].metadata["funnel_score_rankrag"] == 1.0


async def test_rankrag_reranker_langchain_local_model_and_async(tiny_llama_path, lc_docs):
    reranker = RankRAGReranker(llm=tiny_llama_path, top_n=3)
    out = reranker.compress_documents(lc_docs, "Who wrote Hamlet?")
    assert len(out) == 3 and all(0 < d.metadata["relevance_score"] < 1 for d in out)
    aout = await reranker.acompress_documents(lc_docs, "Who wrote Hamlet?")
    assert [d.id for d in aout] == [d.id for d in out]
    assert reranker.compress_documents(lc_docs, "  ") == lc_docs[:3]  # top_n caps even then
    with pytest.raises(ValueError, match=r"unknown \{doc\}"):
        RankRAGReranker(llm=tiny_llama_path, prompt="{question}{passage}{doc}")


class RecordingChatModel(FakeListChatModel):
    """A fake chat model that keeps the text of the prompts it was sent."""

    seen: list = []

    def _call(self, messages, *args: Any, **kwargs: Any) -> str:
        self.seen.append(" ".join(message_text(m) for m in messages))
        return super()._call(messages, *args, **kwargs)


def test_rankrag_reranker_langchain_takes_the_fever_and_conversational_presets(lc_docs):
    replies = ["Yes! True." if "Paris" in t else "Nope, False." for _, t, _ in CORPUS]
    for preset, query, expected in [
            ("fever", "Paris is the capital of France.",
             "User: For the claim Paris is the capital of France., access whether the passage is "
             "relevant to the claim."),
            ("conversational", conversation_query([("Which country is it?", "France.")],
                                                  "What is its capital?"),
             "User: Which country is it?\n\nAssistant: France.\n\nUser: For the question What is "
             "its capital?, access whether")]:
        chat = RecordingChatModel(responses=replies, seen=[])
        reranker = RankRAGReranker(llm=LangChainLLM(chat, max_concurrency=1), top_n=2,
                                   prompt=RANKRAG_PROMPTS[preset])
        out = reranker.compress_documents(lc_docs, query)
        assert [d.id for d in out] == ["d0", "d2"]
        assert len(chat.seen) == len(lc_docs) and all(expected in p for p in chat.seen)


def test_forward_lookup_retriever_langchain(lc_docs):
    chat = FakeListChatModel(responses=[MARLOWE])
    retriever = LCForwardLookupRetriever(llm=chat, context=LONG_CONTEXT, variant="F", k=2,
                                         chunk_words=30, samples=2)
    docs = retriever.invoke("Who wrote the tragedy?")
    assert len(docs) == 2 and any("Shakespeare" in d.page_content for d in docs)
    assert len(json.loads(docs[0].metadata["funnel_forward_scores_json"])) == 2
    assert isinstance(docs[0].metadata["funnel_backward_score"], float)
    assert len(retriever.invoke("Who wrote the tragedy?", k=1)) == 1
    fmt = RunnableLambda(lambda ds: "\n".join(d.page_content for d in ds))
    assert "Shakespeare" in (retriever | fmt).invoke("Who wrote the tragedy?")
    over_base = LCForwardLookupRetriever(llm=chat, retriever=ListRetriever(docs=lc_docs), k=1,
                                         variant="F")
    assert over_base.invoke("Who wrote the tragedy?")[0].id == "d5"
    with pytest.raises(ValueError, match="exactly one of context"):
        LCForwardLookupRetriever(llm=chat)
    with pytest.raises(ValueError, match="k must be >= 1"):
        LCForwardLookupRetriever(llm=chat, context=LONG_CONTEXT, k=0)
    failing = LCForwardLookupRetriever(llm=FakeListLLM(responses=[]), context=LONG_CONTEXT)
    with pytest.raises(LLMError):
        failing.invoke("who?")


class TestForwardLookupRetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self):
        return LCForwardLookupRetriever

    @property
    def retriever_constructor_params(self) -> dict:
        return {"llm": FakeListChatModel(responses=[MARLOWE]), "context": LONG_CONTEXT,
                "chunk_words": 20, "samples": 2}

    @property
    def retriever_query_example(self) -> str:
        return "Who wrote the tragedy Hamlet?"
