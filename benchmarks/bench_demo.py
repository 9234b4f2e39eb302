"""Per-question time of the offline demo (``python -m funnel_core demo``, the README's
first command) with warm models: the stdlib docstring funnel of :mod:`funnel_core.demo`.

    nice -n 10 python benchmarks/bench_demo.py [--repeats 2]

The build time is recorded with whether the demo's embedding cache was missing ("miss") or
present ("hit"); the previous run's figures for the other case stay in the JSON under
``previous_runs``. The first question is reported apart, every later one timed with
:class:`common.LatencyReport`. Writes benchmarks/results/demo_timing.json (docs/performance.md).
"""

from __future__ import annotations

import json
import time

from common import RESULTS, LatencyReport, parser, timer, write_json

from funnel_core.cache import cache_root
from funnel_core.demo import DEMO_QUESTIONS, build_demo_funnel, stdlib_corpus
from funnel_core.embeddings import EMBEDDING_CACHE


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=1, help="ask the question list this many times")
    args = p.parse_args()
    with timer() as tc:
        units = stdlib_corpus()
    cache = "hit" if any(cache_root().glob("demo-*/CURRENT")) else "miss"
    with timer() as tb:
        index, funnel = build_demo_funnel(units)
    first_q, rest = DEMO_QUESTIONS[0], DEMO_QUESTIONS[1:]
    t0 = time.perf_counter()
    funnel.search(first_q)
    first = time.perf_counter() - t0
    rounds = []
    for r in range(args.repeats):
        rep = LatencyReport(f"demo question (round {r + 1}), warm models")
        per_q = []
        for q in rest if r == 0 else DEMO_QUESTIONS:
            with rep.time():
                res = funnel.search(q)
            per_q.append({"question": q, "seconds": rep.seconds[-1],
                          "stages": [r.to_dict() for r in res.trace.stages]})
            print(f"{rep.seconds[-1]:.3f} s  {q}")
        rounds.append({"latency": rep.summary(), "questions": per_q,
                       "all_under_0.5_s": all(x["seconds"] < 0.5 for x in per_q)})
    out = args.out or RESULTS / "demo_timing.json"
    previous = json.loads(out.read_text()) if out.exists() else {}
    kept = {c: run for c, run in previous.get("previous_runs", {}).items() if c != cache}
    if previous.get("embedding_cache") and previous["embedding_cache"] != cache:
        kept[previous["embedding_cache"]] = {k: previous.get(k) for k in (
            "machine", "build_seconds", "first_question_seconds", "rounds")}
    write_json("demo_timing", {
        "args": {"repeats": args.repeats}, "n_documents": len(units), "n_clusters": len(index.clusters),
        "embedding_cache": cache, "corpus_seconds": tc["seconds"], "build_seconds": tb["seconds"],
        "first_question_seconds": first, "rounds": rounds,
        "embedding_cache_entries": len(EMBEDDING_CACHE), "previous_runs": kept,
    }, out)


if __name__ == "__main__":
    main()
