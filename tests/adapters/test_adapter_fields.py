"""Every adapter field named like a setting of its core stage has the stage's default, and the
settings each adapter offers are its stage's (apart from the documented exceptions below).

A setting is declared once for both frameworks (the ``*Fields`` models beside the stages, which
both adapters inherit) and once in the stage's constructor; this test is what keeps the two equal,
so a default changed in one place and not the other fails here (as ``RankRAGRerank``'s
``top_n=5`` against the stage's ``None`` once did)."""

from __future__ import annotations

import inspect
import itertools

import pytest
from pydantic import BaseModel

import langchain_funnel as lc
import llama_index_funnel as li
from funnel_core.fbrag_fields import ForwardLookupFields
from funnel_core.settings import setting_names

#: (stage, setting) -> why the adapters' default differs from the stage's.
ADAPTER_DEFAULTS = {
    ("CrossEncoderScorer", "normalize"): "the frameworks' rerankers give scores in [0, 1] (sigmoid)",
    ("ForwardLookup", "eta_backward"): "None: the weight of the adapter's `variant` (FB, F or B)",
    ("ForwardLookup", "eta_forward"): "None: the weight of the adapter's `variant` (FB, F or B)",
    ("ForwardLookup", "prompt"): "None, which the stage reads as its FORWARD_PROMPT",
}
#: (stage, setting) -> why the adapters do not offer it.
NOT_OFFERED = {
    ("RankRAGScorer", "p_true"): "a scoring function for tests and research, not a user setting",
    ("AttentionLMScorer", "layers"): "a research knob of the attention read-out",
    ("FiDAttentionScorer", "score_on"): "which decoder input is scored: fixed by return_answer",
}


def _adapters() -> list[tuple[str, type]]:
    out = []
    for pkg in (li, lc):
        for name in pkg.__all__:
            cls = getattr(pkg, name)
            if isinstance(cls, type) and issubclass(cls, BaseModel) and getattr(cls, "stage_class", None):
                out.append((f"{pkg.__name__}.{name}", cls))
    return out


ADAPTERS = _adapters()


def test_the_adapters_with_a_stage_are_found():
    names = {n.split(".")[-1] for n, _ in ADAPTERS}
    assert {"CrossEncoderRerank", "CrossEncoderReranker", "RankRAGRerank", "RankRAGReranker",
            "FiDAttentionRerank", "LaterChunkingTransformer", "ExtractiveCompressor",
            "MultiGranularityNodeParser", "MultiGranularityTextSplitter",
            "GraphGranularityNodeParser", "GraphGranularitySplitter"} <= names
    # FB-RAG's retriever: a pydantic model in both frameworks, its fields model first in the bases
    found = dict(ADAPTERS)
    for full in ("llama_index_funnel.ForwardLookupRetriever", "langchain_funnel.ForwardLookupRetriever"):
        assert full in found, f"{full} is not a pydantic adapter with a stage_class"
        assert found[full].__bases__[0] is ForwardLookupFields


@pytest.mark.parametrize("name,cls", ADAPTERS, ids=[n for n, _ in ADAPTERS])
def test_adapter_fields_are_the_stage_settings_with_its_defaults(name, cls):
    stage = cls.stage_class
    params = inspect.signature(stage.__init__).parameters
    fields = cls.model_fields
    missing = [s for s in setting_names(stage)
               if s not in fields and (stage.__name__, s) not in NOT_OFFERED]
    assert missing == [], f"{name} does not offer {missing} of {stage.__name__}"
    for s in setting_names(stage):
        if s not in fields or params[s].default is inspect.Parameter.empty:
            continue
        if (stage.__name__, s) in ADAPTER_DEFAULTS:
            assert fields[s].default != params[s].default, f"{name}.{s}: the documented exception is gone"
            continue
        assert fields[s].default == params[s].default, (
            f"{name}.{s} defaults to {fields[s].default!r}, {stage.__name__} to {params[s].default!r}")


