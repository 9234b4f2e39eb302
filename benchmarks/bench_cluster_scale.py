"""FunnelRAG clustering at scale, the real pipeline end to end.

    python benchmarks/bench_cluster_scale.py                        # 100k, 300k, 1M documents
    python benchmarks/bench_cluster_scale.py --sizes 1000000        # one size, merged into the JSON
    python benchmarks/bench_cluster_scale.py --quick                # 5k and 20k, smoke run
    python benchmarks/bench_cluster_scale.py --code-root /tmp/old --label before --sizes 100000
    python benchmarks/bench_cluster_scale.py --squad                # real SQuAD paragraphs: time + purity
    python benchmarks/bench_cluster_scale.py --sizes --merge other.json   # merge another run's rows

Pipeline per size (what :class:`funnel_core.funnelrag.clustered_index.ClusteredBM25Index` does): BM25 index over
the documents -> BM25 kNN adjacency (:func:`funnel_core.funnelrag.clustering.bm25_knn_adjacency`, k=20,
threshold 0.1) -> FunnelRAG Algorithm 1 + cluster units (:func:`funnel_core.funnelrag.clustering.build_clusters`,
S=4096 tokens) -> BM25 index over the cluster texts.

Each size runs in its own subprocess, so the peak RSS (``ru_maxrss`` of that process, read after
every step) is per size. Documents are synthetic and clusterable: 2,000 topics, each a set of
150 words drawn Zipf-wise from the SciFact vocabulary; a document is 60 words from its topic's set
plus 40 Zipf background words (the distribution of ``bench_bm25.synthetic_corpus``, generated
vectorised). The vocabulary is fixed, so posting lists grow linearly with n and so does the kNN
work per document (``knn_postings_per_document``: the summed posting length of a document's 16
query terms; the ``--squad`` row gives the same figure for real Wikipedia paragraphs).

Wall-clock seconds depend on how busy the shared machine is (``load_average_*``);
``step_cpu_seconds`` (process CPU time, all threads) does not, and is the figure to compare
between runs.

Writes benchmarks/results/cluster_scale.json (rows are merged by (label, n), so sizes can be run
separately) and cluster_scale.png: seconds per step and peak RSS against n, with power-law fits
``t = a * n^b`` over the sizes >= 100k and their extrapolation to FunnelRAG's 21M documents.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from common import RESULTS, load_average, machine, merge_rows, parser, save_json, scifact_texts, vocabulary

STEPS = ("bm25_index", "knn_graph", "algorithm1", "cluster_units", "cluster_index")
TARGET_N = 21_000_000


def synthetic_corpus(n: int, vocab: list[str], seed: int, words: int = 100, topics: int = 2000,
                     topic_size: int = 150, topic_share: float = 0.6) -> list[str]:
    rng = np.random.default_rng(seed)
    v = np.array(vocab)
    zipf = 1.0 / np.arange(1, len(v) + 1)
    zipf /= zipf.sum()
    cdf = np.cumsum(zipf)
    topic_words = np.stack([rng.choice(len(v), size=topic_size, replace=False, p=zipf) for _ in range(topics)])
    n_topic = int(words * topic_share)
    topic_of = rng.integers(topics, size=n)
    docs: list[str] = []
    for s in range(0, n, 20_000):
        m = min(20_000, n - s)
        tw = topic_words[topic_of[s:s + m, None], rng.integers(topic_size, size=(m, n_topic))]
        bg = np.minimum(np.searchsorted(cdf, rng.random((m, words - n_topic))), len(v) - 1)
        docs.extend(" ".join(r) for r in v[np.concatenate([tw, bg], axis=1)].tolist())
    return docs


def rss_peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def rss_now_mib() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")


def child(args) -> dict:
    """One size, in this process: returns the row (printed as the last stdout line)."""
    if args.code_root:
        sys.path.insert(0, str(args.code_root))
    import funnel_core
    from funnel_core.bm25 import BM25Index
    from funnel_core.funnelrag.clustering import bm25_knn_adjacency, build_clusters
    from funnel_core.units import Unit

    t0 = time.perf_counter()
    if args.child == 0:  # the real SQuAD corpus: every train + dev-a paragraph, one document each
        units = []
        for f in ("train", "dev-a"):
            data = json.loads((args.data / "squad" / f"squad-v1.1-{f}.json").read_text(encoding="utf-8"))["data"]
            units += [Unit(id=f"{f}-{ai}-{pi}", text=para["context"], metadata={"article": art["title"]})
                      for ai, art in enumerate(data) for pi, para in enumerate(art["paragraphs"])]
    else:
        texts = synthetic_corpus(args.child, vocabulary(scifact_texts(args.data)), seed=args.child)
        units = [Unit(id=str(i), text=t) for i, t in enumerate(texts)]
        del texts
    n = len(units)
    row: dict = {"n_documents": n, "corpus": "squad-train+dev-a paragraphs" if args.child == 0 else "synthetic",
                 "label": args.label, "code": str(Path(funnel_core.__file__).parent),
                 "load_average_at_start": load_average()}
    row["generate_seconds"] = time.perf_counter() - t0
    row["rss_after_generate_mib"] = rss_now_mib()
    seconds, cpu, peak = {}, {}, {}

    def step(name, fn):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        seconds[name] = time.perf_counter() - t
        cpu[name] = time.process_time() - c  # all threads; robust to other users' load
        peak[name] = rss_peak_mib()
        print(f"  n={n} {name}: {seconds[name]:.1f} s ({cpu[name]:.1f} CPU s), peak RSS so far {peak[name]:.0f} MiB",
              file=sys.stderr, flush=True)
        return out

    def document_index():
        """What ClusteredBM25Index.index does: term counts once, the document index weighted from
        them (and below, the cluster index from their sums)."""
        if not hasattr(BM25Index, "term_counts"):  # older code (--code-root)
            return BM25Index().index(units), None
        counts = BM25Index().term_counts([u.text for u in units])
        return BM25Index().index_counts(units, counts), counts

    index, counts = step("bm25_index", document_index)
    knn_kw = {} if args.backend is None else {"backend": args.backend}
    adj = step("knn_graph", lambda: bm25_knn_adjacency(index, k=args.k, threshold=args.threshold, **knn_kw))  # noqa: F821 (called before the del below)
    row["knn_postings_per_document"] = knn_work(index, args.k)
    del index
    t, c = time.perf_counter(), time.process_time()
    clusters, clustering = build_clusters(units, adjacency=adj, max_tokens=args.max_tokens)
    total, total_cpu = time.perf_counter() - t, time.process_time() - c
    seconds["algorithm1"] = clustering.seconds
    seconds["cluster_units"] = total - clustering.seconds
    cpu["algorithm1+cluster_units"] = total_cpu
    peak["algorithm1"] = peak["cluster_units"] = rss_peak_mib()
    print(f"  n={n} build_clusters: {total:.1f} s (Algorithm 1 {clustering.seconds:.1f} s)", file=sys.stderr, flush=True)
    step("cluster_index", lambda: BM25Index().index(clusters) if counts is None
         else BM25Index().index_counts(clusters, counts.grouped(clustering.members)))
    members = np.array([len(c.metadata["members"]) for c in clusters])
    tokens = np.array([c.metadata["n_tokens"] for c in clusters])
    if args.child == 0:
        article = {u.id: u.metadata["article"] for u in units}
        shared, purity = 0, 0
        for c in clusters:
            arts = [article[m] for m in c.metadata["members"]]
            counts = {a: arts.count(a) for a in set(arts)}
            purity += max(counts.values())
            shared += sum(v for v in counts.values() if v > 1)
        row["quality"] = {
            "purity": purity / n,  # share of documents in their cluster's majority article
            "with_same_article_paragraph": shared / n,  # share whose cluster holds another paragraph of their article
            "note": "paragraphs of one Wikipedia article are the natural neighbours; 1.0 is the best possible"}
    row.update({
        "step_seconds": seconds, "pipeline_seconds": sum(seconds.values()), "step_cpu_seconds": cpu,
        "peak_rss_mib_after_step": peak, "peak_rss_mib": rss_peak_mib(),
        "edges": int(adj.nnz // 2), "n_clusters": len(clusters), "compression": n / len(clusters),
        "mean_tokens_per_cluster": float(tokens.mean()), "max_tokens_per_cluster": int(tokens.max()),
        "singleton_clusters": int((members == 1).sum()), "load_average_at_end": load_average(),
        "cpu_seconds": resource.getrusage(resource.RUSAGE_SELF).ru_utime + resource.getrusage(resource.RUSAGE_SELF).ru_stime,
    })
    return row


def knn_work(index, query_terms: int = 16) -> float | None:
    """Summed posting length of every document's kNN query terms, per document: the work of the
    exact kNN graph (grows ~linearly in n per document when the vocabulary is fixed)."""
    try:
        from funnel_core.funnelrag.clustering import _query_matrix, bm25_weight_matrix
    except ImportError:  # older code
        return None
    w = bm25_weight_matrix(index)
    df = np.diff(w.tocsc().indptr).astype(np.float64)
    total = 0.0
    for s in range(0, w.shape[0], 50_000):
        total += float((_query_matrix(w[s:s + 50_000], query_terms) @ df).sum())
    return total / w.shape[0]


def fit(rows: list[dict], key) -> dict | None:
    pts = [(r["n_documents"], key(r)) for r in rows if r["n_documents"] >= 100_000 and key(r) > 0]
    if len(pts) < 2:
        return None
    x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    b, a = np.polyfit(x, y, 1)
    return {"exponent": float(b), "coef": float(np.exp(a)), "sizes": [p[0] for p in pts],
            "at_21M": float(np.exp(a) * TARGET_N ** b)}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax3, ax2) = plt.subplots(1, 3, figsize=(18, 5))
    cpu_steps = ("bm25_index", "knn_graph", "algorithm1+cluster_units", "cluster_index")
    for li, (label, block) in enumerate((lb, b) for lb, b in result["runs"].items()
                                         if any(r.get("step_cpu_seconds") for r in b["rows"])
                                         and lb != "squad"):
        for si, s in enumerate(cpu_steps):
            pts = sorted((r["n_documents"], (r.get("step_cpu_seconds") or {}).get(s)) for r in block["rows"])
            pts = [q for q in pts if q[1]]
            if pts:
                ax3.plot(*zip(*pts), "-" if li == 0 else ":", marker="os"[li % 2], color=f"C{si}", label=f"{s} ({label})")
            f = (block.get("cpu_fits") or {}).get(s)
            if f and s == "knn_graph":
                xs = np.geomspace(1e5, TARGET_N, 50)
                ax3.plot(xs, f["coef"] * xs ** f["exponent"], "--", color=f"C{si}", alpha=0.5, lw=1,
                         label=f"kNN fit n^{f['exponent']:.2f}")
    ax3.axhline(1200, color="grey", lw=0.8, ls="--")
    ax3.set_xscale("log"); ax3.set_yscale("log"); ax3.set_xlabel("documents"); ax3.set_ylabel("CPU seconds (all threads)")
    ax3.set_title("CPU seconds per step; line: 2 cores x 10 min", fontsize=9)
    ax3.legend(fontsize=6)
    for li, (label, block) in enumerate((lb, b) for lb, b in result["runs"].items() if lb != "squad"):
        rows = sorted(block["rows"], key=lambda r: r["n_documents"])
        if not rows:
            continue
        ns = np.array([r["n_documents"] for r in rows])
        style = "-" if li == 0 else ":"
        for si, s in enumerate(STEPS + ("pipeline",)):
            ys = [r["pipeline_seconds"] if s == "pipeline" else r["step_seconds"][s] for r in rows]
            ax1.plot(ns, ys, style, marker="o", color=f"C{si}", label=f"{s} ({label})")
            f = (block.get("fits") or {}).get(s)
            if f and s in ("knn_graph", "pipeline"):
                xs = np.geomspace(ns.min(), TARGET_N, 50)
                ax1.plot(xs, f["coef"] * xs ** f["exponent"], "--", color=f"C{si}", alpha=0.5, lw=1)
        ax2.plot(ns, [r["peak_rss_mib"] / 1024 for r in rows], style, marker="o", color="C0", label=f"peak RSS ({label})")
    ax1.axhline(300, color="grey", lw=0.8, ls="--")
    ax1.axvline(TARGET_N, color="grey", lw=0.8, ls=":")
    ax1.set_xscale("log"); ax1.set_yscale("log"); ax1.set_xlabel("documents"); ax1.set_ylabel("seconds")
    ax1.set_title("wall seconds per step on the shared machine (dashed: fit; line: 10 min)", fontsize=9)
    ax1.legend(fontsize=6, ncol=2)
    ax2.axhline(8, color="grey", lw=0.8, ls="--")
    ax2.set_xscale("log"); ax2.set_xlabel("documents"); ax2.set_ylabel("GiB"); ax2.set_title("peak RSS per size (line: 8 GiB)")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = parser(__doc__.splitlines()[0])  # --data, --quick (5k and 20k documents), --out
    p.set_defaults(out=RESULTS / "cluster_scale.json")
    p.add_argument("--sizes", type=int, nargs="*", default=None)
    p.add_argument("--k", type=int, default=20)
    p.add_argument("--threshold", type=float, default=0.1)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--backend", choices=("auto", "numba", "scipy"), default=None,
                   help="kNN backend (default: the library's default)")
    p.add_argument("--label", default="after", help="name of this run in the JSON (e.g. before/after)")
    p.add_argument("--code-root", type=Path, default=None,
                   help="import funnel_core from this folder (e.g. an export of an older commit)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per size")
    p.add_argument("--squad", action="store_true",
                   help="also run the pipeline on the real SQuAD train + dev-a paragraphs (cluster purity by article)")
    p.add_argument("--merge", type=Path, nargs="*", default=[],
                   help="add the rows of these result files (same format) before writing")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        print(json.dumps(child(args)))
        return
    sizes = args.sizes if args.sizes is not None else ([5_000, 20_000] if args.quick else [100_000, 300_000, 1_000_000])
    result = json.loads(args.out.read_text()) if args.out.is_file() else {}
    runs = result.get("runs", {})
    for other in args.merge:
        for label, ob in json.loads(other.read_text())["runs"].items():
            tb = runs.setdefault(label, {"rows": [], "args": ob.get("args", {})})
            tb["rows"] = sorted(merge_rows(tb["rows"], ob["rows"], lambda r: (r["n_documents"], r.get("corpus", "synthetic"))),
                                key=lambda r: r["n_documents"])
    block = runs.setdefault(args.label, {"rows": [], "args": {}})
    if args.squad:
        block = runs.setdefault("squad", {"rows": [], "args": {}})
        sizes = [0]
    if not sizes:
        for b in runs.values():
            refit(b)
        write(result, runs, args)
    for n in sizes:
        cmd = [sys.executable, __file__, "--child", str(n), "--data", str(args.data), "--k", str(args.k),
               "--threshold", str(args.threshold), "--max-tokens", str(args.max_tokens), "--label", args.label]
        if args.backend:
            cmd += ["--backend", args.backend]
        if args.code_root:
            cmd += ["--code-root", str(args.code_root)]
        print(f"[cluster_scale] {args.label} n={n:,}", flush=True)
        t = time.perf_counter()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=args.timeout)
        if proc.returncode != 0:
            raise SystemExit(f"size {n} failed with exit code {proc.returncode}")
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        row["subprocess_wall_seconds"] = time.perf_counter() - t
        print(f"  -> pipeline {row['pipeline_seconds']:.1f} s, peak RSS {row['peak_rss_mib']:.0f} MiB, "
              f"{row['n_clusters']:,} clusters", flush=True)
        block["rows"] = sorted(merge_rows(block["rows"], [row], lambda r: r["n_documents"]), key=lambda r: r["n_documents"])
        block["args"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                         if k not in ("child", "sizes", "out", "merge")}
        if args.code_root:  # the commit the old code was checked out at, for the command
            block["args"]["code_commit"] = subprocess.run(
                ["git", "-C", str(args.code_root), "rev-parse", "--short", "HEAD"],
                capture_output=True, text=True).stdout.strip() or None
        refit(block)
        write(result, runs, args)
    print(f"wrote {args.out}")
    if not args.quick:
        plot(result, args.out.with_suffix(".png"))


def refit(block: dict) -> None:
    rows = [r for r in block["rows"] if r.get("corpus", "synthetic") == "synthetic"]
    block["fits"] = {s: fit(rows, lambda r, s=s: r["step_seconds"][s]) for s in STEPS}
    block["fits"]["pipeline"] = fit(rows, lambda r: r["pipeline_seconds"])
    block["fits"]["peak_rss_mib"] = fit(rows, lambda r: r["peak_rss_mib"])
    steps_21m = {s: f["at_21M"] for s, f in block["fits"].items() if f and s in STEPS}
    block["extrapolation_21M"] = ({"seconds_per_step": steps_21m, "dominant_step": max(steps_21m, key=steps_21m.get),
                                   "pipeline_hours": sum(steps_21m.values()) / 3600,
                                   "peak_rss_gib": block["fits"]["peak_rss_mib"]["at_21M"] / 1024
                                   if block["fits"]["peak_rss_mib"] else None}
                                  if steps_21m else None)
    block["fits"]["knn_postings_per_document"] = fit(block["rows"], lambda r: r.get("knn_postings_per_document") or 0)

    # CPU seconds (all threads), insensitive to other users' load
    def cpu_of(r, s):
        return (r.get("step_cpu_seconds") or {}).get(s, 0)

    cpu_fits = {s: fit(rows, lambda r, s=s: cpu_of(r, s))
                for s in ("bm25_index", "knn_graph", "algorithm1+cluster_units", "cluster_index")}
    block["cpu_fits"] = cpu_fits
    at = {s: f["at_21M"] for s, f in cpu_fits.items() if f}
    block["extrapolation_21M_cpu"] = ({"cpu_seconds_per_step": at, "dominant_step": max(at, key=at.get),
                                       "cpu_hours_fitted_steps": sum(at.values()) / 3600} if at else None)
    block["ray_21M"] = ray_extrapolation(rows, cpu_fits.get("knn_graph"), cpu_of)


RAY_BLOCK_ROWS = 4096  # rows per kNN task (knn_adjacency_from_weights' chunk_size)


def ray_extrapolation(rows: list[dict], knn_fit: dict | None, cpu_of) -> dict | None:
    """The Ray engine's kNN graph at 21M documents: CPU seconds per block of RAY_BLOCK_ROWS rows,
    measured at each size here (the tasks run the same kernel on the same blocks), fitted
    ``a * n^b`` over the sizes and taken at 21M, times the blocks, divided by the workers (one core
    each; scheduling and shipping the weight matrix to the workers not counted)."""
    if not knn_fit:
        return None
    measured = {r["n_documents"]: cpu_of(r, "knn_graph") / r["n_documents"] * RAY_BLOCK_ROWS
                for r in rows if r["n_documents"] >= 100_000 and cpu_of(r, "knn_graph")}
    per_block = knn_fit["at_21M"] / TARGET_N * RAY_BLOCK_ROWS
    blocks = -(-TARGET_N // RAY_BLOCK_ROWS)
    return {"rows_per_block": RAY_BLOCK_ROWS, "blocks": blocks,
            "measured_cpu_seconds_per_block": measured, "cpu_seconds_per_block_at_21M": per_block,
            "wall_hours_by_workers": {w: blocks * per_block / w / 3600 for w in (2, 64, 512)},
            "fit_exponent": knn_fit["exponent"]}


def write(result: dict, runs: dict, args) -> None:
    result.update({"benchmark": "cluster_scale", "machine": machine(),  # CPU model and flags under machine.hardware
                   "target": {"n_documents": 1_000_000, "seconds": 300, "peak_rss_gib": 6},  # the speed target of the clustering work
                   "notes": __doc__.split("Pipeline per size", 1)[1].split("Writes", 1)[0].strip(),
                   "runs": runs})
    save_json(args.out, result, indent=2, default=float)


if __name__ == "__main__":
    main()
