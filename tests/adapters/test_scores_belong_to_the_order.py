"""A funnel whose stage is a framework object that reorders without writing a score (LangChain's
``CrossEncoderReranker`` and ``LongContextReorder``, LlamaIndex's ``LongContextReorder``) must
not leave the previous stage's scores on the new order: the score is dropped (``relevance_score``
absent, ``NodeWithScore.score`` ``None``), the earlier score stays in the history
(``funnel_score_<stage>``) and ``funnel_reordered_by`` names the stage. A stage that keeps the
order (a filter, a cut) keeps the scores."""

from __future__ import annotations

import pytest
from langchain_community.document_transformers import LongContextReorder as LCLongContextReorder
from llama_index.core.postprocessor import LongContextReorder as LILongContextReorder
from llama_index.core.postprocessor import SimilarityPostprocessor
from llama_index.core.schema import TextNode

from funnel_core import BM25Index, BM25Retrieve, Unit
from langchain_funnel.funnel import FunnelRetriever as LCFunnelRetriever
from langchain_funnel.retrievers import BM25Retriever as LCBM25Retriever
from llama_index_funnel.funnel import FunnelRetriever as LIFunnelRetriever
from tests.conftest import CORPUS

QUERY = "Paris capital city Shakespeare ranking documents vectors"


def _lc_bm25(k=6):
    from langchain_core.documents import Document

    return LCBM25Retriever.from_documents(
        [Document(id=i, page_content=t, metadata=dict(m)) for i, t, m in CORPUS], k=k)


def _check_lc(docs, stage):
    assert all("relevance_score" not in d.metadata for d in docs), [d.metadata for d in docs]
    assert all(d.metadata["funnel_reordered_by"] == stage for d in docs)
    assert all("funnel_score_bm25" in d.metadata for d in docs)  # history kept


def test_langchain_long_context_reorder_leaves_no_stale_score():
    bm25 = _lc_bm25()
    before = bm25.invoke(QUERY)
    assert len(before) >= 4
    docs = LCFunnelRetriever.from_stages(bm25, LCLongContextReorder(), k=None).invoke(QUERY)
    assert [d.id for d in docs] != [d.id for d in before]  # it did reorder
    _check_lc(docs, "LongContextReorder")


@pytest.mark.models
def test_langchain_cross_encoder_reranker_leaves_no_stale_score(tiny_cross_encoder_path):
    from langchain_classic.retrievers.document_compressors import CrossEncoderReranker
    from langchain_community.cross_encoders import HuggingFaceCrossEncoder

    bm25 = _lc_bm25(k=8)
    reranker = CrossEncoderReranker(model=HuggingFaceCrossEncoder(model_name=tiny_cross_encoder_path), top_n=4)
    before = [d.id for d in bm25.invoke(QUERY)]
    docs = LCFunnelRetriever.from_stages(bm25, reranker, k=4).invoke(QUERY)
    assert len(docs) == 4
    assert [d.id for d in docs] != before[:4]  # the reranker's order, not BM25's
    _check_lc(docs, "CrossEncoderReranker")


def test_a_filter_that_keeps_the_order_keeps_the_scores():
    from langchain_core.runnables import RunnableLambda

    bm25 = _lc_bm25()
    keep = RunnableLambda(lambda x: [d for d in x["documents"] if "Paris" in d.page_content])
    docs = LCFunnelRetriever.from_stages(bm25, keep, k=None).invoke(QUERY)
    scores = [d.metadata["relevance_score"] for d in docs]
    assert docs and scores == sorted(scores, reverse=True)
    assert not any("funnel_reordered_by" in d.metadata for d in docs)


def _li_bm25():
    return BM25Retrieve(BM25Index().index([Unit(id=i, text=t, metadata=dict(m)) for i, t, m in CORPUS]),
                        k=6)


def test_llamaindex_long_context_reorder_leaves_no_stale_score():
    nodes = [TextNode(id_=i, text=t, metadata=dict(m)) for i, t, m in CORPUS]
    before = LIFunnelRetriever([_li_bm25()], nodes=nodes).retrieve(QUERY)
    out = LIFunnelRetriever([_li_bm25(), LILongContextReorder()], nodes=nodes).retrieve(QUERY)
    assert [n.node.node_id for n in out] != [n.node.node_id for n in before]
    assert all(n.score is None for n in out)
    assert all(n.node.metadata["funnel_reordered_by"] == "LongContextReorder" for n in out)
    assert all("funnel_score_bm25" in n.node.metadata for n in out)
    # a filter keeps the order, and the scores
    kept = LIFunnelRetriever([_li_bm25(), SimilarityPostprocessor(similarity_cutoff=0.0)],
                             nodes=nodes).retrieve(QUERY)
    assert [n.score for n in kept] == [n.score for n in before]
