"""Time the real pipelines of ``bench_squad_large.py`` through the evaluation harness.

    python benchmarks/time_squad_large.py --n-timing 50 --quiet-each --quiet-load 1.0 --max-load 1.0 [--systems REGEX]
    python benchmarks/time_squad_large.py --compare-only      # no timing: comparisons + plot from the JSON

Builds only what the timed pipelines need and runs ``funnel_core.evaluation.evaluate`` on the seeded
timing sample of dev-a questions; the harness report goes to ``results/squad_large_timing.json``, whose
seconds ``report.py`` reads. Above ``--max-load`` the harness withholds the seconds and the script
exits with status 2; otherwise the comparisons and plot of ``squad_large.json`` are recomputed (AR@k
stays as the quality run wrote it). Options and method: docs/benchmarks.md, "Reproduce".
"""

from __future__ import annotations

import gzip
import json
import random
import re
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import report as R
import squad_large_data as D
import squad_large_eval as E
from common import ROOT, parser
from pairs import CACHE
from trained import SQUAD_CE, require_model

from funnel_core.best_practices.fusion import HybridRetrieve
from funnel_core.bm25 import BM25Index, BM25Retrieve
from funnel_core.embeddings import DenseRetrieve
from funnel_core.evaluation import EvalDataset, evaluate
from funnel_core.funnel import Funnel
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
from funnel_core.funnelrag.presets import funnelrag, renamed
from funnel_core.hardware import describe


def parse_funnel(name: str) -> tuple[int, ...]:
    """(S, K, kd) of a funnel's name, e.g. ``funnel S4096 K10 kd8 (preset)``."""
    return tuple(int(part.lstrip("SKkd")) for part in name.split()[1:4])


def pipelines(names, bm25, dense, cindexes, ranker, alpha: float) -> dict[str, Funnel]:
    """Each system's real funnel_core pipeline: a first stage, the cross-encoder's top 4, or the funnel."""
    def first(fs: str, k: int):
        if fs == "hybrid":
            return HybridRetrieve(BM25Retrieve(bm25, k=E.FIRST_K), DenseRetrieve(dense, k=E.FIRST_K),
                                  alpha=alpha, k=k, name="hybrid")
        return BM25Retrieve(bm25, k=k, name="bm25") if fs == "bm25" else DenseRetrieve(dense, k=k)

    pipes = {}
    for name in names:
        if name.startswith("funnel"):
            s, k, kd = parse_funnel(name)
            pipes[name] = funnelrag(cindexes[s], ranker, k_clusters=k, k_documents=kd, k_passages=4,
                                    passage_words=D.PASSAGE_WORDS)
        else:
            fs, _, depth = name.partition(" -> CE@")
            stages = [first(fs, int(depth)), renamed(ranker, "rerank") % 4] if depth else [first(fs, E.FIRST_K)]
            pipes[name] = Funnel(stages)
    return pipes


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--squad", type=Path, nargs="+", default=D.SQUAD_FILES)
    p.add_argument("--model", type=Path, default=SQUAD_CE)
    p.add_argument("--embeddings", type=Path, default=CACHE / "emb")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "squad_large.json")
    p.add_argument("--n-timing", type=int, default=50)
    p.add_argument("--systems", default=".", help="regex: time only the systems whose name matches")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-load", type=float, default=None,
                   help="withhold all seconds when the 1-minute load average exceeds this during timing "
                        "(default: the cores available; the run's own threads count in the load average)")
    p.add_argument("--quiet-check", action="store_true",
                   help="before timing, wait (up to --quiet-timeout s) for the load average to fall to --quiet-load")
    p.add_argument("--quiet-each", action="store_true",
                   help="wait for the load average to fall to --quiet-load before every timed query "
                        "(the harness's quiet_check='each': every recorded load within it)")
    p.add_argument("--quiet-load", type=float, default=1.0)
    p.add_argument("--quiet-timeout", type=float, default=1800)
    p.add_argument("--quiet-poll", type=float, default=1.0, help="seconds between load readings while waiting")
    p.add_argument("--compare-only", action="store_true",
                   help="time nothing: recompute the comparisons and the plot from the JSON's times")
    args = p.parse_args()
    res = json.loads(args.results.read_text())
    timing_path = args.results.with_name(args.results.stem + "_timing.json")
    if args.compare_only:
        return compare(args.results, res, timing_path)
    names = [n for n in res["systems_dev_a"] if re.search(args.systems, n)]
    require_model(args.model, "SQuAD cross-encoder")
    flags = describe()  # the CPU facts the JSON records; bf16 autocast only where the CPU runs bf16 natively
    bf16 = bool(flags["cpu_native_bf16"])
    corpus = D.build_corpus(args.squad)
    report_qs = corpus.report_sample(res["samples"]["dev_a_report"])
    timing_qs = random.Random(D.TIMING_SEED).sample(report_qs, min(args.n_timing, len(report_qs)))
    warm_q = next(q for q in corpus.questions["dev-a"] if q.id not in {t.id for t in timing_qs})

    from funnel_core.embeddings import SentenceEmbedder
    from funnel_core.rerank.cross_encoder import CrossEncoderScorer

    embedder = SentenceEmbedder(batch_size=args.batch_size)
    dense = D.dense_index(corpus.passages, D.passage_embeddings(args.embeddings, corpus.passages, embedder)[0],
                          embedder)
    sizes = {parse_funnel(n)[0] for n in names if n.startswith("funnel")}
    adj = corpus.adjacency() if sizes else None
    cindexes = {s: ClusteredBM25Index(max_tokens=s).index(corpus.documents, adjacency=adj) for s in sizes}
    ranker = CrossEncoderScorer(str(args.model), library="transformers", batch_size=args.batch_size,
                                max_length=192, window_words=D.PASSAGE_WORDS, dtype="bfloat16" if bf16 else "auto",
                                name="ranker")
    pipes = pipelines(names, BM25Index().index(corpus.passages), dense, cindexes, ranker, res["hybrid"]["alpha"])
    dataset = EvalDataset(queries={q.id: q.question for q in timing_qs},
                          answers={q.id: list(q.answers) for q in timing_qs}, name="squad-dev-a-timing",
                          format="squad")
    report = evaluate(pipes, dataset, metrics=["AR@4"], n_timing=len(timing_qs),
                      timing_ids=[q.id for q in timing_qs], warm_query=warm_q.question, max_load=args.max_load,
                      quiet_check="each" if args.quiet_each else args.quiet_check, quiet_load=args.quiet_load,
                      quiet_timeout=args.quiet_timeout, quiet_poll=args.quiet_poll)
    out = report.to_dict()
    out["command"] = "python benchmarks/time_squad_large.py " + shlex.join(sys.argv[1:])
    out["cpu_flags"] = flags
    out["cross_encoder_dtype"] = "bf16 autocast" if bf16 else "fp32"
    # the real pipelines' top 4 against the cached-score top 4 of the quality run (same questions)
    cached = per_question_ranks(args.results)
    out["AR@4_hit_agreement_real_vs_cached"] = {
        n: sum(float((r["metrics"]["AR@4"] > 0) == (0 < cached[n][r["id"]] <= 4)) for r in recs) / len(recs)
        for n, recs in out["per_question"].items() if n in cached}
    timing_path.write_text(json.dumps(out, indent=1, default=float))
    print(report.to_markdown())
    print(f"wrote {timing_path}")
    if report.timing["refused"]:
        print(f"not merged into {args.results.name}: {report.timing['refused']}", file=sys.stderr)
        sys.exit(2)
    compare(args.results, res, timing_path)


