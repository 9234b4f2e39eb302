"""The offline pipeline's local and Ray engines, wall time and parallel efficiency.

    python benchmarks/bench_offline_engines.py                          # 100k and 1M kNN, 10k embeddings
    python benchmarks/bench_offline_engines.py --sizes 1000000 --rows 98304   # part of the rows at 1M
    python benchmarks/bench_offline_engines.py --quick                  # 20k kNN, 500 embeddings

kNN graph (k=20, threshold 0.1, 16 query terms, numba) over N synthetic documents, by
:func:`funnel_core.funnelrag.clustering.knn_block` in this process with 1 or 2 numba threads, and by
:func:`funnel_core.offline.ray.knn_blocks` with 1 or 2 Ray tasks in flight; every configuration computes
the same rows (all N, or the first ``--rows``), the Ray blocks are checked entry for entry against the
local ones, and ``ray.init`` and a warm-up task per worker are timed apart. Parallel efficiency =
t(1) / (2 t(2)).

Documents: ``common.synthetic_term_ids`` over a 20,000-term vocabulary (2,000 topics of 150 term ids drawn
Zipf-wise; a document is 60 terms of its topic plus 40 Zipf background terms, as in bench_cluster_scale),
weighted by :func:`funnel_core.bm25.counts.bm25_weights` (Lucene BM25, k1 = 1.5, b = 0.75) from the term
counts directly, because this benchmark measures the kNN step, not tokenizing.

Embeddings: ``--embed-n`` synthetic 100-word texts (``common.synthetic_corpus``) embedded with the packaged
all-MiniLM-L6-v2 by :func:`funnel_core.offline.embed_texts`, locally (torch, 1 and 2 threads) and by Ray Data
(1 and 2 CPU actors; starting them and loading the model included, ray.init excluded). Load averages are
recorded per measurement. Writes benchmarks/results/offline_engines.json (rows merged by key).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from common import RESULTS, load_average, machine, merge_rows, parser, save_json, synthetic_term_ids

from funnel_core.bm25.counts import TermCounts, bm25_weights


def synthetic_weights(n: int, vocab: int = 20_000) -> sp.csr_matrix:
    """The (documents x terms) BM25 weights of ``n`` synthetic documents (seeded by ``n``)."""
    ids = np.concatenate(list(synthetic_term_ids(n, vocab, seed=n)))
    tf = sp.csr_matrix((np.ones(ids.size, np.int32), ids.ravel(), np.arange(0, ids.size + 1, ids.shape[1])),
                       shape=(n, vocab))
    tf.sum_duplicates()  # sorts the indices too
    scores, _ = bm25_weights(TermCounts(tf, tuple(map(str, range(vocab)))))
    w = sp.csc_matrix((scores["data"], scores["indices"], scores["indptr"]), shape=(n, len(scores["indptr"]) - 1))
    return w.tocsr().sorted_indices()


def measured(row: dict, fn, digits: int, texts: int = 0, **extra) -> tuple[dict, object]:
    """``row`` with ``fn()``'s seconds (rounded to ``digits``; with ``texts``, also texts per second), ``extra``
    and the load average before and after; and ``fn()``'s result."""
    before, t0 = load_average(2), time.perf_counter()
    result = fn()
    secs = time.perf_counter() - t0
    rate = {"texts_per_second": round(texts / secs, 1)} if texts else {}
    row = {**row, "seconds": round(secs, digits), **rate, **extra, "load_before": before, "load_after": load_average(2)}
    print(json.dumps(row), flush=True)
    return row, result


def bench_knn(n: int, rows: int | None, block: int, args) -> list[dict]:
    import numba

    from funnel_core.funnelrag.clustering import knn_block
    from funnel_core.offline import ray as ray_engine

    t0 = time.perf_counter()
    w = synthetic_weights(n)
    gen = time.perf_counter() - t0
    last = n if rows is None else min(n, rows)
    spans = [(s, min(last, s + block)) for s in range(0, last, block)]
    params = dict(k=20, threshold=0.1, query_terms=16, backend="numba")
    knn_block(w, 0, 8, **params)  # compile / load the numba kernel outside the timings
    base = {"n_documents": n, "rows_computed": last, "block_size": block, "n_blocks": len(spans),
            "nnz_weights": int(w.nnz), "generate_seconds": round(gen, 2), **params, "engine": "local"}
    same = lambda a, b: all((x != y).nnz == 0 for x, y in zip(a, b))
    out, ref = [], None

    def local(threads):
        numba.set_num_threads(threads)
        postings = w.tocsc()
        return [knn_block(w, s, e, postings=postings, **params) for s, e in spans]

    for threads in args.local_threads:
        row, blocks = measured({**base, "workers": threads, "threads_per_worker": threads}, partial(local, threads), 3)
        if ref is None:
            ref, row["edges_directed"] = blocks, int(sum(b.nnz for b in blocks))
        else:
            row["equal_to_first"] = same(ref, blocks)
        out.append(row)
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    t0 = time.perf_counter()
    ray = ray_engine.ensure_ray(num_cpus=max(args.ray_workers))
    init = round(time.perf_counter() - t0, 2)
    for workers in args.ray_workers:
        t0 = time.perf_counter()  # warm-up: start the workers, load the kernel, outside the timing
        ray_engine.knn_blocks(w[:2048], [(i * 8, i * 8 + 8) for i in range(4 * workers)], num_workers=workers,
                              **params)
        warm = round(time.perf_counter() - t0, 2)
        knn = partial(ray_engine.knn_blocks, w, spans, num_workers=workers, threads_per_worker=1, **params)
        row, blocks = measured({**base, "engine": "ray", "workers": workers, "threads_per_worker": 1}, knn, 3,
                               ray_init_seconds=init, warmup_seconds=warm)
        out.append({**row, "equal_to_local": same(ref, blocks)})
    ray.shutdown()
    return out


