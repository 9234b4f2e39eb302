"""L2G (FunnelRAG eqs. 4-6) on real data: distil the post-ranker into the document pre-ranker.

    nice -n 10 python benchmarks/bench_l2g_squad.py            # ~60 min on 2 busy CPU cores
    python benchmarks/bench_l2g_squad.py --quick               # smoke run, a few minutes

The method (teacher scores read from ``bench_squad_large.py``'s score cache, the L2G and label-only
arms, the student, answer recall at k_d = 1, 2, 3 with paired tests) is described in docs/prerank.md,
"L2G on SQuAD". Checkpoints go to ``models/l2g_squad/`` (gitignored); the JSON is rewritten after each
chunk of ``--eval-seconds``.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import numpy as np
from common import RESULTS, ROOT, load_average, parser, write_json
from l2g_arms import train_arms, training_groups
from pairs import CACHE, teacher_scores
from squad_large_data import REPORT_SEED, SQUAD_FILES, AnswerTexts, build_corpus
from trained import SQUAD_CE, require_model

from funnel_core.bm25 import BM25Index
from funnel_core.evaluation.stats import bootstrap_ci, mcnemar_exact, paired_bootstrap

CACHE_DIRS = [CACHE, Path("/work/cache/squad_large")]
KDS = (1, 2, 3)
REF = "teacher MaxP (reference)"
PAIRED = [("L2G", "label-only"), ("L2G", "init (before)"), ("label-only", "init (before)"),
          ("L2G", "BM25 order"), ("label-only", "BM25 order"), ("init (before)", "BM25 order")]
WHY_NOT_FID = ("The FiD reader was the intended teacher. The only FiD checkpoint (MiniLM BERT2BERT, "
               "trained 120 s on a GPU last session) was lost, and it ranked far worse than the "
               "cross-encoder (AR@1 0.112 vs 0.804, benchmarks/results/postrank_fid_minilm.json); this "
               "session has no GPU to train a better one. The teacher is therefore the funnel's actual "
               "post-ranker, the SQuAD-trained passage cross-encoder minilm-squad-ce.")
#: option, default (its type is the option's), help
OPTIONS = [("--n-train", 400, "train questions (the tuning sample)"),
           ("--train-docs", 8, "BM25 candidate documents per training question"),
           ("--n-dev", 1000, "dev-a questions at most (seeded prefix)"),
           ("--eval-docs", 5, "BM25 candidate documents the pre-ranker orders"),
           ("--max-length", 192, "tokens per (question, document) pair"),
           ("--steps", 40, "optimiser steps of each arm"), ("--queries-per-step", 2, None),
           ("--num-negatives", 3, None), ("--lr", 5e-5, None), ("--head-lr", 1e-3, None), ("--freeze-layers", 2, None),
           ("--alpha", 0.5, "eq. 4 weight of the max"),
           ("--top-k", 1, "eq. 5 documents taken as positives by teacher score"),
           ("--train-seconds", 600.0, "time cap of each training arm"),
           ("--eval-seconds", 2100.0, "time cap of the evaluation"),
           ("--chunk", 20, "dev questions per evaluation chunk"),
           ("--batch-size", 16, None), ("--bootstrap", 2000, None), ("--seed", 0, None)]


def order(scores) -> list[int]:
    """Positions best first; ties keep the BM25 order."""
    return sorted(range(len(scores)), key=lambda j: -scores[j])


def summarize(records: list[dict], systems: list[str], n_boot: int) -> dict:
    out: dict = {"n_questions": len(records), "systems": {}, "paired": {}}
    hits: dict[tuple[str, int], list[float]] = {}
    for name in systems:
        row: dict = {"n": sum(name in r["order"] for r in records)}
        for kd in KDS:
            h = hits[(name, kd)] = [float(any(r["hits"][j] for j in r["order"][name][:kd]))
                                    for r in records if name in r["order"]]
            row[f"recall@{kd}"] = float(np.mean(h)) if h else float("nan")
            row[f"recall@{kd}_ci95"] = list(bootstrap_ci(h, n_boot=n_boot, seed=0))
        row["top1_agrees_with_teacher_maxp"] = float(np.mean(
            [r["order"][name][0] == r["order"][REF][0] for r in records if REF in r["order"] and name in r["order"]]
            or [float("nan")]))
        out["systems"][name] = row
    for a, b in ((a, b) for a, b in PAIRED if a in systems and b in systems):
        for kd in KDS:
            x, y = hits[(a, kd)], hits[(b, kd)]
            if x:
                out["paired"][f"{a} - {b} @{kd}"] = {**paired_bootstrap(x, y, n_boot=n_boot, seed=0),
                                                     "mcnemar": mcnemar_exact(x, y)}
    return out


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--squad", type=Path, nargs="+", default=SQUAD_FILES)
    p.add_argument("--teacher", type=Path, default=SQUAD_CE, help="the post-ranker whose cached scores teach")
    p.add_argument("--work", type=Path, default=ROOT / "models" / "l2g_squad", help="checkpoints (gitignored)")
    for flag, default, help_ in OPTIONS:
        p.add_argument(flag, type=type(default), default=default, help=help_)
    p.add_argument("--reuse", action="store_true", help="reuse finished checkpoints under --work")
    p.add_argument("--init-from", type=Path, default=None,
                   help="start both arms from this cross-encoder folder (copied) instead of MiniLM + a new head")
    args = p.parse_args()
    if args.quick:
        args.n_train, args.n_dev, args.steps, args.max_length = 24, 10, 3, 64
        args.eval_docs, args.chunk, args.bootstrap = 3, 5, 200
        args.work = args.work.with_name(args.work.name + "_quick")
    out_path = args.out or RESULTS / ("l2g_squad_quick.json" if args.quick else "l2g_squad.json")
    t_start, load_start = time.perf_counter(), load_average()
    import torch

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    t0 = time.perf_counter()
    corpus = build_corpus(args.squad)
    docs = corpus.documents
    hits = AnswerTexts([d.text for d in docs])
    train_qs, dev_qs = corpus.tuning_sample()[:args.n_train], corpus.report_sample(args.n_dev)
    bm25 = BM25Index().index(docs)
    train_c, dev_c = ([[corpus.doc_index[u.id] for u in r] for r in bm25.search_many([q.question for q in qs], k=k)]
                      for qs, k in ((train_qs, args.train_docs), (dev_qs, args.eval_docs)))
    require_model(args.teacher, "teacher (SQuAD cross-encoder)")
    teacher, cache_path = teacher_scores(args.teacher, {q.id for q in train_qs + dev_qs}, CACHE_DIRS)
    print(f"{len(docs)} documents, {len(corpus.passages)} passages; {len(train_qs)} train, {len(dev_qs)} dev-a "
          f"questions; setup {time.perf_counter() - t0:.0f}s", flush=True)
    l2g_groups, label_groups, data_stats = training_groups(args, corpus, train_qs, train_c, teacher, hits)
    print(json.dumps(data_stats), flush=True)
    training = train_arms(args, {"L2G": l2g_groups, "label-only": label_groups})

    # -- evaluation on dev-a -------------------------------------------------------------------
    from funnel_core.rerank.cross_encoder import CrossEncoderScorer

    students = {"init (before)": args.work / "init", "L2G": args.work / "l2g", "label-only": args.work / "labels"}
    scorers = {n: CrossEncoderScorer(str(pth), library="transformers", max_length=args.max_length,
                                     batch_size=args.batch_size) for n, pth in students.items()}
    systems = ["BM25 order", *students, REF]
    records: list[dict] = []
    t_eval = time.perf_counter()
    init = (f"a copy of {args.init_from} (the passage cross-encoder, used on documents)" if args.init_from else
            f"all-MiniLM-L6-v2 encoder + random one-logit head (init_cross_encoder, seed {args.seed})")

    def write(complete: bool) -> None:
        write_json("l2g_squad", {
            "command": "nice -n 10 python benchmarks/bench_l2g_squad.py " + " ".join(sys.argv[1:]),
            "complete": complete,
            "args": {k: ([str(x) for x in v] if isinstance(v, list) else str(v) if isinstance(v, Path) else v)
                     for k, v in vars(args).items()},
            "corpus": {"files": [Path(f).name for f in args.squad], "documents": len(docs),
                       "passages": len(corpus.passages)},
            "teacher": {"model": str(args.teacher), "score_cache": cache_path,
                        "what": "SQuAD-trained MiniLM passage cross-encoder = the funnel's post-ranker in "
                                "bench_squad_large.py",
                        "why_not_fid": WHY_NOT_FID},
            "student": {"init": init + "; the same init for L2G and label-only; 'before' = this init",
                        "document_input": f"(question, document) truncated to {args.max_length} tokens"},
            "training_data": data_stats, "training": training,
            "evaluation": {"split": "dev-a", "sample": f"prefix of random.Random({REPORT_SEED}).sample(dev-a)",
                           "candidates": f"BM25 top-{args.eval_docs} documents",
                           "metric": "answer recall after pre-ranking: a top-k_d document contains a gold answer",
                           "teacher_maxp_reference_questions": sum(REF in r["order"] for r in records),
                           "pairs_scored": len(scorers) * sum(len(r["candidates"]) for r in records),
                           "seconds": time.perf_counter() - t_eval,
                           "bootstrap": f"{args.bootstrap} resamples of questions, 95% percentile"},
            "results": summarize(records, systems, args.bootstrap),
            "per_question": records,
            "torch_threads": torch.get_num_threads(),  # CPU facts: machine.hardware (write_json)
            "load_average_start": load_start, "load_average_now": load_average(),
            "wall_seconds": time.perf_counter() - t_start,
        }, out=out_path)

    for b in range(0, len(dev_qs), args.chunk):
        if time.perf_counter() - t_eval > args.eval_seconds:
            break
        for q, cands in zip(dev_qs[b:b + args.chunk], dev_c[b:b + args.chunk]):
            if not cands:
                continue
            rec: dict = {"id": q.id, "candidates": cands, "hits": [int(hits(q.answers, d)) for d in cands],
                         "scores": {}, "order": {"BM25 order": list(range(len(cands)))}}
            scores = {name: [float(x) for x in sc.score(q.question, [docs[d].text for d in cands])]
                      for name, sc in scorers.items()}
            ts = teacher.get(q.id, {})
            if all(pi in ts for d in cands for pi in corpus.passages_of_doc[d]):
                scores[REF] = [max(ts[pi] for pi in corpus.passages_of_doc[d]) for d in cands]
            for name, s in scores.items():
                rec["scores"][name], rec["order"][name] = [round(x, 4) for x in s], order(s)
            records.append(rec)
        print(f"eval {len(records)} questions, {time.perf_counter() - t_eval:.0f}s", flush=True)
        write(False)
    # the reference is summarised only on questions whose windows are all cached: drop it if some lack it
    if any(REF not in r["order"] for r in records):
        systems.remove(REF)
    write(True)


if __name__ == "__main__":
    sys.exit(main())