def per_question_ranks(results: Path) -> dict[str, dict[str, int]]:
    """``{system: {question id: hit rank}}`` of the dev-a questions, from the per-question file."""
    with gzip.open(results.with_name(results.stem + "_per_question.jsonl.gz"), "rt", encoding="utf-8") as f:
        per_q = {r["id"]: r["hit_rank"] for r in map(json.loads, f) if r["split"] == "dev-a"}
    return {n: {qid: hr[n] for qid, hr in per_q.items()} for n in next(iter(per_q.values()))}


def compare(results: Path, res: dict, timing_path: Path) -> None:
    """Recompute the paired comparisons (on the report sample) and the plot with the harness's
    seconds (``report.merge_timing``); write the JSON."""
    if timing_path.exists():
        res = R.merge_timing(res, json.loads(timing_path.read_text()))
    ranks = per_question_ranks(results)
    rows, n = res["systems_dev_a"], res["samples"]["dev_a_report"]
    # the report sample, in the order bench_squad_large.py wrote it (the bootstrap resamples by position)
    qs = [SimpleNamespace(id=q) for q in next(iter(ranks.values()))]
    if len(qs) != n:
        raise ValueError(f"the per-question file holds {len(qs)} dev-a questions, the JSON reports on {n}; "
                         "re-run bench_squad_large.py.")
    res["comparison"] = E.comparisons(rows, ranks, qs, res["best_funnel_chosen_on_train"], 2000)
    results.write_text(json.dumps(res, indent=2, default=float))
    plot(rows, results.with_suffix(".png"), f"SQuAD train+dev-a corpus ({res['corpus']['passages']} passages): "
         f"{n} dev-a questions, time on {res['samples']['dev_a_timing']}")
    print(f"updated {results}")


def plot(rows, path: Path, title: str) -> None:
    """AR@4 (95% interval) against p50 seconds per query of the timed flat systems and funnels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    for kind, colour, marker in (("flat", "C0", "o"), ("funnel", "C1", "s")):
        pts = {n: r for n, r in rows.items() if r["kind"] == kind and "seconds_p50" in r}
        if pts:
            x, y = [r["seconds_p50"] for r in pts.values()], [r["AR@4"] for r in pts.values()]
            err = np.array([[r["AR@4"] - r["AR@4_ci95"][0], r["AR@4_ci95"][1] - r["AR@4"]] for r in pts.values()]).T
            ax.errorbar(x, y, yerr=err, fmt=marker, color=colour, label=kind, capsize=2, ms=5)
            for n, xi, yi in zip(pts, x, y):
                ax.annotate(n.replace("funnel ", "").replace(" (preset)", "*"), (xi, yi), fontsize=6,
                            xytext=(3, 2), textcoords="offset points")
    ax.set(xscale="log", xlabel="seconds per query (p50, real pipeline, CPU)", ylabel="AR@4 (95% bootstrap interval)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
