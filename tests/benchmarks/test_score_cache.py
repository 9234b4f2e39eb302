"""bench_squad_large's score cache: what ScoreCache saves, read_scores reads back (all questions or some)."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_squad_large as B  # noqa: E402


def test_score_cache_round_trip(tmp_path, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    monkeypatch.setattr(B, "CACHE", tmp_path / "cache")
    cache = B.ScoreCache(model)
    assert cache.model_key == hashlib.sha1(b"weights").hexdigest()[:16] and cache.scores == {}
    cache.scores.update({("q1", 3): 0.5, ("q1", 7): -1.25, ("q2", 3): 2.0})
    cache.save()
    assert B.ScoreCache(model).scores == cache.scores
    assert B.read_scores(cache.path, {"q2", "q9"}) == {("q2", 3): 2.0}
    assert cache.missing({"q1": {3, 4}, "q2": {3}}) == {"q1": [4]}
