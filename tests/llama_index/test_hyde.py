"""HyDETransform inside LlamaIndex's own compositions: TransformRetriever over a VectorStoreIndex
retriever and over our DenseRetriever, HybridRetriever (hybrid with HyDE), TransformQueryEngine
and RetrieverQueryEngine. The vectors are word counts (a real ``BaseEmbedding`` over four words),
so the HyDE vector ``v = 1/(N+1) [f(q) + sum_k f(d_k)]`` and the similarities are worked by hand."""

from __future__ import annotations

from typing import Any, List

import numpy as np
import pytest
from llama_index.core import VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.base.llms.types import CompletionResponse, CompletionResponseGen, LLMMetadata
from llama_index.core.indices.query.query_transform import HyDEQueryTransform
from llama_index.core.llms import CustomLLM, MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine, TransformQueryEngine
from llama_index.core.retrievers import TransformRetriever
from llama_index.core.schema import TextNode

from funnel_core.best_practices import HyDE
from funnel_core.embeddings import DenseIndex
from funnel_core.testing import ScriptedLLM
from funnel_core.units import Unit
from llama_index_funnel import DenseRetriever
from llama_index_funnel.best_practices import HybridRetriever, HyDETransform
from llama_index_funnel.retrievers import BM25Retriever
from tests.best_practices.test_hyde import VOCAB, CountEmbedder

TEXTS = {"u1": "paris paris paris", "u2": "berlin", "u3": "hamlet", "u4": "bm25"}


class CountEmbedding(BaseEmbedding):
    """A LlamaIndex embedding model: the counts of four words (``f("paris") = [1, 0, 0, 0]``)."""

    def _vec(self, text: str) -> List[float]:
        return [float(v) for v in CountEmbedder().encode([text])[0]]

    def _get_query_embedding(self, query: str) -> List[float]:
        return self._vec(query)

    async def _aget_query_embedding(self, query: str) -> List[float]:
        return self._vec(query)

    def _get_text_embedding(self, text: str) -> List[float]:
        return self._vec(text)


class WriterLLM(CustomLLM):
    """A LlamaIndex LLM that always writes the same hypothetical document."""

    text: str = "hamlet hamlet"

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata()

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=self.text)

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        yield CompletionResponse(text=self.text, delta=self.text)


@pytest.fixture
def nodes():
    return [TextNode(id_=i, text=t) for i, t in TEXTS.items()]


def cos(a, b):
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_the_bundle_carries_the_hyde_vector_worked_by_hand():
    t = HyDETransform(ScriptedLLM(["berlin", "hamlet hamlet"]), embed_model=CountEmbedding(), n=2,
                      temperature=0.7)
    out = t.run("paris")
    # v = 1/3 ([1,0,0,0] + [0,1,0,0] + [0,0,2,0])
    assert out.embedding == pytest.approx([1 / 3, 1 / 3, 2 / 3, 0.0])
    assert out.query_str == "paris" and out.custom_embedding_strs == ["berlin", "hamlet hamlet"]
    assert t.hyde.n == 2
    with pytest.raises(TypeError, match="unknown argument"):
        HyDETransform(ScriptedLLM("x"), embed_model=CountEmbedding(), docs=2)


def test_with_a_vector_store_index_retriever(nodes):
    index = VectorStoreIndex(nodes, embed_model=CountEmbedding())
    hyde = HyDETransform(WriterLLM(), embed_model=CountEmbedding())  # a LlamaIndex LLM
    out = TransformRetriever(index.as_retriever(similarity_top_k=2), hyde).retrieve("paris")
    # v = 1/2 ([1,0,0,0] + [0,0,2,0]) = [1/2, 0, 1, 0]; the vector store ranks by cosine
    v = [0.5, 0, 1, 0]
    assert [n.node.node_id for n in out] == ["u3", "u1"]
    assert [n.score for n in out] == pytest.approx([cos(v, [0, 0, 1, 0]), cos(v, [3, 0, 0, 0])])


