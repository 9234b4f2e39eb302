"""bench_squad_large.py --postrank fid: the funnel with a FiD post-ranker, real pipelines end to end,
on a tiny SQuAD-format corpus with tiny random models (funnel_core.testing): the code path that a
trained FiD checkpoint runs through, not its quality."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

WORDS = ("river mountain city music painter engine protein planet empire harbour violin glacier "
         "senate novel bridge comet desert castle theorem orchestra").split()


def _squad(path: Path, prefix: str, n_articles: int, seed: int) -> Path:
    rng = random.Random(seed)
    data = []
    for a in range(n_articles):
        paragraphs = []
        for p in range(3):
            answer = f"{prefix}{a}x{p}"
            words = [rng.choice(WORDS) for _ in range(70)]
            words.insert(rng.randrange(len(words)), answer)
            paragraphs.append({"context": " ".join(words) + ".",
                               "qas": [{"question": f"which {words[0]} {words[1]} {words[2]} holds the token?",
                                        "answers": [{"answer_start": 0, "text": answer}]}]})  # no "id": as train
        data.append({"title": f"{prefix} article {a}", "paragraphs": paragraphs})
    path.write_text(json.dumps({"version": "1.1", "data": data}), encoding="utf-8")
    return path


def test_funnel_runs_with_a_fid_post_ranker(tmp_path, monkeypatch, tiny_cross_encoder_path, tiny_t5_path):
    import bench_squad_large as B

    train = _squad(tmp_path / "squad-train.json", "tr", 3, 0)
    dev = _squad(tmp_path / "squad-dev-a.json", "dv", 3, 1)
    out = tmp_path / "postrank.json"
    monkeypatch.setattr(sys, "argv", [
        "bench_squad_large.py", "--quick", "--squad", str(train), str(dev), "--model", tiny_cross_encoder_path,
        "--postrank", "fid", "--fid-model", tiny_t5_path, "--fid-funnel", "funnel S1024 K2 kd2",
        "--n-postrank", "4", "--batch-size", "8", "--out", str(out)])
    B.main()
    res = json.loads(out.read_text())
    assert res["samples"]["dev_a_questions"] == 4 and res["funnel"] == "funnel S1024 K2 kd2"
    assert res["fid_model"] == tiny_t5_path and "--postrank fid" in res["command"]
    for name in ("cross-encoder", "fid"):
        r = res["systems"][name]
        assert 0.0 <= r["AR@1"] <= r["AR@2"] <= r["AR@3"] <= r["AR@4"] <= 1.0      # AR@k cannot fall with k
        lo, hi = r["AR@4_ci95"]
        assert lo <= r["AR@4"] <= hi and r["seconds_p50"] > 0
    # per-question hit ranks are the ground truth of the summary: AR@4 is their share in 1..4
    pq = res["per_question"]
    assert len(pq) == 4 and len({q["id"] for q in pq}) == 4
    for name in ("cross-encoder", "fid"):
        ranks = [q[f"hit_rank_{name}"] for q in pq]
        assert res["systems"][name]["AR@4"] == sum(0 < x <= 4 for x in ranks) / 4
    d = res["fid_minus_cross_encoder_AR@4"]
    assert d["difference"] == res["systems"]["fid"]["AR@4"] - res["systems"]["cross-encoder"]["AR@4"]
    assert res["fid_exact_match"] is not None and 0.0 <= res["fid_exact_match"] <= 1.0
