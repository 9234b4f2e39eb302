"""Hybrid fusion, reciprocal rank fusion and repacking ("Best practices in RAG") by hand.

Every expected value is computed in the test from the formulas: min-max and z-score
normalisation, ``S_h = alpha * S_sparse + S_dense`` (a side that missed a unit contributes its
lowest normalised score), RRF ``w / (k + rank)`` with ranks from 1, and the three repack orders.
"""

from __future__ import annotations

import math

import pytest

from funnel_core.best_practices.fusion import alpha_fusion, fuse, normalize_scores, rrf_fusion
from funnel_core.best_practices.repack import repack
from funnel_core.units import Unit


def U(uid, score=None, **scores):
    u = Unit(id=uid, text=f"text {uid}", score=score)
    for stage, s in scores.items():
        u.record_score(stage, s)
    return u


def test_normalize_scores_by_hand():
    assert normalize_scores([2.0, 4.0, 3.0]) == pytest.approx([0.0, 1.0, 0.5])          # minmax default
    assert normalize_scores([2, 4, 3], "minmax") == pytest.approx([0.0, 1.0, 0.5])
    mean, std = 3.0, math.sqrt(2 / 3)
    assert normalize_scores([2.0, 4.0, 3.0], "zscore") == pytest.approx(
        [(2 - mean) / std, (4 - mean) / std, 0.0])
    assert normalize_scores([5.0, -1.0], "none") == [5.0, -1.0]
    assert normalize_scores([7.0, 7.0], "minmax") == [1.0, 1.0]        # constant: all best
    assert normalize_scores([7.0, 7.0], "zscore") == [0.0, 0.0]
    assert normalize_scores([], "minmax") == [] and normalize_scores([], "zscore") == []
    assert all(type(x) is float for x in normalize_scores([1, 2, 3]))
    with pytest.raises(ValueError, match=r"^scores must be finite numbers to be normalised; got NaN or inf\.$"):
        normalize_scores([1.0, float("nan")])
    with pytest.raises(ValueError, match="finite"):
        normalize_scores([1.0, float("inf")], "zscore")
    assert normalize_scores([1.0, float("nan")], "none")[0] == 1.0    # 'none' never checks
    with pytest.raises(ValueError, match="unknown normalization 'l2'"):
        normalize_scores([1.0], "l2")


def test_alpha_fusion_by_hand():
    sparse = [U("a", 10.0, bm25=10.0), U("b", 6.0), U("c", 2.0), U("a", 1.0)]   # duplicate a dropped
    dense = [U("b", 0.9, dense=0.9), U("d", 0.5), U("a", 0.1)]
    # sparse minmax over (10, 6, 2): a 1.0, b 0.5, c 0.0 (floor 0.0)
    # dense  minmax over (0.9, 0.5, 0.1): b 1.0, d 0.5, a 0.0 (floor 0.0)
    # S = 0.3 * s + d: a 0.3, b 0.15 + 1.0 = 1.15, c 0 + 0 = 0.0, d 0 + 0.5 = 0.5
    out = alpha_fusion(sparse, dense, alpha=0.3)
    assert [u.id for u in out] == ["b", "d", "a", "c"]
    assert [u.score for u in out] == pytest.approx([1.15, 0.5, 0.3, 0.0])
    by = {u.id: u for u in out}
    assert by["b"].funnel["sparse_score"] == pytest.approx(0.5)
    assert by["b"].funnel["dense_score"] == pytest.approx(1.0)
    assert (by["b"].funnel["sparse_rank"], by["b"].funnel["dense_rank"]) == (1, 0)
    assert (by["c"].funnel["sparse_rank"], by["c"].funnel["dense_rank"]) == (2, None)
    assert (by["d"].funnel["sparse_rank"], by["d"].funnel["dense_rank"]) == (None, 1)
    assert by["a"].scores == {"bm25": 10.0, "hybrid": pytest.approx(0.3)}
    assert by["b"].scores["dense"] == 0.9 and by["b"].text == "text b"
    assert sparse[0].score == 10.0 and "hybrid" not in sparse[0].scores   # copies
    # the floor is the side's lowest normalised score: with z-scores it is negative
    z = alpha_fusion([U("a", 3.0), U("b", 1.0)], [U("c", 5.0), U("a", 1.0)], alpha=0.5,
                     normalization="zscore", stage="mix")
    # sparse z: a 1, b -1 (floor -1); dense z: c 1, a -1 (floor -1)
    # a: 0.5 * 1 + -1 = -0.5;  b: 0.5 * -1 + -1 = -1.5;  c: 0.5 * -1 + 1 = 0.5
    assert [(u.id, round(u.score, 6)) for u in z] == [("c", 0.5), ("a", -0.5), ("b", -1.5)]
    assert z[0].scores["mix"] == pytest.approx(0.5)
    # raw scores with normalization="none"; ties broken by id
    raw = alpha_fusion([U("y", 1.0), U("x", 1.0)], [], alpha=1.0, normalization="none")
    assert [(u.id, u.score) for u in raw] == [("x", 1.0), ("y", 1.0)]
    assert alpha_fusion([], [U("q", 2.0)], alpha=0.3)[0].score == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"^unit 'n' from the dense side has no score; alpha fusion "
                       r"needs scored units \(use method='rrf', which only needs ranks\)\.$"):
        alpha_fusion([U("a", 1.0)], [U("n")])
    with pytest.raises(ValueError, match="from the sparse side"):
        alpha_fusion([U("n")], [U("a", 1.0)])
    with pytest.raises(ValueError, match=r"^alpha must be"):
        alpha_fusion(sparse, dense, alpha=1.5)


