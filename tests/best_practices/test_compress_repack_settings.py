"""The extractive compressor and repacking: both frameworks' adapters hold the core stage, have
its settings as fields, honour field edits at the next call, serialise through the stage, and
reject bad values with an error that names the value and the fix. All BM25 scoring: no model
loads."""

from __future__ import annotations

import pytest
from langchain_core.documents import Document
from llama_index.core.schema import NodeWithScore, TextNode

from funnel_core.best_practices.compress import ExtractiveCompressor
from funnel_core.best_practices.repack import Repack
from funnel_core.embeddings import SentenceEmbedder
from funnel_core.settings import setting_names
from langchain_funnel.best_practices import ExtractiveCompressor as LCCompressor
from langchain_funnel.best_practices import RepackTransformer
from llama_index_funnel.best_practices import ExtractiveCompressorPostprocessor, RepackPostprocessor

TEXT = ("Bananas are rich in potassium. They grow in tropical regions. Bananas are often eaten at "
        "breakfast. The Eiffel Tower is in Paris. Trains run on time. Rivers flow to the sea.")
N_TOKENS = len(TEXT.split())


def _nodes(n: int = 4) -> list[NodeWithScore]:
    return [NodeWithScore(node=TextNode(id_=f"n{i}", text=TEXT), score=float(n - i)) for i in range(n)]


def _docs(n: int = 4) -> list[Document]:
    return [Document(id=f"d{i}", page_content=f"document {i}", metadata={"score": 0.0}) for i in range(n)]


def _kept_tokens(out) -> int:
    return sum(len(n.node.get_content().split()) for n in out)


@pytest.mark.parametrize("adapter", [ExtractiveCompressorPostprocessor, LCCompressor],
                         ids=["llamaindex", "langchain"])
def test_compressor_fields_are_the_stage_settings(adapter):
    fields = set(adapter.model_fields)
    assert set(setting_names(ExtractiveCompressor)) <= fields
    comp = adapter(method="bm25", ratio=0.5, min_sentences=0)
    assert comp.stage.to_dict() == ExtractiveCompressor(method="bm25", ratio=0.5,
                                                        min_sentences=0).to_dict()
    assert isinstance(comp.stage, ExtractiveCompressor) and comp.stage.ratio == 0.5


def test_compressor_field_edits_are_honoured_llamaindex():
    comp = ExtractiveCompressorPostprocessor(method="bm25", ratio=1.0)
    q = "bananas breakfast"
    assert _kept_tokens(comp.postprocess_nodes(_nodes(1), query_str=q)) == N_TOKENS
    comp.ratio = 0.2  # honoured at the next call, as LlamaIndex's own postprocessors do
    budget = int(0.2 * N_TOKENS)
    assert _kept_tokens(comp.postprocess_nodes(_nodes(1), query_str=q)) <= budget
    edited = comp.model_copy(update={"ratio": 1.0})
    assert _kept_tokens(edited.postprocess_nodes(_nodes(1), query_str=q)) == N_TOKENS


def test_compressor_field_edits_are_honoured_langchain():
    comp = LCCompressor(method="bm25", ratio=1.0)
    docs = [Document(page_content=TEXT)]
    q = "bananas breakfast"
    assert len(comp.compress_documents(docs, q)[0].page_content.split()) == N_TOKENS
    comp.ratio = 0.2
    assert len(comp.compress_documents(docs, q)[0].page_content.split()) <= int(0.2 * N_TOKENS)


def test_shared_embedder_is_kept_across_cheap_edits_and_never_serialised():
    embedder = SentenceEmbedder.__new__(SentenceEmbedder)  # never called: only its identity matters
    for comp in (ExtractiveCompressorPostprocessor(embedder=embedder, ratio=0.5),
                 LCCompressor(embedder=embedder, ratio=0.5)):
        assert comp.stage.embedder is embedder
        comp.ratio = 0.3
        assert comp.stage.ratio == 0.3 and comp.stage.embedder is embedder
        assert comp.stage.to_dict()["embedder"] is None  # a live object: not serialised
    # without a shared embedder, a model change means a new (lazily loaded) embedder
    comp = ExtractiveCompressorPostprocessor(model="some/model", device="cpu")
    first = comp.stage
    comp.ratio = 0.3
    assert comp.stage is first and comp.stage.ratio == 0.3 and comp.stage.model == "some/model"
    comp.model = "other/model"
    assert comp.stage.model == "other/model" and comp.stage._embedder is None