def test_the_two_frameworks_declare_each_shared_setting_once():
    """Both adapters of a stage take their shared fields from one model (the same FieldInfo)."""
    by_stage: dict[type, list[type]] = {}
    for _, cls in ADAPTERS:
        by_stage.setdefault(cls.stage_class, []).append(cls)
    groups = [v for v in by_stage.values() if len(v) >= 2]  # FB-RAG: LlamaIndex's transform too
    assert len(groups) >= 11
    for a, b in (pair for v in groups for pair in itertools.combinations(v, 2)):
        shared = [n for n in setting_names(a.stage_class) if n in a.model_fields and n in b.model_fields]
        declared_once = [n for n in shared if any(n in base.__dict__.get("__annotations__", {})
                                                  for base in a.__mro__ if base in b.__mro__)]
        own = sorted(set(shared) - set(declared_once))
        assert set(own) <= {"llm", "embedder", "name"}, (
            f"{a.__name__} / {b.__name__} each declare {own}: move them to the shared fields model")


#: Adapters whose fields are declared in their own class body (with the reason); none today.
FIELDS_IN_OWN_BODY: dict[str, str] = {}


@pytest.mark.parametrize("name,cls", ADAPTERS, ids=[n for n, _ in ADAPTERS])
def test_the_fields_model_comes_first_in_the_bases(name, cls):
    """An adapter lists its stage's fields model first, so its fields (and their defaults and
    descriptions) are the ones editors, mypy and the docs see, ahead of the framework base's."""
    if name in FIELDS_IN_OWN_BODY:
        return
    first = cls.__bases__[0]
    assert issubclass(first, BaseModel) and first.__module__.startswith("funnel_core."), \
        f"{name} lists {first.__name__} first, not its stage's fields model"
    assert getattr(first, "stage_class", None) is cls.stage_class


@pytest.mark.parametrize("setting", ["alpha", "method", "normalization", "rrf_k"])
def test_both_hybrid_retrievers_take_the_fusion_settings_from_one_declaration(setting):
    """The fusion settings are declared once (FusionFields) with HybridRetrieve's defaults:
    LangChain's HybridRetriever inherits the field, LlamaIndex's constructor takes its default."""
    from funnel_core.best_practices.fields import FUSION_SETTINGS, FusionFields
    from funnel_core.best_practices.fusion import HybridRetrieve

    assert setting in FUSION_SETTINGS
    stage_default = inspect.signature(HybridRetrieve.__init__).parameters[setting].default
    assert FusionFields.model_fields[setting].default == stage_default
    assert setting in FusionFields.__annotations__
    assert setting not in lc.HybridRetriever.__dict__.get("__annotations__", {}), \
        "langchain_funnel.HybridRetriever declares it again"
    assert lc.HybridRetriever.model_fields[setting].default == stage_default
    assert inspect.signature(li.HybridRetriever.__init__).parameters[setting].default == stage_default


#: ClusteredRetrieverFields' field -> the setting of the same meaning of the core stage.
CLUSTERED_STAGE_NAMES = {"k_clusters": "k", "return_clusters": "return_clusters"}


@pytest.mark.parametrize("field", sorted(CLUSTERED_STAGE_NAMES))
def test_both_clustered_retrievers_take_their_settings_from_one_declaration(field):
    """k_clusters and return_clusters are declared once (ClusteredRetrieverFields) with the core
    stage's defaults: LangChain's retriever inherits the field, every constructor and factory
    of both takes its default; neither declares it again."""
    from funnel_core.funnelrag.clustered_index import ClusteredBM25Retrieve
    from funnel_core.funnelrag.fields import CLUSTERED_DEFAULTS, ClusteredRetrieverFields

    stage_default = inspect.signature(ClusteredBM25Retrieve.__init__).parameters[CLUSTERED_STAGE_NAMES[field]].default
    assert ClusteredRetrieverFields.model_fields[field].default == stage_default == CLUSTERED_DEFAULTS[field]
    assert field not in lc.ClusteredBM25Retriever.__dict__.get("__annotations__", {}), \
        "langchain_funnel.ClusteredBM25Retriever declares it again"
    assert lc.ClusteredBM25Retriever.model_fields[field].default == stage_default
    for method in (li.ClusteredBM25Retriever.__init__, li.ClusteredBM25Retriever.from_defaults,
                   li.ClusteredBM25Retriever.from_backend, lc.ClusteredBM25Retriever.from_texts,
                   lc.ClusteredBM25Retriever.from_documents):
        assert inspect.signature(method).parameters[field].default == stage_default, method


