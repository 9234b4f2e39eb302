"""bench_prerank's runs: the cross-encoder's reranking of BM25's top-depth and its interpolation
with BM25, worked by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_prerank import fused, rerank_run  # noqa: E402

from funnel_core.units import Unit  # noqa: E402


def test_rerank_run_orders_the_top_depth_and_keeps_the_tail():
    # BM25 order a, b, c, d; the cross-encoder prefers c, then a = b (tie: BM25 order), depth 3
    hits = [[Unit(id=i, text="", score=s) for i, s in (("a", 4.0), ("b", 3.0), ("c", 2.0), ("d", 1.0))], []]
    cache = {"q1|a": 0.5, "q1|b": 0.5, "q1|c": 0.9, "q1|d": -5.0}
    run = rerank_run(["q1", "q2"], hits, cache, depth=3)
    assert sorted(run["q1"], key=run["q1"].get, reverse=True) == ["c", "a", "b", "d"]
    assert run["q1"] == {"c": 4.0, "a": 3.0, "b": 2.0, "d": 1.0} and run["q2"] == {}
    # w = 0.5: min-max CE over a, b, c = 0, 0, 1; BM25 = 1, 0.5, 0 -> 0.5, 0.25, 0.5: a (tie, first), c, b
    assert fused([0.5, 0.5, 0.9], hits[0][:3], 0.5) == pytest.approx([0.5, 0.25, 0.5])
    run = rerank_run(["q1", "q2"], hits, cache, depth=3, w=0.5)
    assert sorted(run["q1"], key=run["q1"].get, reverse=True) == ["a", "c", "b", "d"]
    assert "q2" not in run          # no candidates: left out of an interpolated run