def test_compressor_serialises_through_its_stage():
    comp = ExtractiveCompressorPostprocessor(method="bm25", ratio=0.25, scope="unit", max_tokens=9)
    data = comp.stage.to_dict()
    assert data["type"] == "ExtractiveCompressor"
    assert ExtractiveCompressor.from_dict(data).to_dict() == data
    settings = {k: v for k, v in data.items() if k != "type"}
    assert LCCompressor(**settings).stage.to_dict() == data


@pytest.mark.parametrize("make", [ExtractiveCompressorPostprocessor, LCCompressor, ExtractiveCompressor],
                         ids=["llamaindex", "langchain", "core"])
def test_compressor_bad_values_name_the_value_and_the_fix(make):
    with pytest.raises(ValueError, match=r"ratio must be in \(0, 1\].*e\.g\. 0\.4.*got 1\.2"):
        make(ratio=1.2)
    with pytest.raises(ValueError, match="unknown compression method 'tfidf'; choose one of"):
        make(method="tfidf")
    with pytest.raises(ValueError, match="unknown scope 'doc'; choose one of"):
        make(scope="doc")
    with pytest.raises((TypeError, ValueError), match="batch_size"):
        make(batch_size=0)
    with pytest.raises((TypeError, ValueError), match="min_sentences must be an int >= 0, got -1"):
        make(min_sentences=-1)
    with pytest.raises((TypeError, ValueError), match="ratio"):
        make(ratio="lots")
    if make is ExtractiveCompressor:  # (pydantic fields coerce "0.4" to 0.4, as the frameworks' own)
        with pytest.raises(TypeError, match=r"ratio must be a number.*'0\.4'"):
            make(ratio="0.4")


# -- repacking ----------------------------------------------------------------------------------
def test_repack_fields_are_the_stage_settings_and_edits_are_honoured():
    rp = RepackPostprocessor()
    assert rp.stage.to_dict() == Repack().to_dict()
    assert set(setting_names(Repack)) <= set(rp.model_fields)
    ids = lambda out: [n.node.node_id for n in out]  # noqa: E731
    assert ids(rp.postprocess_nodes(_nodes(), query_str="q")) == ["n3", "n2", "n1", "n0"]
    rp.order = "forward"
    assert ids(rp.postprocess_nodes(_nodes(), query_str="q")) == ["n0", "n1", "n2", "n3"]
    rp.order = "sides"  # best at both ends: 0 first, 1 last
    out = ids(rp.postprocess_nodes(_nodes(), query_str="q"))
    assert out[0] == "n0" and out[-1] == "n1"

    lc = RepackTransformer()
    assert lc.stage.to_dict() == Repack().to_dict()
    assert [d.id for d in lc.transform_documents(_docs())] == ["d3", "d2", "d1", "d0"]
    lc.order = "forward"
    assert [d.id for d in lc.invoke(_docs())] == ["d0", "d1", "d2", "d3"]
    assert Repack.from_dict(lc.stage.to_dict()).order == "forward"


@pytest.mark.parametrize("make", [RepackPostprocessor, RepackTransformer, Repack],
                         ids=["llamaindex", "langchain", "core"])
def test_repack_bad_order_names_the_value_and_the_choices(make):
    with pytest.raises(ValueError, match=r"unknown repack order 'random'; choose one of \('forward'"):
        make(order="random")
    with pytest.raises((TypeError, ValueError), match="order"):  # pydantic's error in adapters
        make(order=1)
