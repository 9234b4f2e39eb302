"""Pre-ranking benchmark: SciFact test nDCG@10 of BM25 top-100 reranked by the cross-encoder trained
here (all-MiniLM-L6-v2 + SciFact train, see ``prerank_model.py``), against flat BM25 measured in
the same run and the published BM25 + ms-marco-MiniLM cross-encoder figure (0.688, BEIR).

Also measures CrossEncoderScorer throughput against calling sentence-transformers
``CrossEncoder.predict`` directly on the same pairs (wrapper overhead), and the gain of
length-sorted batching (transformers backend, sorted vs unsorted).

Reranking is done in depth tiers (BM25 ranks 1-10, 11-20, 21-30, 31-50, 51-100 of every query), the
scores are cached under ``models/`` and the JSON is rewritten after every tier, so a run cut short
still reports every depth it finished, and a re-run resumes. Run::

    nice -n 10 python benchmarks/bench_prerank.py --data /work/shared/data [--quick] [--depth 100]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

from common import ROOT, interleaved_seconds, save_json

from funnel_core.hardware import describe
from funnel_core.testing import offline_env

offline_env()

from prerank_model import DEFAULT_DATA, DEFAULT_OUT, get_or_train  # noqa: E402

PUBLISHED = {"bm25_beir": 0.665, "bm25_pyserini_flat": 0.679,
             "bm25_top100_ms_marco_minilm_ce_beir": 0.688}
TIERS = (10, 20, 30, 50, 100)


def fused(ce: list[float], head: list, w: float) -> list[float]:
    """``(1 - w) * CE + w * BM25``, both min-max normalised over the candidates ``head``."""
    from funnel_core.rerank.cross_encoder import minmax

    return [(1 - w) * c + w * b for c, b in zip(minmax(ce), minmax([u.score for u in head]))]


def ranked(head: list, tail: list, scores: list[float]) -> dict[str, float]:
    """A run of rank-based scores: ``head`` ordered by ``scores`` (ties keep BM25's order), then
    ``tail`` in BM25's order."""
    order = sorted(range(len(head)), key=lambda i: -scores[i])
    ids = [head[i].id for i in order] + [u.id for u in tail]
    return {d: float(len(ids) - r) for r, d in enumerate(ids)}


def rerank_run(qids: list[str], hits: list, cache: dict[str, float], depth: int, w: float | None = None) -> dict:
    """BM25's candidates with the top ``depth`` reranked by the cached cross-encoder scores (``w``
    None) or by their interpolation with BM25 (a query without candidates is left out then)."""
    out = {}
    for q, h in zip(qids, hits):
        head, ce = h[:depth], [cache[f"{q}|{u.id}"] for u in h[:depth]]
        if w is None or head:
            out[q] = ranked(head, h[depth:], ce if w is None else fused(ce, head, w))
    return out


def throughput(model_path: str, pairs: list[tuple[str, str]], *, max_length: int, batch_size: int,
               repeats: int) -> dict:
    """Pairs/s of our scorer vs CrossEncoder.predict (same model object, interleaved), and of
    length-sorted vs unsorted batching in the transformers backend."""
    import torch

    from funnel_core.rerank.cross_encoder import CrossEncoderScorer

    ours = CrossEncoderScorer(model_path, library="sentence-transformers", device="cpu",
                              max_length=max_length, batch_size=batch_size, runtime="torch").load()
    direct = ours._model.get().model  # the very same sentence_transformers.CrossEncoder (torch runtime)
    identity = torch.nn.Identity()
    qs, ts = [q for q, _ in pairs], [t for _, t in pairs]
    sorted_s = CrossEncoderScorer(model_path, library="transformers", device="cpu",
                                  max_length=max_length, batch_size=batch_size,
                                  sort_by_length=True, runtime="torch").load()
    unsorted_s = CrossEncoderScorer(model_path, library="transformers", device="cpu",
                                    max_length=max_length, batch_size=batch_size,
                                    sort_by_length=False, runtime="torch").load()
    runs = {
        "direct_predict": lambda: direct.predict(pairs, batch_size=batch_size, activation_fn=identity,
                                                 show_progress_bar=False, convert_to_numpy=True),
        "scorer_st": lambda: ours.score_pairs(qs, ts),
        "transformers_sorted": lambda: sorted_s.score_pairs(qs, ts),
        "transformers_unsorted": lambda: unsorted_s.score_pairs(qs, ts),
    }
    times = interleaved_seconds(runs, repeats)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "pairs": len(pairs), "max_length": max_length, "batch_size": batch_size,
        "repeats": repeats,
        "pairs_per_s": {k: len(pairs) / v for k, v in med.items()},
        "median_seconds": med, "all_seconds": times,
        "wrapper_overhead": med["scorer_st"] / med["direct_predict"] - 1.0,
        "length_sorting_speedup": med["transformers_unsorted"] / med["transformers_sorted"],
        "note": "medians of interleaved repeats",
    }


