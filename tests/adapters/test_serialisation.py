"""From_dict round trips, pickle/deepcopy, framework-neutral query errors,
chunk ids that differ between contexts."""

from __future__ import annotations

import copy
import pickle

import pytest
from langchain_core.documents import Document
from langchain_core.language_models.fake import FakeListLLM
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from langchain_funnel import BM25Retriever as LCBM25
from langchain_funnel import ClusteredBM25Retriever as LCClustered
from langchain_funnel import CrossEncoderReranker
from langchain_funnel import ForwardLookupRetriever as LCForward
from llama_index_funnel import BM25Retriever, ClusteredBM25Retriever, CrossEncoderRerank, RankRAGRerank
from llama_index_funnel.fbrag import ForwardLookupRetriever
from tests.adapters.test_llm_stages import JudgeLLM
from tests.conftest import CORPUS

Q = "Paris capital of France"


def test_llamaindex_from_dict_round_trips(tiny_cross_encoder_path, tiny_llama_path):
    rr = CrossEncoderRerank(model=tiny_cross_encoder_path, top_n=2, normalize=True)
    back = CrossEncoderRerank.from_dict(rr.to_dict())
    assert back.stage.to_dict() == rr.stage.to_dict() and back.top_n == 2
    local = RankRAGRerank(llm=tiny_llama_path, top_n=3, batch_size=2)
    assert RankRAGRerank.from_dict(local.to_dict()).stage.to_dict() == local.stage.to_dict()
    judged = RankRAGRerank(llm=JudgeLLM(), top_n=1)
    with pytest.raises(TypeError, match="llm"):  # at from_dict, not at first use
        RankRAGRerank.from_dict(judged.to_dict())
    again = RankRAGRerank.from_dict(judged.to_dict(), llm=JudgeLLM())
    nodes = [NodeWithScore(node=TextNode(id_=i, text=t)) for i, t, _ in CORPUS[:3]]
    assert [n.node.node_id for n in again.postprocess_nodes(nodes, QueryBundle(Q))] == ["d0"]


def test_langchain_round_trip(tiny_cross_encoder_path):
    rr = CrossEncoderReranker(model=tiny_cross_encoder_path, top_n=2)
    back = CrossEncoderReranker.model_validate(rr.model_dump())
    assert back.stage.to_dict() == rr.stage.to_dict() and back.top_n == 2


def test_bm25_retrievers_pickle_and_deepcopy(source_linked_nodes):
    docs = [Document(id=i, page_content=t, metadata=m) for i, t, m in CORPUS]
    objs = [BM25Retriever.from_defaults(nodes=source_linked_nodes, similarity_top_k=3),
            ClusteredBM25Retriever.from_defaults(nodes=source_linked_nodes, similarity_top_k=3,
                                                 max_tokens=40, knn_k=3, knn_threshold=0.05),
            LCBM25.from_documents(docs, k=3),
            LCClustered.from_documents(docs, k=3, max_tokens=40, knn_k=3, knn_threshold=0.05)]
    for r in objs:
        before = _ids(r)
        for clone in (pickle.loads(pickle.dumps(r)), copy.deepcopy(r)):
            assert _ids(clone) == before


def _ids(r):
    if hasattr(r, "retrieve"):
        return [n.node.node_id for n in r.retrieve(Q)]
    return [d.id for d in r.invoke(Q)]


def test_query_type_error_is_framework_neutral():
    r = LCBM25.from_documents([Document(id="a", page_content="ranking documents with BM25")])
    with pytest.raises(TypeError) as err:
        r.invoke(42)
    assert "retrieve(" not in str(err.value) and "str" in str(err.value)


def test_forward_lookup_chunk_ids_differ_between_contexts():
    a = ForwardLookupRetriever(JudgeLLM(), context="Paris is the capital of France. " * 5,
                               chunk_words=5)
    b = ForwardLookupRetriever(JudgeLLM(), context="Berlin is the capital of Germany. " * 5,
                               chunk_words=5)
    assert not {u.id for u in a.units} & {u.id for u in b.units}
    c = LCForward(llm=FakeListLLM(responses=["Answer: Berlin"] * 10),
                  context="Berlin is the capital of Germany. " * 5, chunk_words=5, k=2)
    d = LCForward(llm=FakeListLLM(responses=["Answer: Paris"] * 10),
                  context="Paris is the capital of France. " * 5, chunk_words=5, k=2)
    assert not {x.id for x in c.invoke("capital")} & {x.id for x in d.invoke("capital")}
