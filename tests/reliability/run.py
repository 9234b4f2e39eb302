"""Long run of the reliability suite: ``make reliability`` (writes benchmarks/results/reliability.json).

Usage: python tests/reliability/run.py [--out FILE] [--scale N] [--quick]
"""

from __future__ import annotations

import os

# before numba can be imported (a fresh machine may default to GNU OpenMP, which aborts forked writers)
os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")
# and one BLAS/OpenMP thread: a fork while OpenBLAS worker threads hold their locks leaves the
# child (a killed-save writer) waiting on a futex forever (seen with the dense index)
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reliability_harness as rh  # noqa: E402
import trust_harness as th  # noqa: E402


def machine() -> dict:
    flags = []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                break
    except OSError:
        pass
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    return {"cpu": model, "cpu_count": os.cpu_count(), "load_average": list(os.getloadavg()),
            "cpu_flags": sorted(f for f in flags if f.startswith(("avx", "sse4", "amx", "fma"))),
            "python": sys.version.split()[0], "platform": platform.platform()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="benchmarks/results/reliability.json")
    ap.add_argument("--scale", type=int, default=10, help="multiplies the trial counts of the short run")
    ap.add_argument("--quick", action="store_true", help="scale 1, for a smoke test")
    args = ap.parse_args()
    n = 1 if args.quick else args.scale
    t0 = time.perf_counter()
    out: dict = {"args": {"scale": n}, "command": "make reliability  (python tests/reliability/run.py "
                 f"--scale {n})", "machine_before": machine(), "experiments": {}}
    plan = [
        ("kill_at_every_step_bm25", lambda: rh.kill_at_steps("bm25", repeats=n)),
        ("kill_at_every_step_clustered", lambda: rh.kill_at_steps("clustered", repeats=max(1, n // 2))),
        ("kill_random_bm25", lambda: rh.kill_random("bm25", trials=20 * n, seed=1)),
        ("kill_random_clustered", lambda: rh.kill_random("clustered", trials=10 * n, seed=2)),
        ("bit_flips_bm25", lambda: rh.bit_flips("bm25", trials=150 * n, seed=3)),
        ("bit_flips_clustered", lambda: rh.bit_flips("clustered", trials=100 * n, seed=4)),
        ("concurrent_save_load_bm25", lambda: rh.concurrent_save_load("bm25", seconds=3.0 * n, readers=2)),
        ("concurrent_save_load_clustered", lambda: rh.concurrent_save_load("clustered", seconds=2.0 * n, readers=2)),
        ("queries_during_updates_bm25", lambda: rh.queries_during_updates("bm25", seconds=2.0 * n, threads=4)),
        ("queries_during_updates_clustered", lambda: rh.queries_during_updates("clustered", seconds=2.0 * n, threads=4)),
        ("fuzz", lambda: rh.fuzz(max_examples=50 * n, seed=5)),
    ]
    # the other persisted objects: dense exact and HNSW, both frameworks' retrievers
    for i, kind in enumerate(("dense_exact", "dense_hnsw", "llamaindex_bm25", "langchain_bm25")):
        plan += [
            (f"kill_at_every_step_{kind}", lambda kind=kind: rh.kill_at_steps(kind, repeats=max(1, n // 5))),
            (f"kill_random_{kind}", lambda kind=kind, i=i: rh.kill_random(kind, trials=4 * n, seed=10 + i)),
            (f"bit_flips_{kind}", lambda kind=kind, i=i: rh.bit_flips(kind, trials=40 * n, seed=20 + i)),
            (f"concurrent_save_load_{kind}", lambda kind=kind: rh.concurrent_save_load(kind, seconds=1.0 * n, readers=2)),
        ]
    plan += [(f"io_errors_{kind}", lambda kind=kind: rh.io_errors(kind)) for kind in rh.KINDS]
    plan.append(("tenant_isolation", rh.tenant_suite))
    # what is read back but was not written by this run: the evaluation's output and score cache,
    # the cross-encoder's ONNX export cache, and filters (floors x per-call, save/load)
    plan += [
        ("eval_cache", lambda: th.eval_cache_campaign(trials=12 * n, seed=30)),
        ("export_cache", lambda: th.export_cache_campaign(trials=2 * n, seed=31)),
        ("filters", lambda: th.filter_campaign(trials=150 * n, save_trials=6 * n, seed=32)),
    ]
    for name, run in plan:
        t = time.perf_counter()
        res = run()
        res["seconds"] = round(time.perf_counter() - t, 2)
        out["experiments"][name] = res
        print(name, json.dumps({k: v for k, v in res.items() if k not in ("by_file", "per_step")}), flush=True)
    ex = out["experiments"]
    kills = [ex[k] for k in ex if k.startswith("kill")]
    flips = [ex[k] for k in ex if k.startswith("bit_flips")]
    conc = [ex[k] for k in ex if k.startswith("concurrent")]
    upd = [ex[k] for k in ex if k.startswith("queries")]
    ioe = [ex[k] for k in ex if k.startswith("io_errors")]
    ten = ex["tenant_isolation"]
    out["summary"] = {
        "kill_during_save": {"trials": sum(k["trials"] for k in kills), "survived": sum(k["survived"] for k in kills),
                             "neither_loadable": sum(k["neither"] for k in kills),
                             "orphans_after_next_save": sum(k["orphans_after_next_save"] for k in kills)},
        "bit_flips": {"trials": sum(f["trials"] for f in flips), "detected": sum(f["detected"] for f in flips),
                      "harmless": sum(f["harmless"] for f in flips), "silent": sum(f["silent"] for f in flips)},
        "concurrent_save_load": {"trials": sum(c["loads"] + c["errors"] for c in conc),
                                 "survived": sum(c["loads"] - c["mixed"] for c in conc),
                                 "mixed": sum(c["mixed"] for c in conc), "errors": sum(c["errors"] for c in conc),
                                 "saves": sum(c["saves"] for c in conc)},
        "queries_during_updates": {"trials": sum(u["queries"] + u["errors"] for u in upd),
                                   "survived": sum(u["queries"] - u["wrong"] for u in upd),
                                   "wrong": sum(u["wrong"] for u in upd), "errors": sum(u["errors"] for u in upd),
                                   "updates": sum(u["updates"] for u in upd)},
        "fuzz": {"trials": ex["fuzz"]["examples"], "failures": ex["fuzz"]["failures"]},
        "io_errors": {"trials": sum(e["trials"] for e in ioe),
                      "raised_loaded_previous": sum(e["raised_loaded_previous"] for e in ioe),
                      "succeeded_loaded_new": sum(e["succeeded_loaded_new"] for e in ioe),
                      "raised_but_committed": sum(e["raised_but_committed"] for e in ioe),
                      "neither": sum(e["neither"] for e in ioe),
                      "orphans_after_next_save": sum(e["orphans_after_next_save"] for e in ioe)},
        "tenant_isolation": {"probes": ten["probes"], "leaks_or_failures": ten["leaks_or_failures"],
                             "xfailed_until_settings_rework": ten["xfailed_until_settings_rework"]},
        "eval_cache": {k: ex["eval_cache"][k] for k in ("trials", "same", "refused", "recomputed_with_warning",
                                                         "silent", "wrong_with_warning", "raw_errors",
                                                         "outside_touched", "blocked", "bad")},
        "export_cache": {k: ex["export_cache"][k] for k in ("trials", "same", "reused", "refused", "silent",
                                                             "foreign_scores", "raw_errors", "blocked", "bad")},
        "filters": {k: ex["filters"][k] for k in ("trials", "ok", "refused_as_expected", "widened", "call_ignored",
                                                   "wrong", "unexpected_errors", "save_trials",
                                                   "saved_and_kept_floor", "unsaveable_refused",
                                                   "unsaveable_saved", "bad")},
        "objects": sorted(k[len("kill_at_every_step_"):] for k in ex if k.startswith("kill_at_every_step_")),
    }
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["machine_after"] = machine()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, sort_keys=False) + "\n")
    print(json.dumps(out["summary"], indent=1))
    bad = (out["summary"]["kill_during_save"]["neither_loadable"] + out["summary"]["kill_during_save"]["orphans_after_next_save"]
           + out["summary"]["bit_flips"]["silent"] + out["summary"]["concurrent_save_load"]["mixed"]
           + out["summary"]["queries_during_updates"]["wrong"] + out["summary"]["queries_during_updates"]["errors"]
           + out["summary"]["fuzz"]["failures"] + out["summary"]["io_errors"]["neither"]
           + out["summary"]["io_errors"]["raised_but_committed"]
           + out["summary"]["io_errors"]["orphans_after_next_save"]
           + out["summary"]["tenant_isolation"]["leaks_or_failures"]
           + out["summary"]["eval_cache"]["bad"] + out["summary"]["export_cache"]["bad"]
           + out["summary"]["filters"]["bad"])
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
