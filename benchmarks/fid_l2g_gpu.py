"""Train the MiniLM FiD reader, score dev-a with its cross-attention, run L2G: one self-contained job.

    python benchmarks/fid_l2g_gpu.py --data DATA.json.gz --minilm MINILM_DIR --out OUT_DIR

Reads the bundle of ``benchmarks/fid_l2g_data.py`` and needs only torch, transformers, numpy and
this package (no bm25s), so it runs on a GPU machine or a CPU (``--device cpu`` with small
``--fid-train``/``--dev``/time caps). Steps, each with a wall-clock cap:

1. **FiD reader**: ``init_fid_from_encoder(MiniLM)`` (BERT2BERT warm start) then
   ``train_fid`` on ``fid_train`` (gold passage + BM25 hard negatives, ``n_passages`` each).
2. **Post-ranker on dev-a**: ``FiDAttentionScorer`` loads the checkpoint with ``from_pretrained``;
   for every dev question the first decoder token's cross-attention over its BM25 top-n passages
   is reduced to per-(layer, head, passage) statistics: the mean of the top-1 / top-4 passage
   tokens and of all of them, with and without the question's tokens, and the legacy
   averaged-map top-4 (heads and layers averaged first). From these every Table 7 scheme and the
   Table 8 query ablation are computed afterwards (``fid_l2g_report.py``). The generated answer is
   kept for the exact-match sanity figure.
3. **L2G** (FunnelRAG eqs. 4-6): the FiD teacher scores the BM25 top-n passages of ``l2g_train``
   questions (eq. 3: top-4 tokens per layer and head, averaged); ``l2g_group`` aggregates them to
   documents (eq. 4, alpha 0.5) and takes hits + the top-1 document as positives (eq. 5);
   ``CrossEncoderTrainer(loss="bpr")`` (eq. 6) trains a MiniLM cross-encoder on them. The
   control arm trains the same way on the answer labels alone (hits positive, rest negative).
   A document is represented in training by its best-BM25 retrieved passage (a 100-word window);
   on dev-a each candidate document is scored MaxP over all its windows.
4. **Scores on dev-a** for the pre-ranker candidates (BM25 top documents x their windows) of the
   untrained init and both arms, and for the post-ranker candidates.

Writes ``OUT/fid_dev.npz``, ``OUT/l2g_scores.npz`` and ``OUT/summary.json``; checkpoints go to
``--work`` (never into the repository).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
for p in (str(HERE), str(HERE.parent)):
    if p not in sys.path:
        sys.path.insert(0, p)

#: statistic names stored per (question, passage, variant, layer, head)
VARIANTS = ("top1", "top4", "all", "top1_q", "top4_q", "all_q")


def passage_stats(attn, inputs, lr: int = 4):
    """``[n_passages, len(VARIANTS), L, H]`` statistics and ``[n_passages, 2]`` averaged-map top-lr."""
    import torch

    out = np.zeros((len(inputs.lengths), len(VARIANTS), attn.shape[0], attn.shape[1]), np.float32)
    legacy = np.zeros((len(inputs.lengths), 2), np.float32)
    pos = 0
    for k, (n, pm, qm) in enumerate(zip(inputs.lengths, inputs.passage_mask, inputs.query_mask)):
        a = attn[:, :, pos:pos + n]
        for j, mask in enumerate((pm, pm | qm)):
            sel = a[:, :, mask]                                   # [L, H, T]
            if sel.shape[-1] == 0:
                continue
            t = sel.shape[-1]
            out[k, 3 * j + 0] = sel.max(dim=-1).values.numpy()
            out[k, 3 * j + 1] = sel.topk(min(lr, t), dim=-1).values.mean(dim=-1).numpy()
            out[k, 3 * j + 2] = sel.mean(dim=-1).numpy()
            avg = sel.mean(dim=(0, 1))
            legacy[k, j] = float(avg.topk(min(lr, t)).values.mean())
        pos += n
    del torch
    return out, legacy


def fid_scan(scorer, rows, passages, titles, *, answers: bool, max_seconds: float, log_every=200):
    """Run the FiD over each row's passages; return stats, legacy scores, answers, rows done."""
    stats, legacy, texts = [], [], []
    t0 = time.perf_counter()
    for i, r in enumerate(rows):
        inputs = scorer.build_inputs(r["q"], [passages[j] for j in r["p"]], [titles[j] for j in r["p"]])
        states = scorer.encode(inputs)
        dec, ans = scorer._decoder_prefix(states)
        attn = scorer.cross_attention(states, dec).float().cpu()
        s, lg = passage_stats(attn, inputs)
        stats.append(s)
        legacy.append(lg)
        texts.append(ans if answers else None)
        if log_every and (i + 1) % log_every == 0:
            print(f"  fid scan {i + 1}/{len(rows)} {time.perf_counter() - t0:.0f} s", flush=True)
        if time.perf_counter() - t0 > max_seconds:
            break
    # BM25 can return fewer than n passages (short queries): pad with NaN
    width = max(len(x) for x in stats)
    pad = lambda a: np.concatenate([a, np.full((width - len(a),) + a.shape[1:], np.nan, a.dtype)])
    return (np.stack([pad(x) for x in stats]), np.stack([pad(x) for x in legacy]), texts,
            time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--minilm", required=True, help="folder of all-MiniLM-L6-v2 (any dtype)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/m22_work")
    ap.add_argument("--device", default=None)
    ap.add_argument("--fid-train", type=int, default=None, help="use only the first N fid_train rows")
    ap.add_argument("--fid-seconds", type=float, default=150)
    ap.add_argument("--fid-batch", type=int, default=16)
    ap.add_argument("--fid-lr", type=float, default=1e-4)
    ap.add_argument("--dev", type=int, default=None)
    ap.add_argument("--dev-seconds", type=float, default=100)
    ap.add_argument("--l2g-train", type=int, default=None)
    ap.add_argument("--teacher-seconds", type=float, default=60)
    ap.add_argument("--ce-seconds", type=float, default=40)
    ap.add_argument("--max-length", type=int, default=192)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch
    import transformers
    from score_pairs import score as score_pairs
    from transformers import AutoModel, AutoTokenizer

    from funnel_core.evaluation.metrics import has_answer
    from funnel_core.rerank.fid import FiDAttentionScorer
    from funnel_core.train import CrossEncoderTrainer, init_cross_encoder, l2g_group
    from funnel_core.train.fid import FiDExample, init_fid_from_encoder, train_fid
    from funnel_core.units import Unit

    transformers.logging.set_verbosity_error()
    t_start = time.perf_counter()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    bf16 = device.startswith("cuda")
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.data, "rt", encoding="utf-8") as f:
        data = json.load(f)
    passages, titles = data["passages"], data["titles"]
    n_pass = data["meta"]["n_passages"]
    summary = {"device": device, "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else None,
               "torch": torch.__version__, "transformers": transformers.__version__,
               "platform": platform.platform(), "cpu_count": os.cpu_count(), "args": vars(args),
               "data_meta": data["meta"], "bf16_autocast": bf16}

    # fp32 MiniLM (the carried copy may be fp16)
    m32 = work / "minilm32"
    AutoModel.from_pretrained(args.minilm).float().save_pretrained(m32)
    AutoTokenizer.from_pretrained(args.minilm).save_pretrained(m32)

    # 1. FiD reader
    fid_rows = data["fid_train"][:args.fid_train] if args.fid_train else data["fid_train"]
    examples = [FiDExample(question=r["q"], answers=r["a"],
                           passages=[(titles[j], passages[j]) for j in r["p"]]) for r in fid_rows]
    init = init_fid_from_encoder(m32, work / "fid_init", seed=args.seed)
    res = train_fid(init, examples, work / "fid", n_passages=n_pass, epochs=1,
                    batch_size=args.fid_batch, learning_rate=args.fid_lr, max_length=args.max_length,
                    answer_max_length=24, device=device, seed=args.seed, progress=False,
                    max_seconds=args.fid_seconds, bf16=bf16)
    k = 50
    curve = [{"step": i + 1, "loss": float(np.mean(res.step_losses[max(0, i + 1 - k):i + 1]))}
             for i in range(0, len(res.step_losses), k)]
    summary["fid_training"] = {"examples_available": len(examples), "steps": res.steps,
                               "examples_seen": min(len(examples), res.steps * args.fid_batch),
                               "seconds": res.seconds, "stopped_early": res.stopped_early,
                               "batch_size": args.fid_batch, "learning_rate": args.fid_lr,
                               "n_passages": n_pass, "max_length": args.max_length,
                               "loss_curve_mean50": curve,
                               "loss_first50": float(np.mean(res.step_losses[:50])),
                               "loss_last50": float(np.mean(res.step_losses[-50:]))}
    print(json.dumps(summary["fid_training"])[:400], flush=True)

    # 2. dev-a post-ranking statistics + answers
    scorer = FiDAttentionScorer(model=str(work / "fid"), return_answer=True, max_answer_tokens=16,
                                device=device, batch_size=32, max_length=args.max_length,
                                fp16=False)
    dev = data["dev"][:args.dev] if args.dev else data["dev"]
    stats, legacy, answers, secs = fid_scan(scorer, dev, passages, titles, answers=True,
                                            max_seconds=args.dev_seconds)
    np.savez_compressed(out / "fid_dev.npz", stats=stats.astype(np.float16), legacy=legacy,
                        variants=np.array(VARIANTS))
    summary["fid_dev"] = {"questions": len(answers), "seconds": secs,
                          "layers": int(stats.shape[2]), "heads": int(stats.shape[3]),
                          "answers": answers}
    print(f"dev scan: {len(answers)} questions in {secs:.0f} s", flush=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")  # kept if a later step fails

    # 3. L2G teacher scores -> groups
    scorer.return_answer = False
    l2g_rows = data["l2g_train"][:args.l2g_train] if args.l2g_train else data["l2g_train"]
    tstats, _, _, tsecs = fid_scan(scorer, l2g_rows, passages, titles, answers=False,
                                   max_seconds=args.teacher_seconds)
    teacher = tstats[:, :, VARIANTS.index("top4")].mean(axis=(2, 3))    # eq. 3 [q, n]
    dop = data["doc_of_passage"]
    l2g_groups, label_groups = [], []
    for r, sc in zip(l2g_rows, teacher):
        rep = {}
        for j in r["p"]:
            rep.setdefault(dop[j], j)          # best-BM25 retrieved window of each document
        docs = [Unit(id=str(d), text=passages[j]) for d, j in rep.items()]
        ps = [Unit(id=f"p{j}", text=passages[j], parent_id=str(dop[j]), score=float(s))
              for j, s in zip(r["p"], sc)]
        g = l2g_group(r["q"], docs, ps, r["a"], alpha=0.5, top_k=1, query_id=r.get("id"))
        if g is not None:
            l2g_groups.append(g)
        hits = [d.text for d in docs if has_answer(d.text, r["a"])]
        rest = [d.text for d in docs if not has_answer(d.text, r["a"])]
        if hits and rest:
            from funnel_core.train import TrainingGroup
            label_groups.append(TrainingGroup(query=r["q"], positives=hits, negatives=rest,
                                              query_id=r.get("id")))
    np.save(out / "l2g_teacher.npy", teacher.astype(np.float32))
    summary["l2g_teacher"] = {"questions": len(teacher), "seconds": tsecs,
                              "l2g_groups": len(l2g_groups), "label_groups": len(label_groups)}
    print(json.dumps(summary["l2g_teacher"]), flush=True)

    ce_init = init_cross_encoder(m32, work / "ce_init", seed=args.seed)
    arms = {}
    for name, groups in (("l2g", l2g_groups), ("labels", label_groups)):
        trainer = CrossEncoderTrainer(model=ce_init, loss="bpr", max_length=args.max_length,
                                      learning_rate=5e-5, head_learning_rate=5e-4, num_negatives=4,
                                      queries_per_step=16, epochs=1, bf16=bf16, device=device,
                                      max_seconds=args.ce_seconds, seed=args.seed,
                                      show_progress=False)
        rep = trainer.train(groups, work / f"ce_{name}")
        losses = rep.losses
        arms[name] = {"groups": len(groups), "steps": rep.steps, "seconds": rep.seconds,
                      "stopped_early": rep.stopped_early,
                      "loss_first20": float(np.mean(losses[:20])), "loss_last20": float(np.mean(losses[-20:])),
                      "loss_curve_mean20": [float(np.mean(losses[i:i + 20])) for i in range(0, len(losses), 20)]}
        print(name, json.dumps({k: v for k, v in arms[name].items() if "curve" not in k}), flush=True)
    summary["l2g_arms"] = arms

    # 4. dev scores: pre-ranker candidates (documents' windows) and post-ranker candidates
    pod = data["passages_of_doc"]
    qs = [r["q"] for r in dev]
    pre_qi, pre_pi = [], []
    for i, r in enumerate(dev):
        for d in r["docs"]:
            for j in pod[d]:
                pre_qi.append(i)
                pre_pi.append(j)
    post_qi = [i for i, r in enumerate(dev) for _ in r["p"]]
    post_pi = [j for r in dev for j in r["p"]]
    scores = {"pre_qi": np.array(pre_qi, np.int32), "pre_pi": np.array(pre_pi, np.int32),
              "post_qi": np.array(post_qi, np.int32), "post_pi": np.array(post_pi, np.int32)}
    timing = {}
    for name, folder in (("init", ce_init), ("l2g", work / "ce_l2g"), ("labels", work / "ce_labels")):
        for part, qi, pi in (("pre", pre_qi, pre_pi), ("post", post_qi, post_pi)):
            s, info = score_pairs(qs, passages, np.array(qi), np.array(pi), str(folder),
                                  batch_size=512, max_length=args.max_length, device=device,
                                  log_every=0)
            scores[f"{part}_{name}"] = s
            timing[f"{part}_{name}"] = info["seconds"]
    np.savez_compressed(out / "l2g_scores.npz", **scores)
    summary["dev_scoring_seconds"] = timing
    summary["total_seconds"] = time.perf_counter() - t_start
    (out / "summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    print(f"done in {summary['total_seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