def test_rrf_by_hand():
    sparse = [U("a"), U("b"), U("a")]
    dense = [U("b"), U("c")]
    # k = 60: a 1/61; b 1/62 + 1/61; c 1/62
    out = rrf_fusion(sparse, dense)
    assert [u.id for u in out] == ["b", "a", "c"]
    assert [u.score for u in out] == pytest.approx([1 / 62 + 1 / 61, 1 / 61, 1 / 62])
    assert out[0].scores["hybrid"] == pytest.approx(1 / 62 + 1 / 61)   # the default stage name
    by = {u.id: u for u in out}
    assert (by["a"].funnel["sparse_rank"], by["a"].funnel["dense_rank"]) == (0, None)
    assert (by["b"].funnel["sparse_rank"], by["b"].funnel["dense_rank"]) == (1, 0)
    assert (by["c"].funnel["sparse_rank"], by["c"].funnel["dense_rank"]) == (None, 1)
    # k = 1, weights (2, 0.5): a 2/2 = 1; b 2/3 + 0.5/2 = 0.9167; c 0.5/3
    w = rrf_fusion(sparse, dense, k=1, weights=(2.0, 0.5), stage="rrf")
    assert [(u.id, round(u.score, 4)) for u in w] == [("a", 1.0), ("b", 0.9167), ("c", 0.1667)]
    assert w[0].scores["rrf"] == 1.0
    # a weight of 0 is allowed ("non-negative"): that side's ranks add nothing
    off = rrf_fusion(sparse, dense, weights=(1.0, 0.0))
    assert [(u.id, u.score) for u in off] == [("a", pytest.approx(1 / 61)), ("b", pytest.approx(1 / 62)),
                                              ("c", 0.0)]
    with pytest.raises(ValueError, match="weights"):
        rrf_fusion(sparse, dense, weights=(1.0, -1.0))
    with pytest.raises(ValueError, match="weights"):
        rrf_fusion(sparse, dense, weights=(1.0,))
    with pytest.raises(ValueError, match=r"^rrf_k must be >= 1, got 0"):
        rrf_fusion(sparse, dense, k=0)


