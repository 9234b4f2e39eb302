"""Where a cross-encoder's first call goes, per runtime: import, export, compile/load, first batch.

    python benchmarks/bench_first_call.py [--model models/minilm-squad-ce] [--repeats 3]

Every measurement runs in a fresh Python process, with the export folder ``cold`` (empty) or
``cached`` (what a previous process left): ``e2e`` processes time the first and a warm
``CrossEncoderScorer(...).score`` call, ``phases`` processes the steps of ``CrossEncoderScorer._load``
one by one (docs/performance.md, where the table says what each step is). The 1-minute load average
is recorded per process; ``--quiet-load`` waits for it first. Writes ``results/first_call.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, load_average, parser, write_json

from funnel_core.evaluation.harness import wait_for_quiet

QUERY = "what protein regulates the circadian clock in mammals"
TEXTS = [f"Passage {i}: the circadian clock of mammals is driven by a transcriptional feedback loop in which "
         f"CLOCK and BMAL1 activate Period and Cryptochrome genes, whose proteins in turn repress them; "
         f"variant {i} adds detail on phosphorylation by casein kinase and degradation timing." for i in range(10)]
RUNTIMES = ("torch", "onnx", "openvino")


def child(mode: str, model: str, runtime: str, export_dir: str) -> dict:
    """Runs in the fresh process: returns seconds per step."""
    t = {}
    t0 = time.perf_counter()
    if mode == "e2e":
        from funnel_core.rerank.cross_encoder import CrossEncoderScorer

        t["import"] = time.perf_counter() - t0
        ce = CrossEncoderScorer(model, library="transformers", runtime=runtime, export_dir=export_dir,
                                max_length=256, dtype="float32")
        t1 = time.perf_counter()
        ce.score(QUERY, TEXTS)
        t["first_call"] = time.perf_counter() - t1
        warm = []
        for _ in range(5):
            t1 = time.perf_counter()
            ce.score(QUERY, TEXTS)
            warm.append(time.perf_counter() - t1)
        t["warm_call"] = statistics.median(warm)
        t["imported"] = sorted(m for m in ("torch", "transformers") if m in sys.modules)
        return t
    from funnel_core.rerank.cross_encoder import encode_pairs
    from funnel_core.rerank.runtimes import OnnxSession, PairTokenizer, export_onnx

    if runtime == "torch":
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        t["import"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        net = AutoModelForSequenceClassification.from_pretrained(model, dtype=torch.float32).eval()
        t["load"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        tok = AutoTokenizer.from_pretrained(model)
        t["tokenizer"] = time.perf_counter() - t1
        t1 = time.perf_counter()
        with torch.inference_mode():
            net(**encode_pairs(tok, [QUERY] * len(TEXTS), TEXTS, 256, return_tensors="pt")).logits
        t["first_batch"] = time.perf_counter() - t1
        return t
    # ONNX Runtime / OpenVINO: transformers (and torch) are imported only to export
    t["import"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    path = export_onnx(model, cache_dir=export_dir)
    t["export"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    session = OnnxSession(path, engine="openvino" if runtime == "openvino" else "onnxruntime")
    t["compile_or_load"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    pairs = PairTokenizer(path.parent, 256, "only_second")
    t["tokenizer"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    session(pairs([QUERY] * len(TEXTS), TEXTS))
    t["first_batch"] = time.perf_counter() - t1
    return t


def spawn(mode: str, model: str, runtime: str, export_dir: Path) -> dict:
    load = load_average()
    code = (f"import sys, json; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import bench_first_call as b; "
            f"print(json.dumps(b.child({mode!r}, {model!r}, {runtime!r}, {str(export_dir)!r})))")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": str(os.cpu_count())})
    if out.returncode:
        raise RuntimeError(f"{mode} {runtime} failed:\n{out.stderr[-3000:]}")
    wall = time.perf_counter() - t0
    return {"mode": mode, "runtime": runtime, "load_before": load, "process_seconds": wall,
            **json.loads(out.stdout.strip().splitlines()[-1])}


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--model", default=str(ROOT / "models" / "minilm-squad-ce"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quiet-load", type=float, default=1.0)
    p.add_argument("--quiet-timeout", type=float, default=900)
    p.add_argument("--install-note", default=None, help="how this environment was installed (recorded)")
    args = p.parse_args()
    wait_for_quiet(args.quiet_load, timeout=args.quiet_timeout, poll=10)  # the harness's wait
    runs = []
    for rep in range(args.repeats):
        for runtime in RUNTIMES[rep % 3:] + RUNTIMES[:rep % 3]:  # rotate the order per repeat
            for mode in ("e2e", "phases"):
                folder = Path(tempfile.mkdtemp(prefix="first_call_"))
                try:
                    for state in ("cold", "cached"):
                        r = spawn(mode, args.model, runtime, folder / "export")
                        runs.append({"state": state, "repeat": rep, **r})
                        print(json.dumps(runs[-1]))
                finally:
                    shutil.rmtree(folder, ignore_errors=True)
    summary: dict = {}
    for r in runs:
        steps = {k: v for k, v in r.items() if isinstance(v, float) and k != "process_seconds"}
        box = summary.setdefault(r["runtime"], {}).setdefault(r["state"], {}).setdefault(r["mode"], {})
        for k, v in {**steps, "process_seconds": r["process_seconds"]}.items():
            box.setdefault(k, []).append(v)
    for rt in summary.values():
        for st in rt.values():
            for mode, box in st.items():
                st[mode] = {k: statistics.median(v) for k, v in box.items()}
    loads = [r["load_before"][0] for r in runs if r["load_before"]]
    from funnel_core.rerank.runtimes import RUNTIMES as ALL
    from funnel_core.rerank.runtimes import choose_runtime, runtime_available

    installed = [r for r in ALL if r != "auto" and runtime_available(r)]
    write_json("first_call", {"model": args.model, "max_length": 256, "pairs": len(TEXTS),
                              "repeats": args.repeats, "median_seconds": summary, "runs": runs,
                              "max_load_before_a_run": max(loads) if loads else None,
                              "runtimes_installed": installed, "install": args.install_note,
                              "python_prefix": sys.prefix,
                              "auto_runtime_on_this_cpu": choose_runtime("auto", "cpu", "transformers")}, args.out)


if __name__ == "__main__":
    main()