def tune_fuse_weight(scorer, data_dir: Path, n_queries: int, depth: int) -> dict:
    """nDCG@10 on ``n_queries`` SciFact train queries of (1 - w) * CE + w * BM25 (both min-max
    normalised over the top-``depth``) for w in 0.0 .. 1.0; returns the best w (ties: smaller w)."""
    import random

    from funnel_core.bm25 import BM25Index
    from funnel_core.evaluation import ir_metrics, load_beir

    train = load_beir(data_dir / "scifact", split="train")
    queries = train.split_queries()
    qids = sorted(random.Random(0).sample(sorted(queries), min(n_queries, len(queries))))
    hits = BM25Index().index(train.corpus).search_many([queries[q] for q in qids], k=depth)
    t = time.perf_counter()
    pairs = [(q, u) for q, h in zip(qids, hits) for u in h]
    ce = scorer.score_pairs([queries[q] for q, _ in pairs], [u.text for _, u in pairs])
    ce_by = {f"{q}|{u.id}": c for (q, u), c in zip(pairs, ce)}
    seconds = time.perf_counter() - t
    qrels = {q: train.qrels[q] for q in qids}
    table = {}
    for w in [i / 10 for i in range(11)]:
        run = {q: {u.id: f for u, f in zip(h, fused([ce_by[f"{q}|{u.id}"] for u in h], h, w))}
               for q, h in zip(qids, hits) if h}
        table[w] = ir_metrics(qrels, run, ["ndcg@10"])["ndcg@10"]
    best = max(table, key=lambda w: (table[w], -w))
    return {"train_queries": len(qids), "depth": depth, "pairs": len(pairs), "seconds": seconds,
            "ndcg@10_by_weight": table, "best_weight": best,
            "note": "weight of min-max BM25; 0.0 = cross-encoder alone, 1.0 = BM25 order"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--quick", action="store_true", help="30 test queries, depth 20")
    ap.add_argument("--depth", type=int, default=100, help="BM25 candidates reranked per query")
    ap.add_argument("--max-length", type=int, default=None,
                    help="tokens per pair at evaluation (default: the training max_length)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--window-words", type=int, default=None, metavar="N",
                    help="score an abstract longer than N words by its best window (MaxP) "
                         "instead of truncating it at --max-length")
    ap.add_argument("--window-overlap", type=int, default=0, help="words shared by neighbouring windows")
    ap.add_argument("--bf16", choices=("auto", "on", "off"), default="auto",
                    help="bfloat16 autocast for reranking (auto: as the model was trained)")
    ap.add_argument("--fuse-weight", type=float, default=0.3,
                    help="weight of min-max BM25 in the (separately reported) interpolation")
    ap.add_argument("--tune-fuse-on-train", type=int, default=0, metavar="N",
                    help="choose --fuse-weight on N SciFact *train* queries (depth <= 20) first")
    ap.add_argument("--model", default=DEFAULT_OUT)
    ap.add_argument("--skip-throughput", action="store_true",
                    help="keep the throughput figures of an earlier run's JSON")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "prerank.json"))
    args = ap.parse_args()

    from tqdm.auto import tqdm

    from funnel_core.bm25 import BM25Index
    from funnel_core.evaluation import ir_metrics, load_beir
    from funnel_core.rerank.cross_encoder import CrossEncoderScorer

    out_path = Path(args.out)
    if args.quick:
        out_path = out_path.with_name(out_path.stem + "_quick.json")
    model_path = get_or_train(args.data, args.model)
    training = json.loads((Path(model_path) / "summary.json").read_text()) \
        if (Path(model_path) / "summary.json").is_file() else {}
    max_length = args.max_length or training.get("config", {}).get("max_length", 256)
    bf16 = training.get("config", {}).get("bf16", False) if args.bf16 == "auto" else args.bf16 == "on"

    data = load_beir(Path(args.data) / "scifact", split="test")
    queries = data.split_queries()
    qids = sorted(queries)
    if args.quick:
        qids = qids[:30]
    depth = min(args.depth, 20) if args.quick else args.depth
    qrels = {q: data.qrels[q] for q in qids}

    t0 = time.perf_counter()
    index = BM25Index().index(data.corpus)
    hits = index.search_many([queries[q] for q in qids], k=100)
    bm25_seconds = time.perf_counter() - t0
    bm25_run = {q: {u.id: u.score for u in h} for q, h in zip(qids, hits)}
    bm25 = ir_metrics(qrels, bm25_run, ["ndcg@10", "recall@10", "recall@100"])
    print(f"flat BM25 nDCG@10 = {bm25['ndcg@10']:.4f}", flush=True)

    result: dict = {
        "dataset": "BEIR SciFact test", "queries": len(qids), "quick": args.quick,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_at_start": list(os.getloadavg())},
        "published": PUBLISHED,
        "flat_bm25": {**bm25, "seconds": bm25_seconds,
                      "settings": "funnel_core.bm25.BM25Index defaults over load_beir corpus"},
        "model": {"path": os.path.relpath(model_path, ROOT), "training": training},
        "rerank": {"max_length": max_length, "batch_size": args.batch_size,
                   "window_words": args.window_words, "window_overlap": args.window_overlap,
                   "backend": "transformers (passage-only truncation)", "bf16_autocast": bf16,
                   "depths": {}},
    }
    previous = json.loads(out_path.read_text()) if out_path.is_file() else {}
    if args.skip_throughput and "throughput" in previous:
        result["throughput"] = previous["throughput"]
    save_json(out_path, result)

    if not args.skip_throughput:
        pairs = [(queries[q], u.text) for q, h in zip(qids[:8], hits[:8]) for u in h[:8]]
        result["throughput"] = throughput(model_path, pairs, max_length=max_length,
                                          batch_size=args.batch_size,
                                          repeats=2 if args.quick else 3)
        tp = result["throughput"]
        print(f"wrapper overhead {tp['wrapper_overhead']:+.1%}, length sorting x"
              f"{tp['length_sorting_speedup']:.2f}", flush=True)
        save_json(out_path, result)

    # -- reranking, tier by tier, with a score cache -------------------------------------------
    scorer = CrossEncoderScorer(model_path, library="transformers", device="cpu",
                                max_length=max_length, batch_size=args.batch_size,
                                sort_by_length=True, dtype="bfloat16" if bf16 else "auto",
                                window_words=args.window_words,
                                window_overlap=args.window_overlap)
    if args.tune_fuse_on_train:
        result["fuse_tuning"] = tune_fuse_weight(scorer, Path(args.data), args.tune_fuse_on_train,
                                                 min(depth, 20))
        args.fuse_weight = result["fuse_tuning"]["best_weight"]
        print(f"fuse weight chosen on train: {args.fuse_weight}", flush=True)
        save_json(out_path, result)
    weights = max(Path(model_path).glob("*.safetensors"), key=os.path.getmtime, default=None)
    stamp = f"{int(weights.stat().st_mtime)}" if weights else "unknown"  # a retrained model's own cache
    windows = f"_maxp{args.window_words}o{args.window_overlap}" if args.window_words else ""
    cache_path = Path(model_path) / f"scifact_test_scores_len{max_length}{'_bf16' * bf16}{windows}_{stamp}.json"
    cache: dict[str, float] = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
    rerank_seconds = 0.0
    scored_pairs = 0
    for lo, hi in zip((0,) + TIERS, TIERS):
        if lo >= depth:
            break
        hi = min(hi, depth)
        todo = [(q, u) for q, h in zip(qids, hits) for u in h[lo:hi] if f"{q}|{u.id}" not in cache]
        if todo:
            t = time.perf_counter()
            chunk = 256  # save progress regularly
            for b in tqdm(range(0, len(todo), chunk), desc=f"rerank ranks {lo + 1}-{hi}"):
                part = todo[b:b + chunk]
                scores = scorer.score_pairs([queries[q] for q, _ in part], [u.text for _, u in part])
                cache.update({f"{q}|{u.id}": s for (q, u), s in zip(part, scores)})
                cache_path.write_text(json.dumps(cache), encoding="utf-8")
            rerank_seconds += time.perf_counter() - t
            scored_pairs += len(todo)
        ce_m = ir_metrics(qrels, rerank_run(qids, hits, cache, hi), ["ndcg@10", "recall@10", "recall@100"])
        fu_m = ir_metrics(qrels, rerank_run(qids, hits, cache, hi, args.fuse_weight), ["ndcg@10", "recall@10"])
        sweep = {str(w): ir_metrics(qrels, rerank_run(qids, hits, cache, hi, w), ["ndcg@10"])["ndcg@10"]
                 for w in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)}
        result["rerank"]["depths"][str(hi)] = {
            "cross_encoder": ce_m,
            "vs_flat_bm25": ce_m["ndcg@10"] - bm25["ndcg@10"],
            "vs_published_0.688": ce_m["ndcg@10"] - PUBLISHED["bm25_top100_ms_marco_minilm_ce_beir"],
            f"interpolated_ce_bm25_w{args.fuse_weight}": fu_m,
            "interpolation_weight_sweep_on_TEST_for_information_only_not_tuned": sweep,
        }
        result["rerank"]["seconds_this_run"] = rerank_seconds
        result["rerank"]["pairs_scored_this_run"] = scored_pairs
        if rerank_seconds > 0 and scored_pairs:
            result["rerank"]["pairs_per_s_this_run"] = scored_pairs / rerank_seconds
        result["rerank"]["deepest_depth_done"] = hi
        result["machine"]["load_average_at_end"] = list(os.getloadavg())
        result["hardware"] = describe()  # CPU flags and the precision the cross-encoder ran in
        print(f"depth {hi}: CE nDCG@10 = {ce_m['ndcg@10']:.4f} (BM25 {bm25['ndcg@10']:.4f}); "
              f"CE+BM25 w={args.fuse_weight}: {fu_m['ndcg@10']:.4f}", flush=True)
        save_json(out_path, result)
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
