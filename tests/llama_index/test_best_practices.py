"""LlamaIndex adapters of the best-practice components, inside LlamaIndex compositions:
VectorStoreIndex + our BM25 -> HybridRetriever (with HyDEQueryTransform) -> RetrieverQueryEngine
with ExtractiveCompressorPostprocessor and RepackPostprocessor; QueryClassifierGate."""

from typing import Any, List

import pytest
from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.base.llms.types import CompletionResponse, CompletionResponseGen, LLMMetadata
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.indices.query.query_transform import HyDEQueryTransform
from llama_index.core.llms import CustomLLM, MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.retrievers import TransformRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from funnel_core.best_practices.classify import NotFittedError, QueryClassifier
from funnel_core.bm25 import BM25Index
from funnel_core.embeddings import SentenceEmbedder
from llama_index_funnel._base import UnitRetriever, nodes_to_units
from llama_index_funnel.best_practices import (
    ExtractiveCompressorPostprocessor,
    HybridRetriever,
    QueryClassifierGate,
    QueryClassifierQueryEngine,
    RepackPostprocessor,
    SentenceEmbedderEmbedding,
)

pytestmark = pytest.mark.models  # builds or loads a model in most tests

Settings.embed_model = MockEmbedding(embed_dim=8)
HYPOTHETICAL_DOC = "Hamlet is a tragedy by the English playwright William Shakespeare."


class BM25NodeRetriever(UnitRetriever):
    """Our BM25 as a LlamaIndex retriever (records the bundles it receives)."""

    def __init__(self, nodes: List[TextNode], k: int = 5) -> None:
        self._nodes, self._k, self.seen = nodes, k, []
        self._index = BM25Index().index(nodes_to_units(nodes))
        super().__init__()

    def _retrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        self.seen.append(query_bundle)
        return super()._retrieve(query_bundle)

    def _search(self, query: str):
        return self._index.search(query, k=self._k)

    def _originals(self):
        return self._nodes


class RecordingEmbedding(SentenceEmbedderEmbedding):
    """The real MiniLM adapter, remembering which query strings it embedded."""

    def _get_query_embedding(self, query: str):
        self.__dict__.setdefault("_queries", []).append(query)
        return super()._get_query_embedding(query)


class FixedLLM(CustomLLM):
    """A deterministic 'LLM' that always writes the same hypothetical document."""

    text: str = HYPOTHETICAL_DOC

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata()

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=self.text)

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        yield CompletionResponse(text=self.text, delta=self.text)


@pytest.fixture(scope="module")
def embedder():
    return SentenceEmbedder()


@pytest.fixture(scope="module")
def nodes(corpus_units):
    return [TextNode(id_=u.id, text=u.text, metadata=dict(u.metadata)) for u in corpus_units]


@pytest.fixture(scope="module")
def embed_model(embedder):
    return RecordingEmbedding(embedder=embedder)


@pytest.fixture(scope="module")
def vector_index(nodes, embed_model):
    return VectorStoreIndex(nodes, embed_model=embed_model)


@pytest.fixture(scope="module")
def classifier(embedder):
    return QueryClassifier.pretrained(embedder=embedder)


def hybrid(nodes, vector_index, **kw):
    bm25 = BM25NodeRetriever(nodes)
    dense = vector_index.as_retriever(similarity_top_k=5)
    return HybridRetriever(bm25, dense, **kw), bm25


def test_embedding_adapter_is_real_minilm(embed_model):
    a, b, c = embed_model.get_text_embedding_batch(
        ["Paris is in France.", "France's capital is Paris.", "Bananas are yellow."])
    assert len(a) == 384
    dot = lambda x, y: sum(i * j for i, j in zip(x, y))  # noqa: E731
    assert dot(a, b) > dot(a, c) + 0.2


def test_hybrid_retriever_fuses_vector_index_and_bm25(nodes, vector_index):
    retriever, _ = hybrid(nodes, vector_index, similarity_top_k=3)
    out = retriever.retrieve("Which tragedy did Shakespeare write?")
    assert len(out) == 3 and out[0].node.node_id in {"d5", "d6"}
    assert all(a.score >= b.score for a, b in zip(out, out[1:]))
    meta = out[0].node.metadata
    assert {"funnel_score_hybrid", "funnel_sparse_score", "funnel_dense_score"} <= set(meta)
    assert out[0].node.metadata["title"] in {"Hamlet", "Shakespeare"}  # original node metadata kept
    assert "funnel_score_hybrid" in out[0].node.excluded_llm_metadata_keys
    rrf, _ = hybrid(nodes, vector_index, method="rrf", similarity_top_k=2)
    assert rrf.retrieve("Eiffel Tower in Paris")[0].node.node_id == "d2"


async def test_hybrid_retriever_async_matches_sync(nodes, vector_index):
    retriever, _ = hybrid(nodes, vector_index)
    sync = retriever.retrieve("capital of Germany")
    got = await retriever.aretrieve("capital of Germany")
    assert [n.node.node_id for n in got] == [n.node.node_id for n in sync]
    assert [n.score for n in got] == pytest.approx([n.score for n in sync])


