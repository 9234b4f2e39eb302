"""Settings declared once, in each stage's constructor (funnel_core.settings): to_dict shows the
current attributes, from_dict round-trips, an edit is validated by the constructor and honoured at
the next call (the model runs with the edited batch size), and only a load-time edit drops the
loaded model."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from funnel_core.backends.milvus import MilvusBM25Index, MilvusClusteredBM25Index, MilvusDenseIndex
from funnel_core.best_practices.compress import ExtractiveCompressor
from funnel_core.best_practices.fusion import HybridRetrieve
from funnel_core.best_practices.hyde import HyDE, HyDERetrieve
from funnel_core.best_practices.repack import Repack
from funnel_core.bm25 import BM25Index
from funnel_core.embeddings import DenseIndex, SentenceEmbedder
from funnel_core.fbrag import ForwardLookup
from funnel_core.funnelrag.chunking import LaterChunking
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
from funnel_core.granularity.graph import GraphGranularityBuilder
from funnel_core.granularity.levels import MultiGranularityChunker
from funnel_core.granularity.retrieval import MixOfGranularityRetrieve
from funnel_core.llm import LLM
from funnel_core.rerank.attention_lm import AttentionLMScorer
from funnel_core.rerank.cross_encoder import CrossEncoderScorer
from funnel_core.rerank.fid import FiDAttentionScorer
from funnel_core.rerank.monot5 import MonoT5Scorer
from funnel_core.rerank.rankrag import RankRAGScorer
from funnel_core.settings import Settings
from funnel_core.units import Unit

TEXTS = [f"passage number {i} " + "word " * (3 * i) for i in range(10)]


class Judge(LLM):
    """A provider that answers True to every prompt (no model: only settings matter here)."""

    supports_logprobs = False

    def _generate(self, prompts, **kwargs):
        return ["True"] * len(prompts)


def _no_hits(query: str) -> list[Unit]:
    return []


def _stages(tiny_cross_encoder_path="m") -> list[Settings]:
    """One object of every Settings class of the core, built with non-default values."""
    docs = [Unit(id=f"d{i}", text=" ".join(f"w{i}{j}." for j in range(40))) for i in range(3)]
    return [
        CrossEncoderScorer(str(tiny_cross_encoder_path), library="transformers", batch_size=3,
                           top_n=2, normalize=True, window_words=50, window_overlap=5),
        MonoT5Scorer("some/monot5", batch_size=5, template="Q: {query} D: {document} R:"),
        FiDAttentionScorer(model="some/t5", lr=None, aggregation="max_layers", top_n=3),
        AttentionLMScorer(model="some/lm", attend_from="answer", max_context=64),
        RankRAGScorer(llm="some/lm", mode="generate", samples=3, dtype="float32"),
        LaterChunking(words=7, overlap=2, level="sentence"),
        ExtractiveCompressor(method="bm25", ratio=0.5, scope="unit", cache_size=4),
        Repack(order="sides"),
        ForwardLookup(llm="some/lm", eta_backward=0.2, samples=2, k=3, chunk_words=20),
        MultiGranularityChunker(chunk_size=12, n_gra=3),
        GraphGranularityBuilder(sentences_per_node=1, k_graph=2, bm25={"k1": 1.2}),
        MixOfGranularityRetrieve(MultiGranularityChunker(chunk_size=8, n_gra=2).split(docs),
                                 k_r=4, top_k=2, normalize="max"),
        HybridRetrieve(_no_hits, _no_hits, alpha=0.7, method="rrf", rrf_k=10),
        HyDE("some/lm", n=2, temperature=0.7, max_new_tokens=32),
        HyDERetrieve(DenseIndex(SentenceEmbedder("some/embedder")), HyDE("some/lm", n=2, temperature=0.7), k=7),
        BM25Index(k1=1.2, stemmer=None, stopwords=["a", "the"], engine="numpy"),
        ClusteredBM25Index(max_tokens=100, adjacency="bm25", k1=1.1, cjk="bigram"),
        DenseIndex(SentenceEmbedder("some/embedder"), index="exact", ef_search=64),
        MilvusBM25Index("never_opened.db", "c", k1=1.1, stemmer=None),
        MilvusClusteredBM25Index("never_opened.db", "c", max_tokens=100, b=0.5),
        MilvusDenseIndex("never_opened.db", "c", SentenceEmbedder("some/embedder"), metric="COSINE", ef=40),
    ]


def test_every_settings_class_is_covered():
    """A new Settings class must join _stages (so its round trip is tested)."""
    import funnel_core.best_practices.compress  # noqa: F401 (every module with a Settings class)
    import funnel_core.best_practices.hyde  # noqa: F401
    import funnel_core.granularity.retrieval  # noqa: F401

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    assert {c.__name__ for c in subclasses(Settings)} <= {type(s).__name__ for s in _stages()}


@pytest.mark.parametrize("stage", _stages(), ids=lambda s: type(s).__name__)
def test_from_dict_of_to_dict_round_trips(stage):
    data = stage.to_dict()
    if isinstance(stage, (MixOfGranularityRetrieve, HybridRetrieve, HyDERetrieve, DenseIndex, MilvusDenseIndex)):  # live objects: passed again
        live = {n: stage._setting(n) for n in type(stage).unserialised}
        back = type(stage).from_dict(data, **live)
    else:
        data = json.loads(json.dumps(data))  # plain JSON
        back = type(stage).from_dict(data)
    assert type(back) is type(stage) and back.to_dict() == stage.to_dict()
    with pytest.raises(TypeError, match=r"unknown argument.*'topn'.*accepted"):
        type(stage).from_dict({**data, "topn": 1})


@pytest.mark.parametrize("stage", _stages(), ids=lambda s: type(s).__name__)
def test_pickle_and_deepcopy_keep_the_settings(stage):
    for other in (pickle.loads(pickle.dumps(stage)), copy.deepcopy(stage), copy.copy(stage)):
        assert type(other) is type(stage)
        assert json.dumps(other.to_dict(), default=repr) == json.dumps(stage.to_dict(), default=repr)


def test_to_dict_shows_an_edit():
    s = CrossEncoderScorer(batch_size=32)
    s.batch_size = 4
    assert s.to_dict()["batch_size"] == 4
    lc = LaterChunking(words=100)
    lc.words = 20
    assert lc.to_dict()["words"] == 20 and lc.name == "later_chunking(20w)"
    h = HybridRetrieve(lambda q: [], lambda q: [])
    h.alpha = 0.9
    assert h.to_dict()["alpha"] == 0.9


def test_an_invalid_edit_raises_naming_the_setting_and_changes_nothing():
    s = CrossEncoderScorer(batch_size=8)
    for bad in (0, True, "3"):
        with pytest.raises((TypeError, ValueError), match="batch_size"):
            s.batch_size = bad
    assert s.batch_size == 8
    with pytest.raises((TypeError, ValueError), match="top_n"):
        CrossEncoderScorer(top_n="3")
    with pytest.raises(ValueError, match="normalization"):
        HybridRetrieve(lambda q: [], lambda q: []).normalization = "softmax"
    mog = _stages()[11]
    with pytest.raises(ValueError, match="normalize"):
        mog.normalize = "softmax"
    with pytest.raises(TypeError, match=r"CrossEncoderScorer.*'top_k'.*accepted.*'top_n'"):
        CrossEncoderScorer(top_k=3)  # a typo in a core constructor raises too


def test_live_objects_are_not_serialised_and_asked_for_again():
    scorer = RankRAGScorer(llm=Judge())
    data = scorer.to_dict()
    assert data["llm"] is None
    with pytest.raises(TypeError, match="llm="):
        RankRAGScorer.from_dict(data)
    assert isinstance(RankRAGScorer.from_dict(data, llm=Judge()).llm, Judge)
    with pytest.raises(TypeError, match="came back as a dict"):
        RankRAGScorer(llm={"class_name": "X"})
    fwd = ForwardLookup(llm=Judge(), k=2)
    assert ForwardLookup.from_dict(fwd.to_dict(), llm=Judge()).k == 2


def _count_forward_passes(model):
    calls = []
    model.register_forward_hook(lambda module, args, kwargs, out: calls.append(
        kwargs["input_ids"].shape if "input_ids" in kwargs else args[0].shape), with_kwargs=True)
    return calls


@pytest.mark.models
def test_a_batch_size_edit_changes_the_forward_passes(tiny_cross_encoder_path):
    s = CrossEncoderScorer(tiny_cross_encoder_path, library="transformers", runtime="torch",
                           batch_size=10)
    s.score("q", TEXTS)
    calls = _count_forward_passes(s._model.get().model)
    s.score("q", TEXTS)
    assert len(calls) == 1
    loaded = s._model
    s.batch_size = 3  # honoured at the next call, with the same model
    calls.clear()
    s.score("q", TEXTS)
    assert len(calls) == 4 and s._model is loaded
    cut = s % 2  # a copy shares the loaded model and has its own settings
    cut.batch_size = 5
    calls.clear()
    cut.score("q", TEXTS)
    assert len(calls) == 2 and s.batch_size == 3


@pytest.mark.models
def test_a_sort_by_length_edit_is_honoured(tiny_cross_encoder_path):
    s = CrossEncoderScorer(tiny_cross_encoder_path, library="transformers", runtime="torch",
                           batch_size=2, sort_by_length=True)
    s.score("q", TEXTS[:1])
    calls = _count_forward_passes(s._model.get().model)
    s.score("q", TEXTS)
    widths_sorted = [shape[1] for shape in calls]
    assert widths_sorted == sorted(widths_sorted, reverse=True)  # longest pairs first
    s.sort_by_length = False
    calls.clear()
    s.score("q", TEXTS)
    assert [shape[1] for shape in calls] == sorted(widths_sorted)  # the input order: shortest first


@pytest.mark.models
def test_monot5_batch_size_edit_changes_the_forward_passes(tiny_t5_path):
    s = MonoT5Scorer(tiny_t5_path, batch_size=10)
    s.score("q", TEXTS)
    calls = _count_forward_passes(s._model.get().model)
    s.batch_size = 5
    s.score("q", TEXTS)
    assert len(calls) == 2


@pytest.mark.models
def test_only_a_load_time_edit_drops_the_model(tiny_cross_encoder_path):
    s = CrossEncoderScorer(tiny_cross_encoder_path, library="transformers", runtime="torch")
    before = s.score("q", TEXTS[:3])
    loaded = s._model
    for name, value in (("top_n", 1), ("normalize", True), ("score_threshold", 0.1),
                        ("window_words", 40), ("fuse_weight", 0.5), ("name", "ce")):
        setattr(s, name, value)
        assert s._model is loaded, name
    cut = s % 1
    s.max_length = 64  # load-time: a new model for s, the copy keeps the loaded one
    assert s._model is not loaded and not s._model.loaded and cut._model is loaded
    assert s.score("q", TEXTS[:3]) == pytest.approx(before, abs=1e-4)  # short texts: same scores


@pytest.mark.models
def test_a_stage_pickles_after_use_and_reloads_lazily(tiny_cross_encoder_path):
    s = CrossEncoderScorer(tiny_cross_encoder_path, library="transformers", runtime="torch",
                           batch_size=4)
    scores = s.score("q", TEXTS[:3])
    for other in (pickle.loads(pickle.dumps(s)), copy.deepcopy(s)):
        assert not other._model.loaded and other.batch_size == 4
        assert other.score("q", TEXTS[:3]) == pytest.approx(scores)


def test_a_cut_off_never_adds_results():
    docs = [Unit(id=f"d{i}", text=f"alpha beta gamma delta word{i} " * 10) for i in range(6)]
    units = MultiGranularityChunker(chunk_size=5, n_gra=2).split(docs)
    one = MixOfGranularityRetrieve(units, top_k=1)
    assert len(one("alpha", [])) == 1
    assert len((one % 4)("alpha", [])) == 1  # % caps; it never raises top_k
    three = MixOfGranularityRetrieve(units, top_k=3)
    assert len((three % 2)("alpha", [])) == 2
    assert three.limit(three.top_k) == 3 and (three % 2).limit(3) == 2 and (three % 5).limit(3) == 3
