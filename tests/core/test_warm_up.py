"""warm_up(): models load and run one batch before the first query, on real tiny models."""

from __future__ import annotations

import pytest

from funnel_core.funnel import FunctionStage, Funnel
from funnel_core.rerank.cross_encoder import CrossEncoderScorer
from funnel_core.units import Unit

UNITS = [Unit(id=str(i), text=t) for i, t in enumerate(["paris is in france", "bm25 ranks text",
                                                        "the cat sat"])]


def _forbid_loading(scorer: CrossEncoderScorer, monkeypatch) -> None:
    def boom():
        raise AssertionError("the model loaded on the first query, after warm_up()")

    monkeypatch.setattr(scorer._model, "_factory", boom)


@pytest.mark.parametrize("runtime", ["torch", "onnx"])
def test_scorer_warm_up_loads_and_runs_a_batch(tiny_cross_encoder_path, monkeypatch, runtime):
    scorer = CrossEncoderScorer(tiny_cross_encoder_path, library="transformers", runtime=runtime)
    assert not scorer._model.loaded
    assert scorer.warm_up() is scorer
    assert scorer._model.loaded and scorer.active_runtime == runtime
    _forbid_loading(scorer, monkeypatch)
    assert len(scorer("where is paris", UNITS)) == 3


def test_funnel_warm_up_reaches_every_stage(tiny_cross_encoder_path, monkeypatch):
    scorer = CrossEncoderScorer(tiny_cross_encoder_path, library="transformers")
    funnel = FunctionStage(lambda q, u: u, name="identity") >> scorer % 2
    assert isinstance(funnel, Funnel)
    funnel.warm_up()
    cut = funnel.stages[-1]
    assert cut._model.loaded and cut._model is scorer._model  # `% k` shares the model
    _forbid_loading(scorer, monkeypatch)
    assert len(funnel.search("where is paris", UNITS).units) == 2


def test_llamaindex_postprocessor_and_retriever_warm_up(tiny_cross_encoder_path, monkeypatch):
    pytest.importorskip("llama_index.core")
    from llama_index_funnel.funnel import FunnelRetriever
    from llama_index_funnel.rerank import CrossEncoderRerank

    rerank = CrossEncoderRerank(model=tiny_cross_encoder_path, library="transformers", top_n=2)
    assert rerank.warm_up() is rerank
    assert rerank.stage._model.loaded
    scorer = CrossEncoderScorer(tiny_cross_encoder_path, library="transformers")
    retriever = FunnelRetriever([lambda q, u: list(UNITS), scorer % 2])
    assert retriever.warm_up() is retriever
    assert scorer._model.loaded
    _forbid_loading(scorer, monkeypatch)
    assert len(retriever.retrieve("where is paris")) == 2


def test_langchain_compressor_and_retriever_warm_up(tiny_cross_encoder_path, monkeypatch):
    pytest.importorskip("langchain_core")
    from langchain_funnel.funnel import FunnelRetriever
    from langchain_funnel.rerank import CrossEncoderReranker

    compressor = CrossEncoderReranker(model=tiny_cross_encoder_path, library="transformers", top_n=2)
    assert compressor.warm_up() is compressor
    assert compressor.stage._model.loaded
    scorer = CrossEncoderScorer(tiny_cross_encoder_path, library="transformers")
    retriever = FunnelRetriever(funnel=Funnel([FunctionStage(lambda q, u: list(UNITS)), scorer % 2]))
    assert retriever.warm_up() is retriever
    assert scorer._model.loaded
    _forbid_loading(scorer, monkeypatch)
    assert len(retriever.invoke("where is paris")) == 2


@pytest.mark.models
def test_hybrid_retrievers_warm_their_dense_side(tmp_path):
    """The hybrid retrievers (which subclass the frameworks' BaseRetriever directly) reach the
    embedding model of a dense index re-opened from disk (not loaded until used)."""
    from llama_index.core.schema import TextNode

    from funnel_core.embeddings import DenseIndex, SentenceEmbedder
    from langchain_funnel import DenseRetriever as LCDense
    from langchain_funnel.best_practices import HybridRetriever as LCHybrid
    from langchain_funnel.retrievers import BM25Retriever as LCBM25
    from llama_index_funnel import DenseRetriever as LIDense
    from llama_index_funnel.best_practices import HybridRetriever as LIHybrid
    from llama_index_funnel.retrievers import BM25Retriever as LIBM25

    texts = [u.text for u in UNITS]
    DenseIndex(SentenceEmbedder(cache=False)).index(UNITS).save(tmp_path / "dense")

    def reopened() -> DenseIndex:
        index = DenseIndex.load(tmp_path / "dense", SentenceEmbedder(cache=False))
        assert not index.embedder._model.loaded
        return index

    nodes = [TextNode(id_=u.id, text=u.text) for u in UNITS]
    li_dense = reopened()
    li = LIHybrid(LIBM25.from_defaults(nodes=nodes, similarity_top_k=2), LIDense(li_dense, nodes))
    assert li.warm_up() is li and li_dense.embedder._model.loaded

    lc_dense = reopened()
    lc = LCHybrid(sparse=LCBM25.from_texts(texts, k=2), dense=LCDense(index=lc_dense, k=2))
    assert lc.warm_up() is lc and lc_dense.embedder._model.loaded
    assert lc.invoke("where is paris")[0].page_content == "paris is in france"
    assert li.retrieve("where is paris")[0].node.get_content() == "paris is in france"
