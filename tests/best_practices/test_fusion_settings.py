"""Hybrid fusion settings (alpha, method, normalization, rrf_k): the core HybridRetrieve and both
frameworks' HybridRetriever have the same defaults, honour an edit at the next call, and reject a
bad value naming it. Expected scores are written from the
fusion equations (S_h = alpha * minmax(S_sparse) + minmax(S_dense); RRF sum 1 / (k + rank)), not
from the code. Fixed-score fake sides stand in for the two retrievers (the thing under test is
the fusion), so no model loads."""

from __future__ import annotations

import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever as LCBaseRetriever
from llama_index.core.retrievers import BaseRetriever as LIBaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from funnel_core.best_practices.fusion import HybridRetrieve
from funnel_core.units import Unit
from langchain_funnel.best_practices import HybridRetriever as LCHybrid
from llama_index_funnel.best_practices import HybridRetriever as LIHybrid

# sparse ranks a > b > c (raw BM25 10, 6, 2); dense ranks c > b > a (cosine 0.9, 0.5, 0.1)
SPARSE = {"a": 10.0, "b": 6.0, "c": 2.0}
DENSE = {"c": 0.9, "b": 0.5, "a": 0.1}


def alpha_reference(alpha: float) -> dict[str, float]:
    """S_h = alpha * minmax(sparse) + minmax(dense), computed from the equation."""
    def minmax(d):
        lo, hi = min(d.values()), max(d.values())
        return {k: (v - lo) / (hi - lo) for k, v in d.items()}
    s, d = minmax(SPARSE), minmax(DENSE)
    return {k: alpha * s[k] + d[k] for k in SPARSE}


def rrf_reference(k: int) -> dict[str, float]:
    ranks_s = {doc: r for r, doc in enumerate(SPARSE, start=1)}
    ranks_d = {doc: r for r, doc in enumerate(DENSE, start=1)}
    return {doc: 1 / (k + ranks_s[doc]) + 1 / (k + ranks_d[doc]) for doc in SPARSE}


def _units(scores):
    return [Unit(id=i, text=f"text {i}", score=s) for i, s in scores.items()]


class _LISide(LIBaseRetriever):
    def __init__(self, scores):
        self.scores = scores
        super().__init__()

    def _retrieve(self, query_bundle: QueryBundle):
        return [NodeWithScore(node=TextNode(id_=i, text=f"text {i}"), score=s)
                for i, s in self.scores.items()]


class _LCSide(LCBaseRetriever):
    scores: dict

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun):
        return [Document(id=i, page_content=f"text {i}", metadata={"funnel": {"score": s}})
                for i, s in self.scores.items()]


def core():
    return HybridRetrieve(lambda q: _units(SPARSE), lambda q: _units(DENSE))


def llamaindex():
    return LIHybrid(_LISide(SPARSE), _LISide(DENSE), similarity_top_k=None)


def langchain():
    return LCHybrid(sparse=_LCSide(scores=SPARSE), dense=_LCSide(scores=DENSE), k=3)


def fused(retriever) -> dict[str, float]:
    if isinstance(retriever, HybridRetrieve):
        return {u.id: u.score for u in retriever.retrieve("q")}
    if isinstance(retriever, LIHybrid):
        return {n.node.node_id: n.score for n in retriever.retrieve("q")}
    return {d.id: d.metadata["funnel"]["score"] for d in retriever.invoke("q")}


MAKERS = [core, llamaindex, langchain]
IDS = ["core", "llamaindex", "langchain"]


@pytest.mark.parametrize("make", MAKERS, ids=IDS)
def test_defaults_are_the_same_and_scores_follow_the_equation(make):
    r = make()
    assert (r.alpha, r.method, r.normalization, r.rrf_k) == (0.3, "alpha", "minmax", 60)
    assert fused(r) == pytest.approx(alpha_reference(0.3))


@pytest.mark.parametrize("make", MAKERS, ids=IDS)
def test_field_edits_are_honoured_at_the_next_call(make):
    r = make()
    r.alpha = 0.9
    assert r.alpha == 0.9
    assert fused(r) == pytest.approx(alpha_reference(0.9))
    r.method, r.rrf_k = "rrf", 10
    assert fused(r) == pytest.approx(rrf_reference(10))


@pytest.mark.parametrize("make", MAKERS, ids=IDS)
def test_bad_value_names_the_value_and_the_choices(make):
    r = make()
    with pytest.raises(ValueError, match=r"'softmax'.*minmax"):
        r.normalization = "softmax"  # refused at the assignment
    assert r.normalization == "minmax"


@pytest.mark.parametrize("build", [
    lambda: HybridRetrieve(lambda q: [], lambda q: [], alhpa=0.5),
    lambda: LCHybrid(sparse=_LCSide(scores=SPARSE), dense=_LCSide(scores=DENSE), alhpa=0.5),
], ids=["core", "langchain"])
def test_unknown_setting_is_named_with_the_accepted_ones(build):
    with pytest.raises(TypeError, match=r"alhpa.*alpha"):
        build()
    with pytest.raises(TypeError, match="alhpa"):
        LIHybrid(_LISide(SPARSE), _LISide(DENSE), alhpa=0.5)


def test_settings_round_trip():
    def side(q):
        return []

    h = HybridRetrieve(side, side, alpha=0.7, method="alpha", normalization="zscore")
    back = HybridRetrieve.from_dict(h.to_dict(), sparse=side, dense=side)
    assert back.to_dict() == h.to_dict() and back.normalization == "zscore"
    with pytest.raises(ValueError, match="alpha must be in"):
        HybridRetrieve(side, side, alpha=1.5)
