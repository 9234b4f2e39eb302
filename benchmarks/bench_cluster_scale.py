"""FunnelRAG clustering at scale, the real pipeline end to end.

    python benchmarks/bench_cluster_scale.py                        # 100k, 300k, 1M documents
    python benchmarks/bench_cluster_scale.py --sizes 1000000        # one size, merged into the JSON
    python benchmarks/bench_cluster_scale.py --quick                # 5k and 20k, smoke run
    python benchmarks/bench_cluster_scale.py --code-root /tmp/old --label before --sizes 100000
    python benchmarks/bench_cluster_scale.py --squad --label squad  # real SQuAD paragraphs: time + purity

Pipeline per size (what ``ClusteredBM25Index.index`` does): BM25 index -> BM25 kNN graph (k=20, threshold
0.1) -> FunnelRAG Algorithm 1 + cluster units (S=4096 tokens) -> BM25 index over the cluster texts, each size
in its own subprocess (peak RSS per size), on clusterable synthetic documents (``common.synthetic_corpus``;
the vocabulary is fixed, so the kNN work per document, ``knn_postings_per_document``, grows linearly with n).
Wall seconds depend on the shared machine's load (``load_average_*``); ``step_cpu_seconds`` (all threads)
do not, and are the figures to compare between runs.

Writes benchmarks/results/cluster_scale.json (rows merged by (label, n)) with power-law fits ``t = a * n^b``
over the sizes >= 100k, extrapolated to FunnelRAG's 21M documents.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
from common import RESULTS, load_average, machine, merge_rows, parser, save_json, scifact_vocabulary, synthetic_corpus

STEPS = ("bm25_index", "knn_graph", "algorithm1", "cluster_units", "cluster_index")
CPU_STEPS = ("bm25_index", "knn_graph", "algorithm1+cluster_units", "cluster_index")
KNN = {"k": 20, "threshold": 0.1, "max_tokens": 4096, "backend": None}  # recorded with each run's arguments
TARGET_N = 21_000_000
RAY_BLOCK_ROWS = 4096  # rows per kNN task (knn_adjacency_from_weights' chunk_size)


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
        from funnel_core.evaluation.datasets import squad_dataset
        units = [u for f in ("train", "dev-a") for u in squad_dataset(args.data / f"squad/squad-v1.1-{f}.json").corpus]
    else:
        units = [Unit(id=str(i), text=t)
                 for i, t in enumerate(synthetic_corpus(args.child, scifact_vocabulary(args.data), seed=args.child))]
    n = len(units)
    with open("/proc/self/statm") as f:  # resident pages now
        rss_now = int(f.read().split()[1]) * resource.getpagesize() / 2**20
    row: dict = {"n_documents": n, "corpus": "squad-train+dev-a paragraphs" if args.child == 0 else "synthetic",
                 "label": args.label, "code": str(Path(funnel_core.__file__).parent),
                 "load_average_at_start": load_average(), "generate_seconds": time.perf_counter() - t0,
                 "rss_after_generate_mib": rss_now}
    seconds, cpu, peak = {}, {}, {}

    def step(name, fn):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        seconds[name], cpu[name] = time.perf_counter() - t, time.process_time() - c
        peak[name] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
        print(f"  n={n} {name}: {seconds[name]:.1f} s, {cpu[name]:.1f} CPU s", file=sys.stderr, flush=True)
        return out

    def document_index():  # as ClusteredBM25Index.index: term counts once, both indexes weighted from them
        counts = BM25Index().term_counts([u.text for u in units]) if hasattr(BM25Index, "term_counts") else None
        return (BM25Index().index(units) if counts is None else BM25Index().index_counts(units, counts)), counts

    index, counts = step("bm25_index", document_index)
    adj = step("knn_graph", partial(bm25_knn_adjacency, index, k=KNN["k"], threshold=KNN["threshold"]))
    row["knn_postings_per_document"] = knn_work(index, KNN["k"])  # 20 query terms, as in every recorded row
    del index
    clusters, clustering = step("algorithm1+cluster_units",
                                lambda: build_clusters(units, adjacency=adj, max_tokens=KNN["max_tokens"]))
    total = seconds.pop("algorithm1+cluster_units")  # split in two by Algorithm 1's own timing
    seconds["algorithm1"], seconds["cluster_units"] = clustering.seconds, total - clustering.seconds
    peak["algorithm1"] = peak["cluster_units"] = peak.pop("algorithm1+cluster_units")
    step("cluster_index", lambda: BM25Index().index(clusters) if counts is None
         else BM25Index().index_counts(clusters, counts.grouped(clustering.members)))
    tokens = np.array([c.metadata["n_tokens"] for c in clusters])
    if args.child == 0:  # paragraphs of one Wikipedia article are the natural neighbours
        article = {u.id: u.metadata["title"] for u in units}
        per_cluster = [np.unique([article[m] for m in c.metadata["members"]], return_counts=True)[1] for c in clusters]
        row["quality"] = {
            "purity": sum(c.max() for c in per_cluster) / n,  # share of documents in their cluster's majority article
            "with_same_article_paragraph": sum(c[c > 1].sum() for c in per_cluster) / n,  # with another of theirs
            "note": "paragraphs of one Wikipedia article are the natural neighbours; 1.0 is the best possible"}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {**row, "step_seconds": seconds, "pipeline_seconds": sum(seconds.values()), "step_cpu_seconds": cpu,
            "peak_rss_mib_after_step": peak, "peak_rss_mib": usage.ru_maxrss / 1024, "edges": int(adj.nnz // 2),
            "n_clusters": len(clusters), "compression": n / len(clusters), "load_average_at_end": load_average(),
            "mean_tokens_per_cluster": float(tokens.mean()), "max_tokens_per_cluster": int(tokens.max()),
            "singleton_clusters": sum(len(c.metadata["members"]) == 1 for c in clusters),
            "cpu_seconds": usage.ru_utime + usage.ru_stime}


def knn_work(index, query_terms: int) -> float:
    """Summed posting length of each document's kNN query terms, per document: the exact kNN graph's work."""
    from funnel_core.funnelrag.clustering import _query_matrix, bm25_weight_matrix

    w = bm25_weight_matrix(index)
    df = np.diff(w.tocsc().indptr).astype(np.float64)
    blocks = range(0, w.shape[0], 50_000)
    return sum(float((_query_matrix(w[s:s + 50_000], query_terms) @ df).sum()) for s in blocks) / w.shape[0]


def fit(rows: list[dict], key) -> dict | None:
    """``t = a * n^b`` fitted (log-log) over the rows of >= 100k documents, and taken at 21M."""
    pts = [(r["n_documents"], key(r)) for r in rows if r["n_documents"] >= 100_000 and key(r) > 0]
    if len(pts) < 2:
        return None
    b, a = np.polyfit(np.log([p[0] for p in pts]), np.log([p[1] for p in pts]), 1)
    return {"exponent": float(b), "coef": float(np.exp(a)), "sizes": [p[0] for p in pts],
            "at_21M": float(np.exp(a) * TARGET_N ** b)}


def at_21m(fits: dict, per_step: str, hours: str, **extra) -> dict | None:
    at = {s: f["at_21M"] for s, f in fits.items() if f}
    return {per_step: at, "dominant_step": max(at, key=at.get), hours: sum(at.values()) / 3600, **extra} if at else None


def cpu_of(row: dict, step: str) -> float:  # CPU seconds (all threads): insensitive to other users' load
    return (row.get("step_cpu_seconds") or {}).get(step, 0)


def refit(block: dict) -> None:
    rows = [r for r in block["rows"] if r.get("corpus", "synthetic") == "synthetic"]
    wall = {s: fit(rows, lambda r, s=s: r["step_seconds"][s]) for s in STEPS}
    rss = fit(rows, lambda r: r["peak_rss_mib"])
    block["fits"] = {**wall, "pipeline": fit(rows, lambda r: r["pipeline_seconds"]), "peak_rss_mib": rss,
                     "knn_postings_per_document": fit(block["rows"], lambda r: r.get("knn_postings_per_document") or 0)}
    block["extrapolation_21M"] = at_21m(wall, "seconds_per_step", "pipeline_hours",
                                        peak_rss_gib=rss["at_21M"] / 1024 if rss else None)
    block["cpu_fits"] = {s: fit(rows, lambda r, s=s: cpu_of(r, s)) for s in CPU_STEPS}
    block["extrapolation_21M_cpu"] = at_21m(block["cpu_fits"], "cpu_seconds_per_step", "cpu_hours_fitted_steps")
    knn_fit = block["cpu_fits"]["knn_graph"]
    block["ray_21M"] = ray_extrapolation(rows, knn_fit) if knn_fit else None


def ray_extrapolation(rows: list[dict], knn_fit: dict) -> dict:
    """The Ray engine's kNN graph at 21M documents: its tasks run the same kernel on blocks of RAY_BLOCK_ROWS
    rows, so a block costs the fitted kNN CPU seconds at 21M / 21M * rows; all blocks over one core per worker."""
    measured = {r["n_documents"]: cpu_of(r, "knn_graph") / r["n_documents"] * RAY_BLOCK_ROWS
                for r in rows if r["n_documents"] >= 100_000 and cpu_of(r, "knn_graph")}
    per_block, blocks = knn_fit["at_21M"] / TARGET_N * RAY_BLOCK_ROWS, -(-TARGET_N // RAY_BLOCK_ROWS)
    return {"rows_per_block": RAY_BLOCK_ROWS, "blocks": blocks, "measured_cpu_seconds_per_block": measured,
            "cpu_seconds_per_block_at_21M": per_block,
            "wall_hours_by_workers": {w: blocks * per_block / w / 3600 for w in (2, 64, 512)},
            "fit_exponent": knn_fit["exponent"]}


def main() -> None:
    p = parser(__doc__.splitlines()[0])  # --data, --quick (5k and 20k documents), --out
    p.set_defaults(out=RESULTS / "cluster_scale.json")
    p.add_argument("--sizes", type=int, nargs="*", default=None)
    p.add_argument("--label", default="after", help="name of this run in the JSON (e.g. before/after)")
    p.add_argument("--code-root", type=Path, default=None,
                   help="import funnel_core from this folder (e.g. a worktree of an older commit)")
    p.add_argument("--squad", action="store_true",
                   help="run on the real SQuAD train + dev-a paragraphs instead (cluster purity by article)")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        print(json.dumps(child(args)))
        return
    sizes = args.sizes if args.sizes is not None else ([5_000, 20_000] if args.quick else [100_000, 300_000, 1_000_000])
    result = json.loads(args.out.read_text()) if args.out.is_file() else {}
    runs = result.get("runs", {})
    block = runs.setdefault("squad" if args.squad else args.label, {"rows": [], "args": {}})
    for n in [0] if args.squad else sizes:  # n = 0: the SQuAD paragraphs
        t = time.perf_counter()  # the child parses this command line again, with --child; it reports on stderr
        proc = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--child", str(n)], stdout=subprocess.PIPE,
                              text=True, check=True)
        row = {**json.loads(proc.stdout.strip().splitlines()[-1]), "subprocess_wall_seconds": time.perf_counter() - t}
        block["rows"] = sorted(merge_rows(block["rows"], [row], lambda r: r["n_documents"]),
                               key=lambda r: r["n_documents"])
        block["args"] = {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                            if k not in ("child", "sizes", "out")}, **KNN}
        if args.code_root:  # the commit the old code was checked out at, for the command
            git = ["git", "-C", str(args.code_root), "rev-parse", "--short", "HEAD"]
            block["args"]["code_commit"] = subprocess.run(git, capture_output=True, text=True).stdout.strip() or None
        refit(block)
        result.update({"benchmark": "cluster_scale", "machine": machine(),  # CPU model and flags: machine.hardware
                       "target": {"n_documents": 1_000_000, "seconds": 300, "peak_rss_gib": 6},  # the speed target
                       "notes": __doc__.split("Pipeline per size", 1)[1].split("Writes", 1)[0].strip(), "runs": runs})
        save_json(args.out, result, indent=2, default=float)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
