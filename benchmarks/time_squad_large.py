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

import bench_squad_large as B
from common import ROOT, parser
from squad_ce_model import DEFAULT_FILES, DEFAULT_OUT, cpu_flags, use_bf16
from squad_large_data import PASSAGE_WORDS, build_corpus

from funnel_core.bm25 import BM25Index
from funnel_core.clustered import ClusteredBM25Index


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--squad", type=Path, nargs="+", default=DEFAULT_FILES)
    p.add_argument("--model", type=Path, default=ROOT / DEFAULT_OUT)
    p.add_argument("--embeddings", type=Path, default=B.CACHE / "emb")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "squad_large.json")
    p.add_argument("--n-timing", type=int, default=10)
    p.add_argument("--systems", default=".", help="regex: time only the systems whose name matches")
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()
    res = json.loads(args.results.read_text())
    rows = res["systems_dev_a"]
    names = [n for n in rows if re.search(args.systems, n)]
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
    dense = B.FaissDense(B.load_embeddings(args.embeddings, "passages"))
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

    ranker = CrossEncoderScorer(str(args.model), backend="transformers", batch_size=args.batch_size,
                                max_length=192, window_words=PASSAGE_WORDS, bf16=bf16, name="ranker")
    pipes = B.build_pipelines(names, bm25, dense, embedder, passages, cindexes, ranker, res["hybrid"]["alpha"])
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    timing = B.time_pipelines(pipes, timing_qs, warm_q, pid_index, B.Answers(corpus), ranks_all)
    for n, t in timing.items():
        rows[n].update(t)
    res["samples"]["dev_a_timing"] = len(timing_qs)
    res["load_average_before_timing"] = load_before
    res["load_average_after_timing"] = os.getloadavg()
    res["timing_run"] = {"command": "python benchmarks/time_squad_large.py " + " ".join(
        f"--{k.replace('_', '-')} {shlex.quote(str(v))}" for k, v in (("n_timing", args.n_timing), ("systems", args.systems))),
        "systems_timed": names, "seconds": time.perf_counter() - t0, "cpu_flags": flags,
        "dtype": "bf16 autocast" if bf16 else "fp32", "batch_size": args.batch_size}

    class Q:
        def __init__(self, i):
            self.id = i

    qs = [Q(q.id) for q in report_qs]
    res["comparison"] = B.comparisons(rows, ranks_all, qs, res["best_funnel_chosen_on_train"], 2000)
    args.results.write_text(json.dumps(res, indent=2, default=float))
    B.plot(rows, args.results.with_suffix(".png"),
           f"SQuAD train+dev-a corpus ({len(passages)} passages): {n_report} dev-a questions, time on {len(timing_qs)}")
    print(f"updated {args.results}")


if __name__ == "__main__":
    main()
