"""Turn the outputs of ``fid_l2g_gpu.py`` into the post-ranker / L2G benchmark JSON.

    python benchmarks/fid_l2g_report.py --data .m22_gpu/data.json.gz --run .m22_gpu/run1 \\
        --ce models/minilm-squad-ce --ce-questions 250 \\
        --out benchmarks/results/postrank_fid_minilm.json

Post-ranking (dev-a, each question's BM25 top-n passages over the large SQuAD corpus): AR@1..4
(an answer string in the concatenated top-k passages, ``funnel_core``'s AR@k) of

* BM25's own order and the oracle (answer anywhere in the n candidates: the ceiling);
* the SQuAD cross-encoder (``--ce``, scored here on CPU or read from ``--ce-scores``);
* the FiD reader's cross-attention, every scheme computed from the per-(layer, head, passage)
  statistics the GPU job saved:

  - Table 7 (i) ``mean``      : eq. 3, mean over layers and heads of the mean of the top-4 passage
    tokens selected per (layer, head);
  - (ii) ``max_layers``        : max over layers of the head-mean (top-4 tokens);
  - (iii) ``max_heads``        : max over heads, mean over layers (top-4 tokens);
  - (iv) ``max_tokens``        : the single most-attended token per (layer, head), averaged;
  - (v) ``last_k_layers``      : eq. 3 on the last k layers (k = 2, 3; MiniLM has 6 layers, so the
    paper's k = 6 is (i));
  - ``all_tokens``             : every passage token (lr = None);
  - ``averaged_map_top4``      : the earlier implementation: heads and layers averaged first, then
    the top-4 tokens of that map;
  - Table 8 query ablation: the same with the question's tokens allowed among the candidates.

with 95% bootstrap intervals (1,000 resamples of questions) and paired intervals of FiD minus
the cross-encoder. ``benchmarks/report.py`` renders the docs tables from the JSON (blocks
``postrank-fid-ce`` and ``postrank-fid-schemes``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from pathlib import Path

import numpy as np
from common import ROOT

VARIANTS = ("top1", "top4", "all", "top1_q", "top4_q", "all_q")
KS = (1, 2, 3, 4)


def schemes(stats: np.ndarray, legacy: np.ndarray) -> dict[str, np.ndarray]:
    """``{scheme: [questions, passages] scores}`` from ``stats[q, p, variant, layer, head]``."""
    v = {name: stats[:, :, i].astype(np.float64) for i, name in enumerate(VARIANTS)}
    out = {}
    for suffix, t4, t1, al in (("", "top4", "top1", "all"), ("+query", "top4_q", "top1_q", "all_q")):
        out["mean" + suffix] = v[t4].mean(axis=(2, 3))
        out["max_layers" + suffix] = v[t4].mean(axis=3).max(axis=2)
        out["max_heads" + suffix] = v[t4].max(axis=3).mean(axis=2)
        out["max_tokens" + suffix] = v[t1].mean(axis=(2, 3))
        for k in (2, 3):
            out[f"last_{k}_layers" + suffix] = v[t4][:, :, -k:].mean(axis=(2, 3))
        out["all_tokens" + suffix] = v[al].mean(axis=(2, 3))
    out["averaged_map_top4"] = legacy[:, :, 0].astype(np.float64)
    out["averaged_map_top4+query"] = legacy[:, :, 1].astype(np.float64)
    return out


LOG_VARIANTS = ("logtop1", "logtop4", "logall")


def log_schemes(log_stats: np.ndarray) -> dict[str, np.ndarray]:
    """eq. 3 on log(attention) (passage tokens only; ``fid_l2g_gpu.py`` >= the gpu-fid branch):
    the mean over layers and heads of the mean log-attention of the top-1 / top-4 / all tokens.
    Within one softmax, log(attention) is the pre-softmax score alpha up to a per-(layer, head)
    constant, so ``log_all_tokens`` ranks like eq. 3's average of alpha over all tokens."""
    v = {name: log_stats[:, :, i].astype(np.float64) for i, name in enumerate(LOG_VARIANTS)}
    return {"log_max_tokens": v["logtop1"].mean(axis=(2, 3)),
            "log_mean": v["logtop4"].mean(axis=(2, 3)),
            "log_all_tokens": v["logall"].mean(axis=(2, 3))}