def test_fuse_defaults_and_cut_off():
    sparse = [U("a", 10.0), U("b", 6.0), U("c", 2.0)]
    dense = [U("b", 0.9), U("d", 0.5), U("a", 0.1)]
    # defaults: alpha fusion, alpha 0.3, min-max (see test_alpha_fusion_by_hand)
    out = fuse(sparse, dense)
    assert [(u.id, round(u.score, 6)) for u in out] == [("b", 1.15), ("d", 0.5), ("a", 0.3), ("c", 0.0)]
    assert out[0].scores["hybrid"] == pytest.approx(1.15)
    assert [u.id for u in fuse(sparse, dense, k=2)] == ["b", "d"]
    assert [u.id for u in fuse(sparse, dense, k=10)] == ["b", "d", "a", "c"]
    half = fuse(sparse, dense, alpha=0.9, normalization="none", stage="h")
    # raw: a 0.9 * 10 + 0.1 = 9.1; b 5.4 + 0.9 = 6.3; c 1.8 + 0.1 (dense floor) = 1.9; d 1.8 + 0.5 = 2.3
    assert [(u.id, round(u.score, 6)) for u in half] == [("a", 9.1), ("b", 6.3), ("d", 2.3), ("c", 1.9)]
    assert half[0].scores["h"] == pytest.approx(9.1)
    r = fuse(sparse, dense, method="rrf", rrf_k=1, stage="r")
    # a 1/2 + 1/4; b 1/3 + 1/2; c 1/4; d 1/3
    assert [(u.id, round(u.score, 6)) for u in r] == [("b", round(1 / 3 + 1 / 2, 6)), ("a", 0.75),
                                                     ("d", round(1 / 3, 6)), ("c", 0.25)]
    assert r[0].scores["r"] == pytest.approx(1 / 3 + 1 / 2)
    # RRF's default constant is Cormack et al.'s k = 60: b 1/62 + 1/61 ranks first
    assert fuse(sparse, dense, method="rrf")[0].score == pytest.approx(1 / 62 + 1 / 61)
    with pytest.raises(ValueError, match="unknown fusion method"):
        fuse(sparse, dense, method="max")
    with pytest.raises(ValueError, match="k must be >= 1"):
        fuse(sparse, dense, k=0)


@pytest.mark.parametrize("order,expected", [
    ("forward", ["u0", "u1", "u2", "u3", "u4"]),
    ("reverse", ["u4", "u3", "u2", "u1", "u0"]),
    ("sides", ["u0", "u2", "u4", "u3", "u1"]),     # 1st, 3rd, 5th from the front; 2nd, 4th at the back
])
def test_repack_orders(order, expected):
    units = [U(f"u{i}", 1.0 - i / 10) for i in range(5)]
    out = repack(units, order)
    assert [u.id for u in out] == expected
    assert [u.funnel["repack_position"] for u in out] == list(range(5))
    assert [u.funnel["retrieval_rank"] for u in out] == [int(i[1]) for i in expected]
    assert [u.score for u in out] == [1.0 - int(i[1]) / 10 for i in expected]
    assert "repack_position" not in units[0].metadata               # inputs untouched


def test_repack_default_is_reverse_and_rejects_unknown():
    units = [U("a", 2.0), U("b", 1.0)]
    assert [u.id for u in repack(units)] == ["b", "a"]
    with pytest.raises(ValueError, match="unknown repack order 'random'"):
        repack(units, "random")


@pytest.mark.parametrize("normalization", ["none", "minmax", "zscore"])
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_alpha_fusion_refuses_a_non_finite_score_under_every_normalization(normalization, bad):
    """With normalization="none" an inf score was ranked first."""
    sparse = [Unit(id="a", text="a", score=bad), Unit(id="b", text="b", score=2.0)]
    dense = [Unit(id="b", text="b", score=0.9), Unit(id="c", text="c", score=0.1)]
    with pytest.raises(ValueError, match=r"sparse side.*non-finite.*'a'") as err:
        fuse(sparse, dense, normalization=normalization)
    # the message says what to do about it
    assert str(err.value).endswith("Fusion needs finite scores: fix or filter that retriever's "
                                   "output, or use method='rrf', which only reads ranks.")
    # ranks only: RRF is unaffected
    assert [u.id for u in fuse(sparse, dense, method="rrf")] == ["b", "a", "c"]