def bench_embed(n: int, args) -> list[dict]:
    import torch
    from common import scifact_vocabulary, synthetic_corpus

    from funnel_core import offline
    from funnel_core.embeddings import SentenceEmbedder
    from funnel_core.offline import ray as ray_engine

    scifact = (args.data / "scifact" / "corpus.jsonl").is_file()
    texts = synthetic_corpus(n, scifact_vocabulary(args.data) if scifact else [f"word{i}" for i in range(20000)])
    tmp = Path(tempfile.mkdtemp(prefix="bench-embed-"))
    out, ref = [], None
    try:
        SentenceEmbedder().encode(["warm up"])  # import sentence-transformers outside the timing
        for threads in args.local_threads:
            torch.set_num_threads(threads)
            embed = partial(offline.embed_texts, texts, tmp / f"local{threads}", engine="local", shard_rows=1024)
            row = {"n_texts": n, "engine": "local", "workers": threads, "torch_threads": threads}
            out.append(measured(row, embed, 2, texts=n)[0])
            ref = offline.read_embeddings(tmp / f"local{threads}")[1] if ref is None else ref
        t0 = time.perf_counter()
        ray = ray_engine.ensure_ray(num_cpus=max(args.ray_workers))
        init = round(time.perf_counter() - t0, 2)
        for workers in args.ray_workers:
            embed = partial(offline.embed_texts, texts, tmp / f"ray{workers}", engine="ray", num_workers=workers,
                            shard_rows=max(64, n // (4 * workers)))
            row, _ = measured({"n_texts": n, "engine": "ray", "workers": workers, "torch_threads": 1}, embed, 2,
                              texts=n, ray_init_seconds=init, includes_actor_start_and_model_load=True)
            emb = offline.read_embeddings(tmp / f"ray{workers}")[1]
            out.append({**row, "max_abs_diff_to_local": float(np.abs(emb - ref).max())})
        ray.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def efficiency(rows: list[dict], key: str) -> list[dict]:
    """1 against 2 workers, per size, rows computed and engine."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r[key], r.get("rows_computed"), r["engine"]), {})[r["workers"]] = r["seconds"]
    return [{key: size, "rows_computed": rows_computed, "engine": engine, "seconds_1": by[1], "seconds_2": by[2],
             "speedup": round(by[1] / by[2], 3), "parallel_efficiency": round(by[1] / (2 * by[2]), 3)}
            for (size, rows_computed, engine), by in sorted(groups.items(), key=lambda x: str(x[0]))
            if 1 in by and 2 in by]


def main() -> None:
    p = parser(__doc__.split("\n")[0])  # --data, --quick (20k kNN, 500 embeddings), --out
    p.set_defaults(out=RESULTS / "offline_engines.json")
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--rows", type=int, default=None,
                   help="compute only the first ROWS rows of sizes above 100k (each against all N)")
    p.add_argument("--block-size", type=int, default=4096)
    p.add_argument("--embed-n", type=int, default=10_000, help="texts to embed (0: skip)")
    p.add_argument("--local-threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--ray-workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--skip-knn", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.sizes, args.embed_n = [20_000], 500
    prev = json.loads(args.out.read_text()) if args.out.is_file() and not args.quick else {}
    knn_rows, embed_rows = prev.get("knn", []), prev.get("embeddings", [])
    for n in [] if args.skip_knn else args.sizes:
        knn_rows = merge_rows(knn_rows, bench_knn(n, args.rows if n > 100_000 else None, args.block_size, args),
                              lambda r: (r["n_documents"], r["rows_computed"], r["engine"], r["workers"]))
    if args.embed_n:
        embed_rows = merge_rows(embed_rows, bench_embed(args.embed_n, args),
                                lambda r: (r["n_texts"], r["engine"], r["workers"]))
    import ray

    save_json(args.out, {
        "benchmark": "offline_engines",
        "machine": {**machine(), "ray": ray.__version__},  # CPU model and flags under machine.hardware
        "notes": ("2 cores shared with other engineers' jobs (see load_before/load_after, often > 2): "
                  "absolute seconds are noisy and Ray cannot be faster than the local engine on 2 "
                  "cores; the point is that the Ray code path is the cluster code path. Parallel "
                  "efficiency = t(1 worker) / (2 * t(2 workers))."),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "knn": knn_rows, "knn_efficiency": efficiency(knn_rows, "n_documents"),
        "embeddings": embed_rows, "embeddings_efficiency": efficiency(embed_rows, "n_texts")})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
