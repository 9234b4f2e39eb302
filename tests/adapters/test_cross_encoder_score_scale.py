"""The cross-encoder adapters score on the scale the frameworks' own cross-encoder rerankers use:
a sigmoid probability in (0, 1) by default (LlamaIndex's ``SentenceTransformerRerank``,
LangChain's ``HuggingFaceCrossEncoder``), so a ``SimilarityPostprocessor(similarity_cutoff=0.5)``
after ours keeps the pairs the model calls relevant; ``normalize=False`` gives the raw logits.
The core ``CrossEncoderScorer`` keeps raw logits by default (research code: distillation and
score fusion read them)."""

from __future__ import annotations

import math

import pytest
from langchain_core.documents import Document
from llama_index.core.postprocessor import SentenceTransformerRerank, SimilarityPostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from funnel_core.rerank.cross_encoder import CrossEncoderScorer
from langchain_funnel import CrossEncoderReranker
from llama_index_funnel import CrossEncoderRerank
from tests.conftest import CORPUS

pytestmark = pytest.mark.models

QUERY = "Who wrote Hamlet?"


def _nodes():
    return [NodeWithScore(node=TextNode(id_=i, text=t), score=1.0) for i, t, _ in CORPUS]


def test_llamaindex_scores_match_sentence_transformer_rerank(tiny_cross_encoder_path):
    ours = CrossEncoderRerank(model=tiny_cross_encoder_path, device="cpu", runtime="torch",
                              dtype="float32")
    theirs = SentenceTransformerRerank(model=tiny_cross_encoder_path, top_n=len(CORPUS), device="cpu")
    got = {n.node.node_id: n.score for n in ours.postprocess_nodes(_nodes(), QueryBundle(QUERY))}
    want = {n.node.node_id: n.score for n in theirs.postprocess_nodes(_nodes(), QueryBundle(QUERY))}
    assert got.keys() == want.keys()
    assert all(0.0 < s < 1.0 for s in got.values())
    assert all(math.isclose(got[i], want[i], abs_tol=1e-4) for i in got), (got, want)


def test_a_similarity_cutoff_after_ours_keeps_what_the_model_calls_relevant(tiny_cross_encoder_path):
    raw = CrossEncoderScorer(tiny_cross_encoder_path, device="cpu", runtime="torch", dtype="float32")
    logits = dict(zip([i for i, _, _ in CORPUS], raw.score(QUERY, [t for _, t, _ in CORPUS])))
    ours = CrossEncoderRerank(model=tiny_cross_encoder_path, device="cpu", runtime="torch",
                              dtype="float32")
    cut = SimilarityPostprocessor(similarity_cutoff=0.5)
    kept = cut.postprocess_nodes(ours.postprocess_nodes(_nodes(), QueryBundle(QUERY)))
    assert {n.node.node_id for n in kept} == {i for i, s in logits.items() if s >= 0.0}
    # the raw scale on request, and in the core
    raw_adapter = CrossEncoderRerank(model=tiny_cross_encoder_path, device="cpu", runtime="torch",
                                     dtype="float32", normalize=False)
    scores = {n.node.node_id: n.score for n in raw_adapter.postprocess_nodes(_nodes(), QueryBundle(QUERY))}
    assert all(math.isclose(scores[i], logits[i], abs_tol=1e-4) for i in logits)
    assert CrossEncoderScorer(tiny_cross_encoder_path).normalize is False


def test_langchain_scores_match_hugging_face_cross_encoder(tiny_cross_encoder_path):
    from langchain_community.cross_encoders import HuggingFaceCrossEncoder

    ours = CrossEncoderReranker(model=tiny_cross_encoder_path, device="cpu", runtime="torch",
                                dtype="float32")
    docs = [Document(id=i, page_content=t) for i, t, _ in CORPUS]
    got = {d.id: d.metadata["relevance_score"] for d in ours.compress_documents(docs, QUERY)}
    theirs = HuggingFaceCrossEncoder(model_name=tiny_cross_encoder_path, model_kwargs={"device": "cpu"})
    want = dict(zip([d.id for d in docs], theirs.score([(QUERY, d.page_content) for d in docs])))
    assert all(math.isclose(got[i], float(want[i]), abs_tol=1e-4) for i in got), (got, want)
