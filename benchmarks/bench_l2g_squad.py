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
from common import ROOT, load_average, parser, write_json
from pairs import model_key, read_scores
from squad_large_data import SQUAD_FILES, AnswerTexts, build_corpus
from trained import SQUAD_CE, require_model

from funnel_core.bm25 import BM25Index
from funnel_core.evaluation.stats import bootstrap_ci, mcnemar_exact, paired_bootstrap
from funnel_core.train import CrossEncoderTrainer, TrainingGroup, init_cross_encoder, l2g_group
from funnel_core.train.l2g import aggregate_passage_scores

CACHE_DIRS = [ROOT / ".cache" / "squad_large", Path("/work/cache/squad_large")]
REPORT_SEED = 1          # bench_squad_large.py's dev-a permutation
KDS = (1, 2, 3)
WHY_NOT_FID = ("The FiD reader was the intended teacher. The only FiD checkpoint (MiniLM BERT2BERT, "
               "trained 120 s on a GPU last session) was lost, and it ranked far worse than the "
               "cross-encoder (AR@1 0.112 vs 0.804, benchmarks/results/postrank_fid_minilm.json); this "
               "session has no GPU to train a better one. The teacher is therefore the funnel's actual "
               "post-ranker, the SQuAD-trained passage cross-encoder minilm-squad-ce.")


def load_teacher_scores(teacher: Path, qids: set[str]) -> tuple[dict[str, dict[int, float]], str]:
    """The teacher's cached (question, passage index) scores of the questions ``qids``."""
    name = f"scores-{model_key(teacher)}.npz"
    path = next((d / name for d in CACHE_DIRS if (d / name).is_file()), None)
    if path is None:
        raise FileNotFoundError(f"no score cache {name} in {CACHE_DIRS}; run bench_squad_large.py "
                                "(--export-pairs / pairs.py / --import-scores) with this teacher first.")
    out: dict[str, dict[int, float]] = {}
    for (q, p), s in read_scores(path, qids).items():
        out.setdefault(q, {})[p] = s
    return out, str(path)


def order(scores: list[float]) -> list[int]:
    """Positions best first; ties keep the BM25 order."""
    return sorted(range(len(scores)), key=lambda j: -scores[j])


