"""Mix-of-Granularity settings: both frameworks' splitters and retrievers hold the core
objects (MultiGranularityChunker, GraphGranularityBuilder, MixOfGranularityRetrieve), have the same
defaults, honour an edit at the next call, and reject a bad value naming it. Expected outputs come
from the core objects built directly with the edited settings (BM25 only, no model loads)."""

from __future__ import annotations

import inspect

import pytest
from langchain_core.documents import Document as LCDocument
from llama_index.core import Document as LIDocument

from funnel_core.granularity.graph import GraphGranularityBuilder
from funnel_core.granularity.levels import MultiGranularityChunker
from funnel_core.granularity.retrieval import GranularityBM25, MixOfGranularityRetrieve
from funnel_core.settings import setting_names
from funnel_core.units import Unit
from langchain_funnel.granularity import GraphGranularitySplitter, MultiGranularityTextSplitter
from langchain_funnel.granularity import MixOfGranularityRetriever as LCMoG
from llama_index_funnel.granularity import (
    GraphGranularityNodeParser,
    MultiGranularityNodeParser,
)
from llama_index_funnel.granularity import MixOfGranularityRetriever as LIMoG
from tests.llama_index.test_granularity import TEXTS as LI_TEXTS

TEXTS = LI_TEXTS[:2]  # the two long texts of the LlamaIndex MoG tests
QUERY = "Which tower stands in Paris?"


def li_parse(parser):
    return parser.get_nodes_from_documents([LIDocument(text=t, id_=f"doc{i}")
                                            for i, t in enumerate(TEXTS)])


def lc_split(splitter):
    return splitter.split_documents([LCDocument(page_content=t, id=f"doc{i}")
                                     for i, t in enumerate(TEXTS)])


def core_levels(**settings):
    units = [Unit(id=f"doc{i}", text=t) for i, t in enumerate(TEXTS)]
    return MultiGranularityChunker(**settings).split(units).levels


def test_chunker_and_builder_round_trip():
    chunker = MultiGranularityChunker(chunk_size=12, n_gra=3)
    assert chunker.to_dict()["chunk_size"] == 12
    again = MultiGranularityChunker.from_dict(chunker.to_dict())
    assert again.chunk_size == 12 and again.n_gra == 3
    builder = GraphGranularityBuilder(k_graph=2, t_graph=0.1)
    assert GraphGranularityBuilder.from_dict(builder.to_dict()).to_dict() == builder.to_dict()


