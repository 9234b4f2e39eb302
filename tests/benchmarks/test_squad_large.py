"""bench_squad_large: its score cache (what ScoreCache saves, read_scores reads back) and its statistics
re-derived from the kept per-question file."""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

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


@pytest.mark.slow
def test_squad_large_statistics_re_derived_from_the_kept_per_question_file():
    """bench_squad_large.summarize on the hit ranks of results/squad_large_per_question.jsonl.gz
    gives squad_large.json's AR@k and AR@4 intervals (funnel_core.evaluation.stats, same seeds)."""
    results = Path(B.__file__).parent / "results"
    d = json.loads((results / "squad_large.json").read_text())
    recs = [json.loads(line) for line in gzip.open(results / "squad_large_per_question.jsonl.gz", "rt")]
    dev = [SimpleNamespace(id=r["id"]) for r in recs if r["split"] == "dev-a"]
    ranks: dict[str, dict[str, int]] = {}
    for r in recs:
        for name, h in r["hit_rank"].items():
            ranks.setdefault(name, {})[r["id"]] = h
    pairs = {n: [r["pairs_per_query"]] * len(dev) for n, r in d["systems_dev_a"].items()}
    rows = B.summarize(dev, ranks, pairs, {}, n_boot=int(d["args"]["bootstrap"]))
    assert len(dev) == d["samples"]["dev_a_report"] and set(rows) == set(d["systems_dev_a"])
    for name, row in d["systems_dev_a"].items():
        for key in [k for k in rows[name] if k.startswith("AR@")]:
            assert rows[name][key] == pytest.approx(row[key], abs=5e-5), (name, key)