def summarize(records: list[dict], systems: list[str], n_boot: int) -> dict:
    out: dict = {"n_questions": len(records), "systems": {}, "paired": {}}
    hits: dict[tuple[str, int], list[float]] = {}
    for name in systems:
        row: dict = {"n": sum(name in r["order"] for r in records)}
        for kd in KDS:
            h = [float(any(r["hits"][j] for j in r["order"][name][:kd])) for r in records if name in r["order"]]
            hits[(name, kd)] = h
            row[f"recall@{kd}"] = float(np.mean(h)) if h else float("nan")
            row[f"recall@{kd}_ci95"] = list(bootstrap_ci(h, n_boot=n_boot, seed=0))
        row["top1_agrees_with_teacher_maxp"] = float(np.mean(
            [r["order"][name][0] == r["order"]["teacher MaxP (reference)"][0] for r in records
             if "teacher MaxP (reference)" in r["order"] and name in r["order"]] or [float("nan")]))
        out["systems"][name] = row
    pairs = [("L2G", "label-only"), ("L2G", "init (before)"), ("label-only", "init (before)"),
             ("L2G", "BM25 order"), ("label-only", "BM25 order"), ("init (before)", "BM25 order")]
    for a, b in pairs:
        if a not in systems or b not in systems:
            continue
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
    p.add_argument("--n-train", type=int, default=400, help="train questions (the tuning sample)")
    p.add_argument("--train-docs", type=int, default=8, help="BM25 candidate documents per training question")
    p.add_argument("--n-dev", type=int, default=1000, help="dev-a questions at most (seeded prefix)")
    p.add_argument("--eval-docs", type=int, default=5, help="BM25 candidate documents the pre-ranker orders")
    p.add_argument("--max-length", type=int, default=192, help="tokens per (question, document) pair")
    p.add_argument("--steps", type=int, default=40, help="optimiser steps of each arm")
    p.add_argument("--queries-per-step", type=int, default=2)
    p.add_argument("--num-negatives", type=int, default=3)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--head-lr", type=float, default=1e-3)
    p.add_argument("--freeze-layers", type=int, default=2)
    p.add_argument("--alpha", type=float, default=0.5, help="eq. 4 weight of the max")
    p.add_argument("--top-k", type=int, default=1, help="eq. 5 documents taken as positives by teacher score")
    p.add_argument("--train-seconds", type=float, default=600.0, help="time cap of each training arm")
    p.add_argument("--eval-seconds", type=float, default=2100.0, help="time cap of the evaluation")
    p.add_argument("--chunk", type=int, default=20, help="dev questions per evaluation chunk")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--bootstrap", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reuse", action="store_true", help="reuse finished checkpoints under --work")
    p.add_argument("--init-from", type=Path, default=None,
                   help="start both arms from this cross-encoder folder (copied) instead of MiniLM + a new head")
    args = p.parse_args()
    if args.quick:
        args.n_train, args.n_dev, args.steps, args.max_length = 24, 10, 3, 64
        args.eval_docs, args.chunk, args.bootstrap = 3, 5, 200
        args.work = args.work.with_name(args.work.name + "_quick")
    out_path = args.out or ROOT / "benchmarks" / "results" / ("l2g_squad_quick.json" if args.quick else "l2g_squad.json")
    t_start = time.perf_counter()
    load_start = load_average()
    import torch

    torch.manual_seed(args.seed)
    random.seed(args.seed)

    t0 = time.perf_counter()
    corpus = build_corpus(args.squad)
    docs, passages = corpus.documents, corpus.passages
    hits = AnswerTexts([d.text for d in docs])
    doc_index = {d.id: i for i, d in enumerate(docs)}
    train_qs = corpus.tuning_sample()[:args.n_train]
    dev_all = corpus.questions["dev-a"]
    dev_qs = random.Random(REPORT_SEED).sample(dev_all, len(dev_all))[:args.n_dev]
    bm25 = BM25Index().index(docs)
    train_c = [[doc_index[u.id] for u in r] for r in bm25.search_many([q.question for q in train_qs], k=args.train_docs)]
    dev_c = [[doc_index[u.id] for u in r] for r in bm25.search_many([q.question for q in dev_qs], k=args.eval_docs)]
    require_model(args.teacher, "teacher (SQuAD cross-encoder)")
    teacher, cache_path = load_teacher_scores(args.teacher, {q.id for q in train_qs + dev_qs})
    setup_seconds = time.perf_counter() - t0
    print(f"{len(docs)} documents, {len(passages)} passages; {len(train_qs)} train, {len(dev_qs)} dev-a "
          f"questions; setup {setup_seconds:.0f}s", flush=True)

    # -- training groups ---------------------------------------------------------------------
    l2g_groups, label_groups = [], []
    n_psg = n_cached = teacher_top_is_hit = no_teacher = 0
    for q, cands in zip(train_qs, train_c):
        ts = teacher.get(q.id, {})
        scored = []
        for d in cands:
            for pi in corpus.passages_of_doc[d]:
                n_psg += 1
                if pi in ts:
                    n_cached += 1
                    scored.append(passages[pi].rescored(ts[pi], "teacher"))
        if not scored:
            no_teacher += 1
            continue
        cand_units = [docs[d] for d in cands]
        agg = aggregate_passage_scores(scored, args.alpha)
        best = max(cands, key=lambda d: agg.get(docs[d].id, -np.inf))
        teacher_top_is_hit += hits(q.answers, best)
        g = l2g_group(q.question, cand_units, scored, q.answers, alpha=args.alpha, top_k=args.top_k,
                      query_id=q.id)
        if g is not None:
            l2g_groups.append(g)
        pos = [docs[d].text for d in cands if hits(q.answers, d)]
        neg = [docs[d].text for d in cands if not hits(q.answers, d)]
        if pos and neg:
            label_groups.append(TrainingGroup(q.question, pos, neg, q.id))
    data_stats = {
        "train_questions": len(train_qs), "questions_without_teacher_scores": no_teacher,
        "passages_of_candidates": n_psg, "passages_with_cached_teacher_score": n_cached,
        "l2g_groups": len(l2g_groups), "label_groups": len(label_groups),
        "l2g_mean_positives": float(np.mean([len(g.positives) for g in l2g_groups])) if l2g_groups else 0.0,
        "label_mean_positives": float(np.mean([len(g.positives) for g in label_groups])) if label_groups else 0.0,
        "teacher_top1_document_contains_answer": teacher_top_is_hit / max(1, len(train_qs) - no_teacher),
    }
    print(json.dumps(data_stats), flush=True)

    # -- student init and the two arms --------------------------------------------------------
    from funnel_core.testing import minilm_path

    init_dir = args.work / "init"
    if not (args.reuse and (init_dir / "config.json").is_file()):
        if args.init_from is not None:
            import shutil

            shutil.rmtree(init_dir, ignore_errors=True)
            shutil.copytree(args.init_from, init_dir, ignore=shutil.ignore_patterns("fp16", "*.jsonl"))
        else:
            init_cross_encoder(minilm_path(), init_dir, seed=args.seed)
    train_kw = dict(max_length=args.max_length, learning_rate=args.lr, head_learning_rate=args.head_lr,
                    epochs=1000, max_steps=args.steps, num_negatives=args.num_negatives,
                    queries_per_step=args.queries_per_step, loss="bpr", freeze_embeddings=True,
                    freeze_layers=args.freeze_layers, warmup_ratio=0.1, max_seconds=args.train_seconds,
                    seed=args.seed, show_progress=False, log_every=5)
    training = {}
    for arm, groups in (("L2G", l2g_groups), ("label-only", label_groups)):
        out_dir = args.work / ("l2g" if arm == "L2G" else "labels")
        done = out_dir / "training.json"
        if args.reuse and done.is_file():
            rep = json.loads(done.read_text())
        else:
            (out_dir.parent).mkdir(parents=True, exist_ok=True)
            log = out_dir.with_suffix(".log.jsonl")
            log.unlink(missing_ok=True)
            la0 = load_average()
            trainer = CrossEncoderTrainer(model=init_dir, log_path=log, **train_kw)
            r = trainer.train(groups, out_dir)
            rep = json.loads(done.read_text())
            rep["load_average_before"], rep["load_average_after"] = la0, load_average()
            done.write_text(json.dumps(rep, indent=1))
            print(f"{arm}: {r.steps} steps in {r.seconds:.0f}s, loss {r.first_last_loss(10)}", flush=True)
        training[arm] = {k: rep.get(k) for k in ("steps", "planned_steps", "seconds", "stopped_early", "groups",
                                                  "losses", "load_average_before", "load_average_after")}
        training[arm]["first_last_loss_mean10"] = [float(np.mean(rep["losses"][:10])), float(np.mean(rep["losses"][-10:]))]

    # -- evaluation on dev-a -------------------------------------------------------------------
    from funnel_core.rerank.cross_encoder import CrossEncoderScorer

    students = {"init (before)": init_dir, "L2G": args.work / "l2g", "label-only": args.work / "labels"}
    scorers = {n: CrossEncoderScorer(str(pth), library="transformers", max_length=args.max_length,
                                     batch_size=args.batch_size) for n, pth in students.items()}
    systems = ["BM25 order", *students, "teacher MaxP (reference)"]
    records: list[dict] = []
    t_eval = time.perf_counter()
    eval_pairs = 0

    def write(complete: bool) -> None:
        summary = summarize(records, systems, args.bootstrap)
        ref_n = sum("teacher MaxP (reference)" in r["order"] for r in records)
        write_json("l2g_squad", {
            "command": "nice -n 10 python benchmarks/bench_l2g_squad.py " + " ".join(sys.argv[1:]),
            "complete": complete,
            "args": {k: ([str(x) for x in v] if isinstance(v, list) else str(v) if isinstance(v, Path) else v)
                     for k, v in vars(args).items()},
            "corpus": {"files": [Path(f).name for f in args.squad], "documents": len(docs), "passages": len(passages)},
            "teacher": {"model": str(args.teacher), "score_cache": cache_path,
                        "what": "SQuAD-trained MiniLM passage cross-encoder = the funnel's post-ranker in bench_squad_large.py",
                        "why_not_fid": WHY_NOT_FID},
            "student": {"init": (f"a copy of {args.init_from} (the passage cross-encoder, used on documents)"
                                 if args.init_from else
                                 "all-MiniLM-L6-v2 encoder + random one-logit head (init_cross_encoder, seed "
                                 f"{args.seed})") + "; the same init for L2G and label-only; 'before' = this init",
                        "document_input": f"(question, document) truncated to {args.max_length} tokens"},
            "training_data": data_stats, "training": training,
            "evaluation": {"split": "dev-a", "sample": f"prefix of random.Random({REPORT_SEED}).sample(dev-a)",
                           "candidates": f"BM25 top-{args.eval_docs} documents",
                           "metric": "answer recall after pre-ranking: a top-k_d document contains a gold answer",
                           "teacher_maxp_reference_questions": ref_n, "pairs_scored": eval_pairs,
                           "seconds": time.perf_counter() - t_eval,
                           "bootstrap": f"{args.bootstrap} resamples of questions, 95% percentile"},
            "results": summary,
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
            texts = [docs[d].text for d in cands]
            for name, sc in scorers.items():
                s = sc.score(q.question, texts)
                eval_pairs += len(texts)
                rec["scores"][name] = [round(float(x), 4) for x in s]
                rec["order"][name] = order(s)
            ts = teacher.get(q.id, {})
            if all(pi in ts for d in cands for pi in corpus.passages_of_doc[d]):
                s = [max(ts[pi] for pi in corpus.passages_of_doc[d]) for d in cands]
                rec["scores"]["teacher MaxP (reference)"] = [round(x, 4) for x in s]
                rec["order"]["teacher MaxP (reference)"] = order(s)
            records.append(rec)
        print(f"eval {len(records)} questions, {time.perf_counter() - t_eval:.0f}s", flush=True)
        write(False)
    # the reference is summarised only on questions whose windows are all cached: drop it if some lack it
    if any("teacher MaxP (reference)" not in r["order"] for r in records):
        systems.remove("teacher MaxP (reference)")
    write(True)


if __name__ == "__main__":
    sys.exit(main())
