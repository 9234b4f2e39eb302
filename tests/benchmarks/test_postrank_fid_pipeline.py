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
    summary, pq = res["summary"], res["per_question"]
    for name in ("cross-encoder", "fid"):
        ar = [summary[name][f"AR@{k}"]["mean"] for k in (1, 2, 3, 4)]
        assert 0.0 <= ar[0] <= ar[1] <= ar[2] <= ar[3] <= 1.0      # AR@k cannot fall with k
        lo, hi = summary[name]["AR@4"]["ci"]
        assert lo <= ar[3] <= hi and res["cost"][name]["timed_questions"] == 4
        # per-question results are the ground truth of the summary: AR@4 is the share of hits
        assert len(pq[name]) == 4 and ar[3] == sum(r["metrics"]["AR@4"] for r in pq[name]) / 4
    # each system answered each question once, in turns (the timed runs are the quality run)
    assert res["timing"]["one_pass"] and len(res["timing"]["order"]) == 8
    d = res["comparisons"]["fid"]["AR@4"]
    assert d["difference"] == summary["fid"]["AR@4"]["mean"] - summary["cross-encoder"]["AR@4"]["mean"]
    assert res["fid_exact_match"] is not None and 0.0 <= res["fid_exact_match"] <= 1.0
