"""Table 7 and Table 8 as the paper writes them, on the raw score alpha, with the trained reader.

    python benchmarks/fid_table7_cpu.py --data .gpu/data.json.gz --model models/fid-minilm \\
        --ce-scores CE_OUT/ce_post.npy --questions 300 --out benchmarks/results/fid_table7_alpha.json

The GPU job (``fid_l2g_gpu.py``) saved per-(layer, head, passage) means of the attention
probabilities, which cannot give Table 7 (ii) / (iii) as written (a max over layers or heads per
token, then a mean over all tokens). This script runs the restored reader
(``fid_ckpt_restore.py``) through :class:`~funnel_core.rerank.fid.FiDAttentionScorer` once per
question: one encoder pass, one decoder forward for alpha (``raw_scores``), then every scheme of
:func:`~funnel_core.rerank.fid.aggregate_cross_attention` on the same map, so the schemes differ
only in their aggregation. AR@1 / AR@4 per question with 95% bootstrap intervals and paired
intervals against the SQuAD cross-encoder scored on the same candidates (``--ce-scores``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from common import ROOT
from fid_l2g_report import ar_matrix

SCHEMES = {  # name: (aggregation, include_query_tokens)
    "fid_alpha_mean": ("mean", False),                 # (i) eq. 3
    "fid_alpha_max_layers": ("max_layers", False),     # (ii) as written: all tokens
    "fid_alpha_max_heads": ("max_heads", False),       # (iii) as written: all tokens
    "fid_alpha_max_tokens": ("max_tokens", False),     # (iv)
    "fid_alpha_last_k_layers": ("last_k_layers", False),  # (v), last 6 = all layers of MiniLM
    "fid_alpha_with_query": ("mean", True),            # Table 8: all q + p tokens, no selection
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--ce-scores", required=True)
    ap.add_argument("--questions", type=int, default=300)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fid_table7_alpha.json"))
    args = ap.parse_args()

    import torch

    from funnel_core.evaluation.stats import bootstrap_ci, paired_bootstrap
    from funnel_core.hardware import describe
    from funnel_core.rerank.fid import FiDAttentionScorer, aggregate_cross_attention

    with gzip.open(args.data, "rt", encoding="utf-8") as f:
        data = json.load(f)
    passages, titles = data["passages"], data["titles"]
    dev = data["dev"][: args.questions]
    ce_all = np.load(args.ce_scores).reshape(len(data["dev"]), -1)
    scorer = FiDAttentionScorer(model=args.model, dtype="float32")
    systems: dict[str, list[list[float]]] = {k: [] for k in SCHEMES}
    load = [os.getloadavg()[0]]
    t0 = time.perf_counter()
    for r in dev:
        inputs = scorer.build_inputs(r["q"], [passages[j] for j in r["p"]], [titles[j] for j in r["p"]])
        states = scorer.encode(inputs)
        dec, _ = scorer._decoder_prefix(states)
        alpha = scorer.raw_scores(states, dec)[0].float().cpu()
        for name, (agg, with_query) in SCHEMES.items():
            row, pos = [], 0
            for n, pm, qm in zip(inputs.lengths, inputs.passage_mask, inputs.query_mask):
                mask = pm | qm if with_query else pm
                row.append(aggregate_cross_attention(alpha[:, :, pos:pos + n], mask, aggregation=agg,
                                                     lr=None if with_query else 4))
                pos += n
            systems[name].append(row)
    seconds = time.perf_counter() - t0
    load.append(os.getloadavg()[0])
    del torch

    n_c = [len(r["p"]) for r in dev]
    ranks = dict(systems)
    ranks["bm25"] = [[-float(t) for t in range(n)] for n in n_c]
    ranks["cross_encoder"] = [list(ce_all[i, :n]) for i, n in enumerate(n_c)]
    results: dict[str, dict] = {}
    per_question: dict[str, dict[str, list[float]]] = {}
    for name, rows in ranks.items():
        results[name], per_question[name] = {}, {}
        m = ar_matrix(rows, dev, passages)          # AR@1..4 per question
        for k in (1, 4):
            v = m[:, k - 1]
            per_question[name][f"AR@{k}"] = v.tolist()
            results[name][f"AR@{k}"] = {"mean": float(v.mean()), "ci95": list(bootstrap_ci(v))}
    paired = {}
    for name in SCHEMES:
        paired[f"{name} - cross_encoder"] = {
            f"AR@{k}": paired_bootstrap(np.asarray(per_question[name][f"AR@{k}"]),
                                        np.asarray(per_question["cross_encoder"][f"AR@{k}"]))
            for k in (1, 4)}
    out = {"benchmark": "FiD Table 7 / Table 8 on raw alpha (paper's formulas), trained MiniLM BERT2BERT reader",
           "command": "python benchmarks/fid_table7_cpu.py " + " ".join(sys.argv[1:]),
           "questions": len(dev), "candidates": "BM25 top-10 passages (the GPU job's dev candidates)",
           "seconds": seconds, "load_average_before_after": load, "machine": describe(),
           "results": results, "paired_vs_cross_encoder": paired, "per_question": per_question}
    Path(args.out).write_text(json.dumps(out, indent=1), encoding="utf-8")
    for name, r in results.items():
        print(f"{name:28s} AR@1 {r['AR@1']['mean']:.3f}  AR@4 {r['AR@4']['mean']:.3f}")
    print(f"{seconds:.0f} s for {len(dev)} questions")


if __name__ == "__main__":
    main()