def _defaults(cls) -> dict:
    return {n: p.default for n, p in inspect.signature(cls.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}


@pytest.mark.parametrize("adapter,core", [
    (MultiGranularityNodeParser, MultiGranularityChunker),
    (GraphGranularityNodeParser, GraphGranularityBuilder),
    (LCMoG, MixOfGranularityRetrieve),
], ids=["li-parser", "li-graph-parser", "lc-retriever"])
def test_pydantic_fields_have_the_core_defaults(adapter, core):
    shared = [n for n in setting_names(core) if n in adapter.model_fields and n != "name"]
    assert len(shared) >= 3
    for name in shared:
        assert adapter.model_fields[name].default == _defaults(core)[name], name


def test_plain_adapters_have_the_core_defaults():
    for adapter, core in ((MultiGranularityTextSplitter, MultiGranularityChunker),
                          (GraphGranularitySplitter, GraphGranularityBuilder)):
        obj = adapter()
        for name, default in _defaults(core).items():
            assert getattr(obj, name) in (default, {} if default is None else default), name
    nodes = li_parse(MultiGranularityNodeParser(chunk_size=10, n_gra=2))
    li = LIMoG(nodes)
    core = _defaults(MixOfGranularityRetrieve)
    assert (li.k_r, li.normalize, li.level_margin) == (core["k_r"], core["normalize"],
                                                       core["level_margin"])
    # the old adapters defaulted to normalize="max" while the core and the docs said "none"
    assert LCMoG(documents=lc_split(MultiGranularityTextSplitter(n_gra=2))).normalize == "none"


def test_splitter_edits_are_honoured_at_the_next_call():
    li = MultiGranularityNodeParser(chunk_size=40, n_gra=2)
    lc = MultiGranularityTextSplitter(chunk_size=40, n_gra=2)
    for adapter, parse in ((li, li_parse), (lc, lc_split)):
        adapter.chunk_size, adapter.n_gra = 8, 3
        expected = [u.text for level in core_levels(chunk_size=8, n_gra=3) for u in level]
        texts = [getattr(n, "text", None) or n.page_content for n in parse(adapter)]
        assert sorted(texts) == sorted(expected)


def test_graph_splitter_edits_are_honoured_at_the_next_call():
    lc = GraphGranularitySplitter(sentences_per_node=2, k_graph=2, t_graph=0.05, n_gra=2)
    li = GraphGranularityNodeParser(sentences_per_node=2, k_graph=2, t_graph=0.05, n_gra=2)
    lc.sentences_per_node = li.sentences_per_node = 1
    nodes = GraphGranularityBuilder(sentences_per_node=1, k_graph=2, t_graph=0.05, n_gra=2).build(
        [Unit(id=f"doc{i}", text=t) for i, t in enumerate(TEXTS)]).nodes
    assert len(lc_split(lc)) == len(li_parse(li)) == len(nodes)


@pytest.mark.parametrize("framework", ["llamaindex", "langchain"])
def test_retriever_edits_are_honoured_and_indexes_kept_unless_needed(framework):
    if framework == "llamaindex":
        r = LIMoG(li_parse(MultiGranularityNodeParser(chunk_size=10, n_gra=3)), k_r=2)
        run = lambda: [(n.node.text, n.score) for n in r.retrieve(QUERY)]  # noqa: E731
    else:
        r = LCMoG(documents=lc_split(MultiGranularityTextSplitter(chunk_size=10, n_gra=3)), k_r=2)
        run = lambda: [(d.page_content, d.metadata["relevance_score"]) for d in r.invoke(QUERY)]  # noqa: E731
    index = r.stage.index
    structure = index.structure
    r.normalize, r.k_r = "max", 5
    reference = MixOfGranularityRetrieve(GranularityBM25(structure), k_r=5, normalize="max")
    expected = [(u.text, u.score) for u in reference.retrieve(QUERY)]
    got = run()
    assert [t for t, _ in got] == [t for t, _ in expected]
    assert [s for _, s in got] == pytest.approx([s for _, s in expected])
    assert r.stage.index is index  # cheap settings: the per-level BM25 indexes are kept
    r.bm25 = {"k1": 0.9}
    assert r.stage.index is not index  # BM25 settings: re-indexed
    with pytest.raises(ValueError, match=r"normalize.*'softmax'"):
        r.normalize = "softmax"  # refused at the assignment
    assert r.normalize == r.stage.normalize == "max"


def test_bad_or_unknown_settings_name_the_value():
    with pytest.raises(ValueError, match="chunk_size"):
        MultiGranularityTextSplitter(chunk_size=0)
    with pytest.raises(ValueError, match="chunk_size"):
        MultiGranularityNodeParser(chunk_size=0)
    with pytest.raises(ValueError, match="t_graph"):
        GraphGranularityNodeParser(t_graph=2.0)
    with pytest.raises(TypeError, match="chunksize"):
        MultiGranularityTextSplitter(chunksize=10)
    with pytest.raises(TypeError, match=r"chunk_sz.*accepted.*chunk_size"):  # a misspelt keyword names the right one
        MultiGranularityNodeParser(chunk_sz=10)
    nodes = li_parse(MultiGranularityNodeParser(chunk_size=10, n_gra=2))
    with pytest.raises(ValueError, match="k_r"):
        LIMoG(nodes, k_r=0)
    with pytest.raises(TypeError, match="kr"):
        LIMoG(nodes, kr=2)