def test_hyde_document_feeds_dense_side_and_query_feeds_sparse_side(nodes, vector_index, embed_model):
    retriever, bm25 = hybrid(nodes, vector_index, similarity_top_k=3)
    hyde = HyDEQueryTransform(llm=FixedLLM(), include_original=False)
    embed_model.__dict__["_queries"] = []
    out = TransformRetriever(retriever, hyde).retrieve("who is the author of the Danish prince play?")
    assert embed_model.__dict__["_queries"] == [HYPOTHETICAL_DOC]
    assert bm25.seen[-1].query_str == "who is the author of the Danish prince play?"
    assert bm25.seen[-1].custom_embedding_strs is None
    # BM25 alone finds nothing here; the hypothetical document brings in Hamlet/Shakespeare
    assert BM25NodeRetriever(nodes).retrieve("who is the author of the Danish prince play?") == []
    assert out[0].node.node_id in {"d5", "d6"}


def test_query_engine_with_compressor_and_repack(nodes, vector_index, embedder):
    retriever, _ = hybrid(nodes, vector_index, similarity_top_k=4)
    compressor = ExtractiveCompressorPostprocessor(embedder=embedder, ratio=0.5)
    assert compressor.stage.embedder is embedder  # the shared model, not a second copy
    engine = RetrieverQueryEngine.from_args(
        retriever, llm=MockLLM(),
        node_postprocessors=[compressor, RepackPostprocessor(order="reverse")])
    resp = engine.query("Who wrote Hamlet?")
    src = resp.source_nodes
    assert 1 <= len(src) <= 4
    assert src[-1].node.metadata["funnel_retrieval_rank"] == 0  # best last, next to the question
    total_in = sum(n.node.metadata["funnel_compression_original_tokens"] for n in src)
    assert all("funnel_compression_kept_tokens" in n.node.metadata for n in src)
    assert any("Hamlet" in n.node.get_content() for n in src) and total_in > 0


async def test_postprocessors_async_and_orders(nodes):
    nws = [NodeWithScore(node=n, score=10.0 - i) for i, n in enumerate(nodes[:5])]
    sides = await RepackPostprocessor(order="sides").apostprocess_nodes(nws, query_str="q")
    assert [n.node.node_id for n in sides] == ["d0", "d2", "d4", "d3", "d1"]
    fwd = RepackPostprocessor(order="forward").postprocess_nodes(nws, query_str="q")
    assert [n.node.node_id for n in fwd] == ["d0", "d1", "d2", "d3", "d4"]
    comp = ExtractiveCompressorPostprocessor(method="bm25", ratio=0.3)
    out = await comp.apostprocess_nodes(nws, query_str="Eiffel Tower Paris")
    assert "Eiffel Tower" in " ".join(n.node.get_content() for n in out)
    assert sum(len(n.node.get_content().split()) for n in out) <= 0.3 * sum(
        len(n.node.get_content().split()) for n in nws)
    assert nws[2].node.metadata.get("compression") is None  # inputs untouched
    assert RepackPostprocessor.class_name() == "RepackPostprocessor"


def test_postprocessor_bad_input():
    with pytest.raises(ValueError, match="unknown repack order 'middle'"):
        RepackPostprocessor(order="middle")
    with pytest.raises(ValueError, match=r"ratio must be in \(0, 1\]"):
        ExtractiveCompressorPostprocessor(ratio=0)
    with pytest.raises(ValueError, match="unknown compression method"):
        ExtractiveCompressorPostprocessor(method="llm")


def test_hybrid_retriever_bad_input(nodes, vector_index):
    bm25 = BM25NodeRetriever(nodes)
    dense = vector_index.as_retriever()
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\]"):
        HybridRetriever(bm25, dense, alpha=-0.1)
    with pytest.raises(ValueError, match="similarity_top_k must be >= 1"):
        HybridRetriever(bm25, dense, similarity_top_k=0)
    with pytest.raises(TypeError, match="dense_retriever must be a LlamaIndex BaseRetriever"):
        HybridRetriever(bm25, "dense")
    assert HybridRetriever(bm25, dense).retrieve("  ") == []


def test_query_classifier_gate_in_query_engine(nodes, vector_index, classifier):
    retriever, _ = hybrid(nodes, vector_index, similarity_top_k=3)
    gate = QueryClassifierGate(retriever, classifier)
    engine = RetrieverQueryEngine.from_args(gate, llm=MockLLM())
    resp = engine.query("Who wrote the tragedy Hamlet?")
    assert gate.last_decision["needs_retrieval"] is True and resp.source_nodes
    resp = engine.query("Translate into Spanish: 'Shakespeare wrote Hamlet.'")
    assert gate.last_decision["needs_retrieval"] is False and resp.source_nodes == []
    with pytest.raises(NotFittedError):
        QueryClassifierGate(retriever, QueryClassifier())


async def test_query_classifier_query_engine_routes(nodes, vector_index, classifier):
    retriever, _ = hybrid(nodes, vector_index, similarity_top_k=3)
    rag = RetrieverQueryEngine.from_args(retriever, llm=MockLLM())
    engine = QueryClassifierQueryEngine(query_engine=rag, llm=FixedLLM(text="direct"),
                                        classifier=classifier)
    r1 = engine.query("Who wrote the tragedy Hamlet?")
    assert r1.metadata["needs_retrieval"] is True and r1.source_nodes
    r2 = await engine.aquery("What is 12 times 12?")
    assert r2.metadata["needs_retrieval"] is False and str(r2) == "direct"