def test_our_dense_retriever_searches_with_the_bundles_vector(nodes):
    index = DenseIndex(CountEmbedder(), index="exact").index([Unit(id=n.node_id, text=n.text) for n in nodes])
    dense = DenseRetriever(index, nodes, similarity_top_k=2)
    hyde = HyDETransform(WriterLLM(), embed_model=CountEmbedding())
    out = TransformRetriever(dense, hyde).retrieve("paris")
    # inner product with v = [1/2, 0, 1, 0]: u1 = 3/2, u3 = 1 (embedding "paris" alone: u1 = 3, no u3)
    assert {n.node.node_id: n.score for n in out} == pytest.approx({"u1": 1.5, "u3": 1.0})
    # LlamaIndex's own HyDEQueryTransform: the mean of its embedding strings (document, query)
    own = TransformRetriever(dense, HyDEQueryTransform(llm=WriterLLM(), include_original=True))
    assert {n.node.node_id: n.score for n in own.retrieve("paris")} == pytest.approx({"u1": 1.5, "u3": 1.0})
    assert {n.node.node_id: n.score for n in dense.retrieve("paris")} == pytest.approx({"u1": 3.0, "u2": 0.0})


async def test_async_retrieval_uses_the_vector_too(nodes):
    index = DenseIndex(CountEmbedder(), index="exact").index([Unit(id=n.node_id, text=n.text) for n in nodes])
    dense = DenseRetriever(index, nodes, similarity_top_k=2)
    bundle = HyDETransform(WriterLLM(), embed_model=CountEmbedding()).run("paris")
    got = await dense.aretrieve(bundle)
    assert {n.node.node_id: n.score for n in got} == pytest.approx({"u1": 1.5, "u3": 1.0})


def test_hybrid_with_hyde_bm25_reads_the_query_and_the_dense_side_the_vector(nodes):
    bm25 = BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=4)
    vector = VectorStoreIndex(nodes, embed_model=CountEmbedding()).as_retriever(similarity_top_k=4)
    llm = ScriptedLLM("hamlet hamlet")  # a funnel_core LLM
    hyde = HyDETransform(HyDE(llm), embed_model=CountEmbedding())
    retriever = TransformRetriever(HybridRetriever(bm25, vector, similarity_top_k=4), hyde)
    out = retriever.retrieve("paris")
    by_id = {n.node.node_id: n for n in out}
    # BM25 over "paris" finds u1 only; the dense side (cosine with v = [1/2, 0, 1, 0]) ranks u3 first
    assert by_id["u1"].node.metadata["funnel_sparse_rank"] == 0
    assert by_id["u3"].node.metadata["funnel_sparse_rank"] is None
    assert by_id["u3"].node.metadata["funnel_dense_rank"] == 0
    # fused by hand (S_h = 0.3 S_sparse + S_dense, min-max): dense cosines u3 0.894, u1 0.447, u2 0,
    # u4 0 -> 1, 1/2, 0, 0; BM25 returned u1 alone (-> 1; a unit it missed gets its floor, 1)
    sparse = bm25.retrieve("paris")
    assert [n.node.node_id for n in sparse] == ["u1"]
    assert by_id["u3"].score == pytest.approx(0.3 * 1 + 1.0)
    assert by_id["u1"].score == pytest.approx(0.3 * 1 + 0.5)
    assert [n.node.node_id for n in out][:2] == ["u3", "u1"]
    assert llm.calls[0]["prompts"][0].endswith("Question: paris\nPassage:")


def test_in_a_query_engine(nodes):
    vector = VectorStoreIndex(nodes, embed_model=CountEmbedding()).as_retriever(similarity_top_k=1)
    engine = TransformQueryEngine(RetrieverQueryEngine.from_args(vector, llm=MockLLM()),
                                  query_transform=HyDETransform(WriterLLM(), embed_model=CountEmbedding()))
    resp = engine.query("paris")
    assert [n.node.node_id for n in resp.source_nodes] == ["u3"]
    assert VOCAB[2] in resp.source_nodes[0].node.get_content()
