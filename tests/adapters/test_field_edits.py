"""An adapter's field edits must be honoured, as LlamaIndex's own
``SentenceTransformerRerank`` honours ``top_n``; cheap edits keep the loaded model."""

from __future__ import annotations

import pytest
from langchain_core.documents import Document
from langchain_core.language_models.fake import FakeListLLM
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from langchain_funnel import CrossEncoderReranker, LaterChunkingTransformer, RankRAGReranker
from llama_index_funnel import CrossEncoderRerank, LaterChunkingPostprocessor, RankRAGRerank
from tests.adapters.test_llm_stages import JudgeLLM
from tests.conftest import CORPUS

Q = QueryBundle("what does BM25 rank?")


def _nodes(n=5):
    return [NodeWithScore(node=TextNode(id_=f"n{i}", text=t), score=1.0)
            for i, (_, t, _m) in enumerate(CORPUS[:n])]


def _docs(n=5):
    return [Document(id=f"d{i}", page_content=t) for i, (_, t, _m) in enumerate(CORPUS[:n])]


def test_llamaindex_cross_encoder_top_n_edit_is_honoured(tiny_cross_encoder_path):
    rr = CrossEncoderRerank(model=tiny_cross_encoder_path, top_n=3)
    assert len(rr.postprocess_nodes(_nodes(), Q)) == 3
    model = rr.stage._model
    rr.top_n = 1
    assert len(rr.postprocess_nodes(_nodes(), Q)) == 1
    assert rr.stage._model is model  # a cheap edit keeps the loaded model
    rr2 = rr.model_copy(update={"top_n": 2})
    assert len(rr2.postprocess_nodes(_nodes(), Q)) == 2
    assert len(rr.postprocess_nodes(_nodes(), Q)) == 1
    rr.library = "transformers"  # a model setting: a new model
    assert rr.stage._model is not model


def test_langchain_cross_encoder_top_n_edit_is_honoured(tiny_cross_encoder_path):
    rr = CrossEncoderReranker(model=tiny_cross_encoder_path, top_n=3)
    assert len(rr.compress_documents(_docs(), Q.query_str)) == 3
    rr.top_n = 1
    assert len(rr.compress_documents(_docs(), Q.query_str)) == 1
    assert len(rr.model_copy(update={"top_n": 2}).compress_documents(_docs(), Q.query_str)) == 2


def test_later_chunking_words_edit_is_honoured():
    text = " ".join(f"w{i}" for i in range(40))
    lc = LaterChunkingPostprocessor(words=20, sentence_aware=False)
    node = [NodeWithScore(node=TextNode(id_="a", text=text), score=1.0)]
    assert len(lc.postprocess_nodes(node, Q)) == 2
    lc.words = 10
    assert len(lc.postprocess_nodes(node, Q)) == 4
    t = LaterChunkingTransformer(words=20, sentence_aware=False)
    assert len(t.transform_documents([Document(page_content=text)])) == 2
    t.words = 10
    assert len(t.transform_documents([Document(page_content=text)])) == 4


def test_rankrag_top_n_edit_after_first_use():
    rr = RankRAGRerank(llm=JudgeLLM(), top_n=3)
    assert len(rr.postprocess_nodes(_nodes(), Q)) == 3
    rr.top_n = 1
    assert len(rr.postprocess_nodes(_nodes(), Q)) == 1
    lc = RankRAGReranker(llm=FakeListLLM(responses=["True"] * 20), top_n=3)
    assert len(lc.compress_documents(_docs(), Q.query_str)) == 3
    lc.top_n = 1
    assert len(lc.compress_documents(_docs(), Q.query_str)) == 1


def test_invalid_edit_raises_at_once_and_changes_nothing(tiny_cross_encoder_path):
    rr = CrossEncoderRerank(model=tiny_cross_encoder_path, top_n=3)
    with pytest.raises(ValueError, match="top_n"):
        rr.top_n = 0
    assert rr.top_n == rr.stage.top_n == 3
    assert len(rr.postprocess_nodes(_nodes(), Q)) == 3
    lc = CrossEncoderReranker(model=tiny_cross_encoder_path)
    with pytest.raises(ValueError, match="batch_size"):
        lc.batch_size = -1
    assert lc.batch_size == lc.stage.batch_size == 32
