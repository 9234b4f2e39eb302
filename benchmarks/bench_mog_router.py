"""What the MoG router chooses, and what changes it: label tie rules, a minimum-margin rule, and
the paper's raw-score selection (eq. 1, k_r = 3) against per-level max normalisation.

Same split as ``bench_mog.py``: SQuAD v1.1 dev-a, articles at even positions train the router
(soft labels from the gold answers' hit rate), articles at odd positions are the evaluation
corpus and questions. For every label variant a router is trained; for every selection variant
the test questions are retrieved (top 1 and top 3). Reported per variant: answer recall @1/@3,
words @1/@3, the label distribution (best level per training question) and the router's chosen
level per test question. Fixed single levels are the baselines.

    nice -n 10 python benchmarks/bench_mog_router.py --data /work/shared/data [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from funnel_core.embeddings import SentenceEmbedder  # noqa: E402
from funnel_core.evaluation import has_answer, load_squad  # noqa: E402
from funnel_core.granularity import (  # noqa: E402
    MOG_PRESETS,
    GranularityBM25,
    GranularityRouter,
    MixOfGranularityRetrieve,
    MultiGranularityChunker,
    level_choice_counts,
    level_similarities,
    soft_labels,
)
from funnel_core.hardware import describe  # noqa: E402
from funnel_core.text import count_tokens  # noqa: E402

LABEL_VARIANTS = {  # name -> soft_labels kwargs
    "paper_ties_finer": {"tolerance": 0.0, "ties": "finer"},
    "tolerance_0.25_finer": {"tolerance": 0.25, "ties": "finer"},
    "ties_coarser": {"tolerance": 0.0, "ties": "coarser"},
}
SELECTION_VARIANTS = {  # name -> (preset, level_margin)
    "paper": ("paper", 0.0),
    "paper_margin_0.2": ("paper", 0.2),
    "paper_margin_0.5": ("paper", 0.5),
    "normalised": ("normalised", 0.0),
}


def cpu_flags() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return sorted(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in have)
    except OSError:
        pass
    return []


def evaluate(results_of, questions):
    ar1 = ar3 = w1 = w3 = 0.0
    for res, q in zip(results_of, questions):
        texts = [u.text for u in res]
        ar1 += bool(texts) and has_answer(texts[0], q.answers)
        ar3 += has_answer(" ".join(texts[:3]), q.answers)
        w1 += count_tokens(texts[0]) if texts else 0
        w3 += sum(count_tokens(t) for t in texts[:3])
    n = len(questions)
    return {"AR@1": ar1 / n, "AR@3": ar3 / n, "words@1": w1 / n, "words@3": w3 / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", default=os.environ.get("FUNNEL_DATA", str(ROOT.parent / "shared" / "data")))
    ap.add_argument("--quick", action="store_true", help="300 questions per half")
    ap.add_argument("--chunk-size", type=int, default=32)
    ap.add_argument("--n-gra", type=int, default=5)
    ap.add_argument("--patience", type=int, default=10)
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "mog_router.json"))
    args = ap.parse_args()
    t_start = time.perf_counter()
    import torch

    torch.set_num_threads(args.torch_threads)
    articles = load_squad(Path(args.data) / "squad" / "squad-v1.1-dev-a.json")
    train_arts, test_arts = articles[0::2], articles[1::2]
    docs = lambda arts: ["\n\n".join(a.paragraphs) for a in arts]  # noqa: E731
    train_q = [q for a in train_arts for q in a.questions]
    test_q = [q for a in test_arts for q in a.questions]
    if args.quick:
        rng = np.random.default_rng(0)
        train_q = [train_q[i] for i in sorted(rng.choice(len(train_q), 300, replace=False))]
        test_q = [test_q[i] for i in sorted(rng.choice(len(test_q), 300, replace=False))]
    chunker = MultiGranularityChunker(chunk_size=args.chunk_size, n_gra=args.n_gra)
    train_idx = GranularityBM25(chunker.split(docs(train_arts)))
    test_idx = GranularityBM25(chunker.split(docs(test_arts)))
    embedder = SentenceEmbedder(batch_size=64)
    cache: dict = {}

    qs = [q.question for q in train_q]
    refs = [min(q.answers, key=len) for q in train_q]
    t0 = time.perf_counter()
    sims = level_similarities(qs, refs, train_idx, similarity="hit")
    sim_seconds = time.perf_counter() - t0

    out: dict = {
        "benchmark": "MoG router choices and selection variants, SQuAD v1.1 dev-a (train half -> test half)",
        "command": "python benchmarks/bench_mog_router.py " + " ".join(sys.argv[1:]),
        "args": vars(args), "n_train_questions": len(train_q), "n_test_questions": len(test_q),
        "presets": MOG_PRESETS, "label_variants": LABEL_VARIANTS,
        "selection_variants": {k: list(v) for k, v in SELECTION_VARIANTS.items()},
        "machine": {"cpu_count": os.cpu_count(), "loadavg_start": os.getloadavg(),
                    "cpu_flags": cpu_flags(), "python": platform.python_version(),
                    "torch_capability": torch.backends.cpu.get_cpu_capability()},
        "similarity_seconds": sim_seconds, "fixed_levels": {}, "routers": {},
    }
    tq = [q.question for q in test_q]
    for j in range(1, args.n_gra + 1):
        out["fixed_levels"][f"level_{j}"] = evaluate([test_idx.search_level(q, j, 3) for q in tq], test_q)
    print(json.dumps(out["fixed_levels"], indent=1), flush=True)
    uniform = {name: evaluate([MixOfGranularityRetrieve.from_preset(preset, test_idx, None,
                                                                   level_margin=margin).retrieve(q, k=3)
                                for q in tq], test_q)
               for name, (preset, margin) in SELECTION_VARIANTS.items() if margin == 0}
    out["uniform_weights"] = uniform
    for lname, lkw in LABEL_VARIANTS.items():
        labels = soft_labels(sims, **lkw)
        keep = labels.sum(1) > 0
        best = Counter(int(i) + 1 for i in labels[keep].argmax(1))
        router = GranularityRouter(args.n_gra, embedder=embedder, embedding_cache=cache)
        hist = router.fit([q for q, k in zip(qs, keep) if k], labels[keep], val_fraction=0.2,
                          lr=1e-3, patience=args.patience, seed=0)
        w = router.predict(tq)
        entry = {"n_labelled": int(keep.sum()),
                 "best_level_label_distribution": [best.get(j, 0) for j in range(1, args.n_gra + 1)],
                 "epochs_run": hist["epochs_run"], "best_val_bce": hist["best_val_loss"],
                 "mean_test_weights": [float(x) for x in w.mean(0)], "selection": {}}
        for sname, (preset, margin) in SELECTION_VARIANTS.items():
            mog = MixOfGranularityRetrieve.from_preset(preset, test_idx, router, level_margin=margin)
            res = [mog.retrieve(q, k=3, weights=wi) for q, wi in zip(tq, w)]
            entry["selection"][sname] = {**evaluate(res, test_q),
                                         "chosen_level_counts": level_choice_counts(w, margin)}
        out["routers"][lname] = entry
        print(lname, json.dumps(entry), flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
    out["seconds_total"] = time.perf_counter() - t_start
    out["machine"]["loadavg_end"] = os.getloadavg()
    out["hardware"] = describe()  # CPU flags and the precisions the models ran in
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out} in {out['seconds_total']:.0f} s")


if __name__ == "__main__":
    main()
