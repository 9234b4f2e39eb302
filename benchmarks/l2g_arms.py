"""The two training arms of ``bench_l2g_squad.py`` (docs/prerank.md, "L2G on SQuAD"): their groups from the
teacher's cached passage scores and the answers, the student's init, and the training of each arm.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
from common import load_average

from funnel_core.train import CrossEncoderTrainer, init_cross_encoder, l2g_group
from funnel_core.train.l2g import aggregate_passage_scores


def training_groups(args, corpus, qs, cands, teacher, hits) -> tuple[list, list, dict]:
    """L2G groups (positives: the documents holding an answer and the teacher's top by aggregated passage
    scores) and label-only groups (positives: the documents holding an answer) over each question's BM25
    candidates with teacher scores, and their statistics."""
    docs, l2g, labels = corpus.documents, [], []
    n_psg = n_cached = teacher_top_is_hit = no_teacher = 0
    for q, cand in zip(qs, cands):
        ts, psg = teacher.get(q.id, {}), [pi for d in cand for pi in corpus.passages_of_doc[d]]
        scored = [corpus.passages[pi].rescored(ts[pi], "teacher") for pi in psg if pi in ts]
        n_psg, n_cached = n_psg + len(psg), n_cached + len(scored)
        if not scored:
            no_teacher += 1
            continue
        agg = aggregate_passage_scores(scored, args.alpha)
        teacher_top_is_hit += hits(q.answers, max(cand, key=lambda d: agg.get(docs[d].id, -np.inf)))
        for groups, top_k in ((l2g, args.top_k), (labels, 0)):  # eq. 5 with top_k = 0: positives = hits only
            g = l2g_group(q.question, [docs[d] for d in cand], scored, q.answers, alpha=args.alpha, top_k=top_k,
                          query_id=q.id)
            if g is not None:
                groups.append(g)
    mean_positives = lambda groups: float(np.mean([len(g.positives) for g in groups])) if groups else 0.0
    return l2g, labels, {
        "train_questions": len(qs), "questions_without_teacher_scores": no_teacher,
        "passages_of_candidates": n_psg, "passages_with_cached_teacher_score": n_cached,
        "l2g_groups": len(l2g), "label_groups": len(labels),
        "l2g_mean_positives": mean_positives(l2g), "label_mean_positives": mean_positives(labels),
        "teacher_top1_document_contains_answer": teacher_top_is_hit / max(1, len(qs) - no_teacher)}


def train_arms(args, arms: dict[str, list]) -> dict[str, dict]:
    """The student's init and its two arms (folders under --work), each trained once (--reuse: kept)."""
    from funnel_core.testing import minilm_path

    init_dir = args.work / "init"
    if not (args.reuse and (init_dir / "config.json").is_file()):
        if args.init_from is not None:
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
    for arm, groups in arms.items():
        out_dir = args.work / ("l2g" if arm == "L2G" else "labels")
        done = out_dir / "training.json"
        if not (args.reuse and done.is_file()):
            args.work.mkdir(parents=True, exist_ok=True)
            log = out_dir.with_suffix(".log.jsonl")
            log.unlink(missing_ok=True)
            la0 = load_average()
            r = CrossEncoderTrainer(model=init_dir, log_path=log, **train_kw).train(groups, out_dir)
            done.write_text(json.dumps({**json.loads(done.read_text()), "load_average_before": la0,
                                        "load_average_after": load_average()}, indent=1))
            print(f"{arm}: {r.steps} steps in {r.seconds:.0f}s, loss {r.first_last_loss(10)}", flush=True)
        rep = json.loads(done.read_text())
        training[arm] = {k: rep.get(k) for k in ("steps", "planned_steps", "seconds", "stopped_early", "groups",
                                                  "losses", "load_average_before", "load_average_after")}
        training[arm]["first_last_loss_mean10"] = [float(np.mean(rep["losses"][:10])),
                                                   float(np.mean(rep["losses"][-10:]))]
    return training
