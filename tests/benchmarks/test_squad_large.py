"""bench_squad_large: its score cache (what ScoreCache saves, read_scores reads back, the pairs it exports
for pairs.py and imports back) and its statistics re-derived from the kept per-question file."""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import pairs as P  # noqa: E402
import squad_large_eval as E  # noqa: E402


def test_score_cache_round_trip(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    cache = P.ScoreCache(model, folder=tmp_path / "cache")
    assert cache.model_key == hashlib.sha1(b"weights").hexdigest()[:16] and cache.scores == {}
    cache.scores.update({("q1", 3): 0.5, ("q1", 7): -1.25, ("q2", 3): 2.0})
    cache.save()
    assert P.ScoreCache(model, folder=tmp_path / "cache").scores == cache.scores
    assert P.read_scores(cache.path, {"q2", "q9"}) == {("q2", 3): 2.0}
    assert cache.missing({"q1": {3, 4}, "q2": {3}}) == {"q1": [4]}


def test_pairs_exported_for_pairs_py_come_back_into_the_cache(tmp_path):
    """export writes each distinct text once; the scores of pairs.py, in the file's order, land on their pairs."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    cache = P.ScoreCache(model, folder=tmp_path / "cache")
    missing = {"q2": [5], "q1": [0, 5]}
    cache.export(tmp_path / "pairs.npz", missing, {"q1": "one?", "q2": "two?"}, [f"p{i}" for i in range(6)])
    questions, passages, qi, pi = P.read_pairs(tmp_path / "pairs.npz")
    assert (questions, passages) == (["two?", "one?"], ["p0", "p5"])
    assert [(questions[a], passages[b]) for a, b in zip(qi, pi)] == [("two?", "p5"), ("one?", "p0"), ("one?", "p5")]
    np.save(tmp_path / "scores.npy", np.array([1.5, -2.0, 0.25], dtype=np.float32))
    cache.import_scores(tmp_path / "pairs.npz", tmp_path / "scores.npy")
    assert P.ScoreCache(model, folder=tmp_path / "cache").scores == {("q2", 5): 1.5, ("q1", 0): -2.0, ("q1", 5): 0.25}
    assert cache.missing({"q1": {0, 5}, "q2": {5}}) == {}


@pytest.mark.slow
def test_squad_large_statistics_re_derived_from_the_kept_per_question_file():
    """squad_large_eval.summarize on the hit ranks of results/squad_large_per_question.jsonl.gz
    gives squad_large.json's AR@k and AR@4 intervals (funnel_core.evaluation.stats, same seeds)."""
    results = Path(E.__file__).parent / "results"
    d = json.loads((results / "squad_large.json").read_text())
    recs = [json.loads(line) for line in gzip.open(results / "squad_large_per_question.jsonl.gz", "rt")]
    dev = [SimpleNamespace(id=r["id"]) for r in recs if r["split"] == "dev-a"]
    ranks: dict[str, dict[str, int]] = {}
    for r in recs:
        for name, h in r["hit_rank"].items():
            ranks.setdefault(name, {})[r["id"]] = h
    pairs = {n: [r["pairs_per_query"]] * len(dev) for n, r in d["systems_dev_a"].items()}
    rows = E.summarize(dev, ranks, pairs, {}, n_boot=int(d["args"]["bootstrap"]))
    assert len(dev) == d["samples"]["dev_a_report"] and set(rows) == set(d["systems_dev_a"])
    for name, row in d["systems_dev_a"].items():
        for key in [k for k in rows[name] if k.startswith("AR@")]:
            assert rows[name][key] == pytest.approx(row[key], abs=5e-5), (name, key)
