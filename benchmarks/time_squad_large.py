"""Re-time the real pipelines of ``bench_squad_large.py`` without redoing its quality run.

    python benchmarks/time_squad_large.py [--n-timing 10] [--systems REGEX]

Builds only what the real pipelines need (corpus, BM25, HNSW, the cluster indexes of the timed
funnels), times each selected system's real ``funnel_core`` pipeline on the seeded timing sample of
dev-a questions (the same sample, seed and round-robin order as ``bench_squad_large.py``), and
merges the seconds into ``results/squad_large.json`` (per-system ``seconds_p50``/``seconds_p95``,
the comparisons and the plot are recomputed; AR@k stays as the quality run wrote it).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import shlex
import time
from pathlib import Path
from types import SimpleNamespace

import bench_squad_large as B
from common import ROOT, parser
from squad_ce_model import DEFAULT_FILES, DEFAULT_OUT, cpu_flags, use_bf16
from squad_large_data import PASSAGE_WORDS, build_corpus

from funnel_core.bm25 import BM25Index
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--squad", type=Path, nargs="+", default=DEFAULT_FILES)
    p.add_argument("--model", type=Path, default=ROOT / DEFAULT_OUT)
    p.add_argument("--embeddings", type=Path, default=B.CACHE / "emb")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "squad_large.json")
    p.add_argument("--n-timing", type=int, default=10)
    p.add_argument("--systems", default=".", help="regex: time only the systems whose name matches")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--compare-only", action="store_true",
                   help="time nothing: recompute the comparisons and the plot from the JSON's times")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="stop after the question during which this wall-clock budget ran out")
    args = p.parse_args()
    res = json.loads(args.results.read_text())
    rows = res["systems_dev_a"]
    names = [n for n in rows if re.search(args.systems, n)]
    if args.compare_only:
        compare(args, res)
        return
    flags = cpu_flags()
    bf16 = use_bf16(flags)
    corpus = build_corpus(args.squad)
    passages, documents = corpus.passages, corpus.documents
    pid_index = {u.id: i for i, u in enumerate(passages)}
    dev_all = corpus.questions["dev-a"]
    n_report = res["samples"]["dev_a_report"]
    report_qs = random.Random(B.REPORT_SEED).sample(dev_all, len(dev_all))[:n_report]
    timing_qs = random.Random(B.TIMING_SEED).sample(report_qs, min(args.n_timing, len(report_qs)))
    warm_q = next(q for q in dev_all if q.id not in {t.id for t in timing_qs})

    from funnel_core.embeddings import SentenceEmbedder

    embedder = SentenceEmbedder(batch_size=args.batch_size)
    emb = B.load_embeddings(args.embeddings, "passages")
    if emb is None:
        raise SystemExit(f"no passage embeddings under {args.embeddings}: run bench_squad_large.py first "
                         "(or copy its cache, e.g. /work/cache/squad_large, to .cache/squad_large).")
    dense = B.FaissDense(emb)
    bm25 = BM25Index().index(passages)
    sizes = sorted({B.parse_funnel(n)[0] for n in names if n.startswith("funnel")})
    adj = corpus.adjacency() if sizes else None
    cindexes = {s: ClusteredBM25Index(max_tokens=s).index(documents, adjacency=adj) for s in sizes}

    # cached-score hit ranks of the timing questions (for the agreement check): from the per-question file
    per_q = {}
    with gzip.open(args.results.with_name("squad_large_per_question.jsonl.gz"), "rt", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r["split"] == "dev-a":
                per_q[r["id"]] = r["hit_rank"]
    ranks_all = {n: {qid: hr[n] for qid, hr in per_q.items()} for n in rows}

    from funnel_core.rerank.cross_encoder import CrossEncoderScorer

    ranker = CrossEncoderScorer(str(args.model), library="transformers", batch_size=args.batch_size,
                                max_length=192, window_words=PASSAGE_WORDS, dtype="bfloat16" if bf16 else "auto",
                                name="ranker")
    pipes = B.build_pipelines(names, bm25, dense, embedder, passages, cindexes, ranker, res["hybrid"]["alpha"])
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    log: list[dict] = []
    timing = B.time_pipelines(pipes, timing_qs, warm_q, pid_index, B.Answers(corpus), ranks_all,
                              max_seconds=args.max_seconds, log=log)
    for n in rows:  # a system not in this run keeps no time from an older, differently sampled run
        for k in ("seconds_p50", "seconds_p95", "seconds_mean", "timed_questions",
                  "reranked_units_per_query_real", "AR@4_hit_agreement_real_vs_cached"):
            rows[n].pop(k, None)
    for n, t in timing.items():
        rows[n].update(t)
    n_timed = len(log)
    res["samples"]["dev_a_timing"] = n_timed
    res["load_average_before_timing"] = load_before
    res["load_average_after_timing"] = os.getloadavg()
    loads = sorted(x["load1_before"] for x in log)
    res["load_average_per_question"] = {"min": loads[0], "median": loads[len(loads) // 2], "max": loads[-1],
                                        "n": n_timed} if loads else {}
    with gzip.open(args.results.with_name("squad_large_timing_per_question.jsonl.gz"), "wt",
                   encoding="utf-8") as f:
        for x in log:
            f.write(json.dumps(x) + "\n")
    res["timing_run"] = {"command": "python benchmarks/time_squad_large.py " + " ".join(
        f"--{k.replace('_', '-')} {shlex.quote(str(v))}" for k, v in (("n_timing", args.n_timing), ("systems", args.systems))
        + ((("max_seconds", int(args.max_seconds)),) if args.max_seconds else ())),
        "questions_requested": len(timing_qs), "questions_timed": n_timed,
        "systems_timed": names, "seconds": time.perf_counter() - t0, "cpu_flags": flags,
        "dtype": "bf16 autocast" if bf16 else "fp32", "batch_size": args.batch_size}
    compare(args, res)


def per_question_ranks(results: Path) -> dict[str, dict[str, int]]:
    """``{system: {question id: hit rank}}`` of the dev-a questions, from the per-question file."""
    per_q = {}
    with gzip.open(results.with_name("squad_large_per_question.jsonl.gz"), "rt", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r["split"] == "dev-a":
                per_q[r["id"]] = r["hit_rank"]
    names = next(iter(per_q.values())).keys()
    return {n: {qid: hr[n] for qid, hr in per_q.items()} for n in names}


def compare(args, res: dict) -> None:
    """Recompute the paired comparisons (on the report sample) and the plot; write the JSON."""
    ranks_all = per_question_ranks(args.results)
    rows = res["systems_dev_a"]
    # the report sample, in the order bench_squad_large.py wrote it (the bootstrap resamples by position)
    qs = [SimpleNamespace(id=q) for q in next(iter(ranks_all.values()))]
    if len(qs) != res["samples"]["dev_a_report"]:
        raise ValueError(f"the per-question file holds {len(qs)} dev-a questions, the JSON reports on "
                         f"{res['samples']['dev_a_report']}; re-run bench_squad_large.py.")
    res["comparison"] = B.comparisons(rows, ranks_all, qs, res["best_funnel_chosen_on_train"], 2000)
    args.results.write_text(json.dumps(res, indent=2, default=float))
    B.plot(rows, args.results.with_suffix(".png"),
           f"SQuAD train+dev-a corpus ({res['corpus']['passages']} passages): {res['samples']['dev_a_report']} "
           f"dev-a questions, time on {res['samples']['dev_a_timing']}")
    print(f"updated {args.results}")


if __name__ == "__main__":
    main()