def ar_matrix(order_scores: np.ndarray, dev, passages) -> np.ndarray:
    """``[questions, 4]`` 0/1: AR@1..4 of each question's candidates sorted by the scores."""
    from funnel_core.evaluation.metrics import has_answer

    out = np.zeros((len(order_scores), len(KS)))
    for i, (sc, r) in enumerate(zip(order_scores, dev)):
        ids = r["p"]
        s = np.nan_to_num(np.asarray(sc[:len(ids)], dtype=np.float64), nan=-np.inf)
        order = np.argsort(-s, kind="stable")
        for j, k in enumerate(KS):
            out[i, j] = has_answer(" ".join(passages[ids[t]] for t in order[:k]), r["a"])
    return out


def boot(values: np.ndarray, rng: np.random.Generator, n: int = 1000) -> list[float]:
    idx = rng.integers(0, len(values), size=(n, len(values)))
    means = values[idx].mean(axis=1)
    return [round(float(np.percentile(means, 2.5)), 4), round(float(np.percentile(means, 97.5)), 4)]


def summarise(m: np.ndarray, rng) -> dict:
    return {f"AR@{k}": {"mean": round(float(m[:, j].mean()), 4), "ci95": boot(m[:, j], rng)}
            for j, k in enumerate(KS)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(ROOT / ".m22_gpu" / "data.json.gz"))
    ap.add_argument("--run", default=str(ROOT / ".m22_gpu" / "run1"))
    ap.add_argument("--ce", default=None, help="cross-encoder folder to score the candidates with")
    ap.add_argument("--ce-questions", type=int, default=None,
                    help="score the cross-encoder on the first N questions only (CPU budget)")
    ap.add_argument("--ce-scores", default=None, help=".npy of CE scores in candidate order (skips --ce)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "postrank_fid_minilm.json"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from squad_ce_model import cpu_flags

    from funnel_core.evaluation.metrics import has_answer, normalize_answer

    with gzip.open(args.data, "rt", encoding="utf-8") as f:
        data = json.load(f)
    passages = data["passages"]
    run = Path(args.run)
    z = np.load(run / "fid_dev.npz")
    stats, legacy = z["stats"], z["legacy"]
    dev = data["dev"][:len(stats)]
    rng = np.random.default_rng(args.seed)
    systems: dict[str, np.ndarray] = {}
    n = data["meta"]["n_passages"]
    systems["bm25"] = np.tile(-np.arange(n, dtype=np.float64), (len(dev), 1))
    systems["random"] = np.random.default_rng(args.seed).random((len(dev), n))
    ce_info = None
    if args.ce_scores or args.ce:
        if args.ce_scores:
            flat = np.load(args.ce_scores)
            info_path = Path(args.ce_scores).with_suffix(".json")
            ce_info = json.loads(info_path.read_text()) if info_path.exists() else None
        else:
            from score_pairs import score
            sub = dev[:args.ce_questions] if args.ce_questions else dev
            qi = np.array([i for i, r in enumerate(sub) for _ in r["p"]])
            pi = np.array([j for r in sub for j in r["p"]])
            flat, ce_info = score([r["q"] for r in sub], passages, qi, pi, args.ce, batch_size=32,
                                  device="cpu")
        n_ce = 0
        pos = 0
        ce = np.full((len(dev), n), np.nan)
        for i, r in enumerate(dev):
            if pos + len(r["p"]) > len(flat):
                break
            ce[i, :len(r["p"])] = flat[pos:pos + len(r["p"])]
            pos += len(r["p"])
            n_ce = i + 1
        systems["cross_encoder"] = ce
    fid = schemes(stats, legacy)
    if "log_stats" in z.files:
        fid.update(log_schemes(z["log_stats"]))
    allsys = {**systems, **{f"fid_{k}": v for k, v in fid.items()}}
    ar = {name: ar_matrix(s, dev, passages) for name, s in allsys.items()}
    ar["oracle_any_of_n"] = np.array([[float(has_answer(" ".join(passages[j] for j in r["p"]), r["a"]))]
                                      * len(KS) for r in dev])
    full = {name: summarise(m, rng) for name, m in ar.items() if name != "cross_encoder"}
    subset, paired = {}, {}
    if "cross_encoder" in ar:
        sub = {name: m[:n_ce] for name, m in ar.items()}
        subset = {name: summarise(m, rng) for name, m in sub.items()}
        for name in ("fid_mean", "fid_max_tokens", "fid_averaged_map_top4", "bm25"):
            d = sub[name] - sub["cross_encoder"]
            paired[f"{name} - cross_encoder"] = {f"AR@{k}": {"mean": round(float(d[:, j].mean()), 4),
                                                             "ci95": boot(d[:, j], rng)}
                                                 for j, k in enumerate(KS)}
    eq3 = fid["mean"]
    diagnostics = {"eq3_score_coefficient_of_variation_across_candidates_mean":
                   round(float(np.nanmean(np.nanstd(eq3, axis=1) / np.nanmean(eq3, axis=1))), 4),
                   "mean_attention_per_passage_token_all": float(np.nanmean(stats[:, :, 2].astype(np.float64))),
                   "note": "a coefficient of variation near 0 means the first decoder step attends almost "
                           "uniformly to the candidates"}
    summary_path = run / "summary.json"
    gpu = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    em = None
    if gpu.get("fid_dev", {}).get("answers"):
        answers = gpu["fid_dev"]["answers"]
        em = round(float(np.mean([normalize_answer(a or "") in {normalize_answer(x) for x in r["a"]}
                                  for a, r in zip(answers, dev)])), 4)
    log = (run / "log.txt").read_text() if (run / "log.txt").exists() else ""
    out = {"benchmark": "FiD (MiniLM BERT2BERT) cross-attention vs SQuAD cross-encoder as post-ranker, SQuAD dev-a",
           "command": "python benchmarks/fid_l2g_report.py " + " ".join(sys.argv[1:]),
           "questions": len(dev), "candidates_per_question": n,
           "candidates": "BM25 top-n passages of the large SQuAD corpus (train + dev-a articles)",
           "data_meta": data["meta"], "fid_exact_match": em,
           "fid_training": gpu.get("fid_training"), "gpu_run": {k: v for k, v in gpu.items() if k not in ("fid_dev", "fid_training")},
           "gpu_log": log[-3000:], "layers_heads": list(stats.shape[3:]), "diagnostics": diagnostics,
           "ce_model": args.ce or args.ce_scores, "ce_scoring": ce_info,
           "results_all_questions": full,
           "with_cross_encoder": {"questions": n_ce if subset else 0,
                                  "note": ("all questions" if n_ce == len(dev) else
                                           f"the first {n_ce} questions of the same seeded sample (the cross-encoder's scoring was capped)"),
                                  "results": subset, "paired_vs_cross_encoder": paired},
           "bootstrap": "1,000 resamples of questions, 95% percentile interval", "load_average": os.getloadavg(),
           "fid_device": f"{gpu.get('gpu') or gpu.get('device')} (device machine), {gpu.get('autocast') or 'fp32'} autocast; see gpu_log",
           "report_cpu_flags": cpu_flags()}
    Path(args.out).write_text(json.dumps(out, indent=1), encoding="utf-8")
    for name, r in (subset or full).items():
        print(f"{name:32s} " + "  ".join(f"{k} {v['mean']:.3f}" for k, v in r.items()))
    print("EM", em)


if __name__ == "__main__":
    main()