@pytest.mark.parametrize("edit,error", [({"k_clusters": 0}, ValueError), ({"return_clusters": "yes"}, TypeError)])
def test_both_clustered_retrievers_refuse_a_bad_setting_when_built_and_when_edited(edit, error):
    texts = ["the cat sat on the mat", "dogs chase cats", "a bird sang"]
    nodes = [li_node(t, i) for i, t in enumerate(texts)]
    built = [li.ClusteredBM25Retriever.from_defaults(nodes=nodes, max_tokens=8),
             lc.ClusteredBM25Retriever.from_texts(texts, max_tokens=8)]
    (name, value), = edit.items()
    for retriever in built:
        with pytest.raises(error, match=name):
            setattr(retriever, name, value)
        assert getattr(retriever, name) == inspect.signature(li.ClusteredBM25Retriever.__init__).parameters[name].default
    with pytest.raises(error, match=name):
        li.ClusteredBM25Retriever.from_defaults(nodes=nodes, max_tokens=8, **edit)
    with pytest.raises(error, match=name):
        lc.ClusteredBM25Retriever.from_texts(texts, max_tokens=8, **edit)


def li_node(text, i):
    from llama_index.core.schema import TextNode

    return TextNode(id_=f"n{i}", text=text)


def test_the_number_returned_is_written_once_per_framework():
    """LangChain's retrievers default to k = DEFAULT_K, LlamaIndex's to similarity_top_k = TOP_K;
    both hybrid factories fetch HYBRID_CANDIDATES a side."""
    from funnel_core.best_practices.fields import HYBRID_CANDIDATES
    from langchain_funnel._base import DEFAULT_K
    from llama_index_funnel._base import TOP_K

    assert lc.BM25Retriever.model_fields["k"].default == DEFAULT_K
    for factory in (lc.BM25Retriever.from_texts, lc.ClusteredBM25Retriever.from_documents,
                    lc.DenseRetriever.from_documents, lc.FunnelRetriever.from_stages):
        assert inspect.signature(factory).parameters["k"].default == DEFAULT_K, factory
    for factory in (li.BM25Retriever.__init__, li.ClusteredBM25Retriever.from_defaults,
                    li.DenseRetriever.from_backend, li.HybridRetriever.__init__):
        assert inspect.signature(factory).parameters["similarity_top_k"].default == TOP_K, factory
    for factory in (lc.HybridRetriever.from_documents, lc.HybridRetriever.from_backend,
                    li.HybridRetriever.from_defaults, li.HybridRetriever.from_backend):
        assert inspect.signature(factory).parameters["candidates"].default == HYBRID_CANDIDATES, factory


def test_llamaindex_mog_retriever_takes_every_default_from_the_shared_fields():
    """LlamaIndex's MixOfGranularityRetriever is a plain class: each keyword it shares with
    MixOfGranularityFields (which LangChain's inherits) has the field's default."""
    from funnel_core.granularity.fields import MixOfGranularityFields

    params = inspect.signature(li.MixOfGranularityRetriever.__init__).parameters
    shared = [n for n in MixOfGranularityFields.model_fields if n in params]
    assert set(shared) >= {"k_r", "normalize", "level_margin", "n_gra", "bm25", "router"}
    for name in shared:
        assert params[name].default == MixOfGranularityFields.model_fields[name].default, name
        assert name not in lc.MixOfGranularityRetriever.__dict__.get("__annotations__", {}), name
