"""Cross-encoder inference runtimes on CPU: pairs per second and nDCG@10 on SciFact test (docs/performance.md).

The runtimes of :class:`~funnel_core.rerank.cross_encoder.CrossEncoderScorer` in two passes, interleaved
query by query: **speed** (BM25 top-``--timing-depth`` of the first ``--timing-queries`` test queries)
and **quality** (the ``--ndcg-runtimes`` rerank the BM25 top-``--depth`` of every test query); the
table in docs/performance.md says what each column is. Scores go to a cache file (``--cache``), so an
interrupted run resumes; the JSON is rewritten every ``--save-every`` queries. Model:
``models/minilm-scifact-ce`` unless ``--model`` names another::

    nice -n 10 python benchmarks/bench_ce_backends.py --data /work/shared/data --depth 100
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from common import ROOT, command_line, load_average, parser, save_json

from funnel_core.evaluation.stats import paired_bootstrap, percentile

RUNTIMES = {  # name -> CrossEncoderScorer keyword arguments
    "torch-fp32": {"runtime": "torch", "dtype": "float32"},
    "torch-bf16": {"runtime": "torch", "dtype": "bfloat16"},
    "onnx-fp32": {"runtime": "onnx"},
    "openvino": {"runtime": "openvino"},
}
TARGET_SPEEDUP = 2.0
TARGET_NDCG_LOSS = 0.005


def main() -> None:
    from trained import SCIFACT_CE, require_model

    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="cross-encoder folder (default: models/minilm-scifact-ce)")
    ap.add_argument("--depth", type=int, default=100, help="BM25 candidates reranked per query")
    ap.add_argument("--max-length", type=int, default=192)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--runtimes", default=",".join(RUNTIMES), help="runtimes timed")
    ap.add_argument("--ndcg-runtimes", default=",".join(RUNTIMES), help="runtimes run over every query for nDCG@10")
    ap.add_argument("--timing-queries", type=int, default=20)
    ap.add_argument("--timing-depth", type=int, default=None, help="default: --depth")
    ap.add_argument("--limit", type=int, default=None, help="first N test queries only")
    ap.add_argument("--export-dir", type=Path, default=ROOT / ".cache" / "ce_backends_export")
    ap.add_argument("--cache", type=Path, default=None, help="score cache (JSON lines)")
    ap.add_argument("--save-every", type=int, default=20)
    args = ap.parse_args()

    from funnel_core.bm25 import BM25Index
    from funnel_core.evaluation import ir_metrics, load_beir
    from funnel_core.hardware import describe
    from funnel_core.rerank.cross_encoder import CrossEncoderScorer
    from funnel_core.rerank.runtimes import choose_runtime, runtime_available

    load_before = load_average()
    model = str(require_model(args.model or SCIFACT_CE, "cross-encoder"))
    model_note = ("SciFact-trained MiniLM cross-encoder (funnel train benchmarks/train/scifact_ce.toml)"
                  if "scifact" in Path(model).name else f"NOT the SciFact-trained model: `{model}`, used zero-shot on SciFact")
    names = [n for n in args.runtimes.split(",") if n]
    ndcg_names = [n for n in args.ndcg_runtimes.split(",") if n]
    names += [n for n in ndcg_names if n not in names]
    timing_depth = args.timing_depth or args.depth
    if set(names) - set(RUNTIMES):
        raise SystemExit(f"unknown runtime {sorted(set(names) - set(RUNTIMES))}; choose from {list(RUNTIMES)}")
    skipped = {n: f"{RUNTIMES[n]['runtime']} package not installed" for n in names if not runtime_available(RUNTIMES[n]["runtime"])}
    names = [n for n in names if n not in skipped]
    ndcg_names = [n for n in ndcg_names if n in names]

    data = load_beir(Path(args.data) / "scifact", split="test")
    queries = data.split_queries()
    qids = sorted(queries)[: args.limit] if args.limit else sorted(queries)
    qrels = {q: data.qrels[q] for q in qids}
    hits = BM25Index().index(data.corpus).search_many([queries[q] for q in qids], k=100)
    bm25_run = {q: {u.id: u.score for u in h} for q, h in zip(qids, hits)}
    bm25_ndcg = ir_metrics(qrels, bm25_run, ["ndcg@10"])["ndcg@10"]

    cache_path = args.cache or (ROOT / ".cache" / f"ce_backends_{Path(model).name}_len{args.max_length}.jsonl")
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    recs = [json.loads(line) for line in cache_path.read_text(encoding="utf-8").splitlines()] if cache_path.is_file() else []
    done: dict[tuple[str, str, int], dict] = {(r["runtime"], r["qid"], len(r["scores"])): r for r in recs}

    scorers, load_seconds = {}, {}
    for n in names:
        t = time.perf_counter()
        scorers[n] = CrossEncoderScorer(model, library="transformers", device="cpu", max_length=args.max_length,
                                        batch_size=args.batch_size, export_dir=args.export_dir / n.split("-")[0],
                                        **RUNTIMES[n]).load()
        scorers[n].score(queries[qids[0]], [u.text for u in hits[0][:8]])  # warm-up batch
        load_seconds[n] = time.perf_counter() - t

    timing_qids = qids[: args.timing_queries]
    hit_of = dict(zip(qids, hits))
    depth_of = lambda q, depth: len(hit_of[q][:depth])

    def report(final: bool) -> dict:
        speed, quality = {}, {}
        for n in names:
            recs = [done[k] for q in timing_qids if (k := (n, q, depth_of(q, timing_depth))) in done]
            if recs:
                secs = [r["seconds"] for r in recs]
                pairs = sum(len(r["scores"]) for r in recs)
                speed[n] = {"queries": len(recs), "pairs": pairs, "seconds": sum(secs),
                            "pairs_per_s": pairs / sum(secs) if sum(secs) else None,
                            "p50_query_seconds": statistics.median(secs),
                            "p95_query_seconds": percentile(secs, 95),
                            "load_seconds_incl_export_and_warmup": load_seconds.get(n)}
                ref = [done.get(("torch-fp32", r["qid"], len(r["scores"]))) for r in recs]
                diffs = [abs(a - b) for r, f in zip(recs, ref) if f for a, b in zip(r["scores"], f["scores"])]
                speed[n]["max_abs_score_diff_vs_torch_fp32"] = max(diffs) if diffs else None
            if n not in ndcg_names:
                continue
            run = {}
            for q, h in zip(qids, hits):  # the reranked head by its scores, then the rest in BM25 order
                if (key := (n, q, depth_of(q, args.depth))) in done:
                    ce, head = done[key]["scores"], h[: args.depth]
                    ranked = [head[i].id for i in sorted(range(len(head)), key=lambda i: -ce[i])] + [u.id for u in h[args.depth:]]
                    run[q] = {d: float(len(ranked) - r) for r, d in enumerate(ranked)}
            if run:
                per_query = {q: ir_metrics({q: qrels[q]}, {q: run[q]}, ["ndcg@10"])["ndcg@10"] for q in run}
                quality[n] = {"queries": len(run),
                              "ndcg@10": ir_metrics({q: qrels[q] for q in run}, run, ["ndcg@10"])["ndcg@10"],
                              "per_query_ndcg@10": per_query}
        per = {n: {**speed.get(n, {}), **quality.get(n, {})} for n in names if n in speed or n in quality}
        ref_q = next((r for r in ("torch-fp32", "onnx-fp32") if r in quality), None)
        base = speed.get("torch-fp32")
        for n, r in per.items():
            if base and r.get("pairs_per_s") and base["pairs_per_s"]:
                r["speedup_vs_torch_fp32"] = r["pairs_per_s"] / base["pairs_per_s"]
            if ref_q and "ndcg@10" in r and quality[ref_q]["queries"] == r["queries"]:
                r["ndcg@10_loss_vs_fp32"] = quality[ref_q]["ndcg@10"] - r["ndcg@10"]
                ref_per = quality[ref_q]["per_query_ndcg@10"]
                r["ndcg@10_loss_ci95"] = paired_bootstrap(list(ref_per.values()), [r["per_query_ndcg@10"][q] for q in ref_per])["ci"]
            r["meets_target"] = bool(r.get("speedup_vs_torch_fp32", 0) >= TARGET_SPEEDUP
                                     and r.get("ndcg@10_loss_vs_fp32", 1) <= TARGET_NDCG_LOSS)
        complete = all(quality.get(n, {}).get("queries") == len(qids) for n in ndcg_names)
        ov_precision = (str(scorers["openvino"]._model.get().session._compiled.get_property("INFERENCE_PRECISION_HINT"))
                        if "openvino" in scorers else None)
        return {
            "dataset": "BEIR SciFact test", "queries": len(qids), "all_test_queries": len(queries),
            "complete": complete and final,
            "model": {"path": model, "note": model_note, "scifact_trained": "scifact" in Path(model).name},
            "ndcg_reference": f"{ref_q} (ONNX fp32 scores equal torch fp32: see max_abs_score_diff_vs_torch_fp32)"
                              if ref_q == "onnx-fp32" else ref_q,
            "settings": {"depth": args.depth, "candidates": 100, "timing_queries": len(timing_qids),
                         "timing_query_ids": "the first N SciFact test query ids in sorted order",
                         "timing_depth": timing_depth, "ndcg_runtimes": ndcg_names, "max_length": args.max_length,
                         "batch_size": args.batch_size, "backend": "transformers (passage-only truncation)",
                         "device": "cpu", "interleaved": "per query, runtime order rotated per query",
                         "export_dir": str(args.export_dir), "openvino_inference_precision": ov_precision},
            "bm25_ndcg@10": bm25_ndcg,
            "runtimes": per, "skipped": skipped,
            "target": {"speedup_vs_torch_fp32": TARGET_SPEEDUP, "max_ndcg@10_loss": TARGET_NDCG_LOSS,
                       "met_by": [n for n, r in per.items() if r.get("meets_target")]},
            "cpu_auto_runtime": choose_runtime("auto", "cpu", "transformers"),  # on this machine
            "hardware": describe(),
            "load_average_before": load_before, "load_average_after": load_average(),
            "command": command_line(),
        }

    out = args.out or ROOT / "benchmarks" / "results" / "ce_backends.json"
    write = lambda final: save_json(out, report(final))

    def score_all(pass_qids: list[str], pass_names: list[str], depth: int, label: str) -> None:
        with cache_path.open("a", encoding="utf-8") as log:
            for i, q in enumerate(pass_qids):
                texts = [u.text for u in hit_of[q][:depth]]
                order = pass_names[i % len(pass_names):] + pass_names[: i % len(pass_names)]
                for n in order:
                    if (n, q, len(texts)) in done or not texts:
                        continue
                    t = time.perf_counter()
                    scores = scorers[n].score(queries[q], texts)
                    rec = {"runtime": n, "qid": q, "seconds": time.perf_counter() - t, "scores": scores}
                    done[(n, q, len(texts))] = rec
                    log.write(json.dumps(rec) + "\n")
                    log.flush()
                if (i + 1) % args.save_every == 0 or i + 1 == len(pass_qids):
                    write(False)
                    r = report(False)["runtimes"]
                    print(f"{label} {i + 1}/{len(pass_qids)} " + "  ".join(
                        f"{n}: {v.get('pairs_per_s') or 0:.1f} p/s nDCG {v.get('ndcg@10', float('nan')):.4f}"
                        for n, v in r.items()), flush=True)

    score_all(timing_qids, names, timing_depth, "speed")
    score_all(qids, ndcg_names, args.depth, "quality")
    write(True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
