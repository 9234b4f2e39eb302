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

Documents: 2,000 topics of 150 term ids drawn Zipf-wise from a 20,000-term vocabulary; a
document is 60 terms of its topic plus 40 Zipf background terms (the distribution of
``bench_cluster_scale``). The (documents x terms) Lucene BM25 weights (k1 = 1.5, b = 0.75,
idf = ln(1 + (N - df + 0.5) / (df + 0.5))) are computed from the term counts directly with
scipy, because this benchmark measures the kNN step, not tokenizing.

Embeddings: ``--embed-n`` synthetic 100-word texts embedded with the packaged all-MiniLM-L6-v2 by
:func:`funnel_core.offline.embed_texts`, locally (torch, 1 and 2 threads) and by Ray Data (1 and 2
CPU actors; starting them and loading the model included, ray.init excluded). Load averages are
recorded per measurement. Writes benchmarks/results/offline_engines.json (rows merged by key).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, load_average, machine, merge_rows, parser, save_json, scifact_texts, vocabulary  # noqa: E402

OUT = RESULTS / "offline_engines.json"


def synthetic_weights(n: int, seed: int = 0, vocab: int = 20000, topics: int = 2000,
                      topic_size: int = 150, words: int = 100, topic_share: float = 0.6,
                      k1: float = 1.5, b: float = 0.75) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    zipf = 1.0 / np.arange(1, vocab + 1)
    zipf /= zipf.sum()
    topic_terms = np.stack([rng.choice(vocab, size=topic_size, replace=False, p=zipf)
                            for _ in range(topics)])
    n_topic = int(words * topic_share)
    rows_w, cols_w = [], []
    for s in range(0, n, 100_000):
        m = min(n, s + 100_000) - s
        t = rng.integers(topics, size=m)
        tw = topic_terms[t[:, None], rng.integers(topic_size, size=(m, n_topic))]
        bg = rng.choice(vocab, size=(m, words - n_topic), p=zipf)
        rows_w.append(np.repeat(np.arange(s, s + m), words))
        cols_w.append(np.concatenate([tw, bg], axis=1).ravel())
    tf = sp.csr_matrix((np.ones(n * words, np.float64), (np.concatenate(rows_w), np.concatenate(cols_w))),
                       shape=(n, vocab))
    tf.sum_duplicates()
    dl = np.asarray(tf.sum(axis=1)).ravel()
    df = np.diff(tf.tocsc().indptr)
    idf = np.log(1.0 + (n - df + 0.5) / (df + 0.5))
    row = np.repeat(np.arange(n), np.diff(tf.indptr))
    norm = k1 * (1.0 - b + b * dl / dl.mean())
    data = idf[tf.indices] * tf.data * (k1 + 1.0) / (tf.data + norm[row])
    w = sp.csr_matrix((data.astype(np.float32), tf.indices, tf.indptr), shape=tf.shape)
    w.sort_indices()
    return w


def run_local(w, spans, threads, params):
    import numba

    from funnel_core.funnelrag.clustering import knn_block

    numba.set_num_threads(threads)
    t0 = time.perf_counter()
    postings = w.tocsc()
    blocks = [knn_block(w, s, e, postings=postings, **params) for s, e in spans]
    return time.perf_counter() - t0, blocks


def bench_knn(n: int, rows: int | None, block: int, args) -> list[dict]:
    import numba

    from funnel_core.funnelrag.clustering import knn_block
    from funnel_core.offline import ray as ray_engine

    t0 = time.perf_counter()
    w = synthetic_weights(n, seed=n)
    gen = time.perf_counter() - t0
    last = n if rows is None else min(n, rows)
    spans = [(s, min(last, s + block)) for s in range(0, last, block)]
    params = dict(k=20, threshold=0.1, query_terms=16, backend="numba")
    knn_block(w, 0, 8, **params)  # compile / load the numba kernel outside the timings
    out = []
    base = {"n_documents": n, "rows_computed": last, "block_size": block, "n_blocks": len(spans),
            "nnz_weights": int(w.nnz), "generate_seconds": round(gen, 2), **params}
    ref = None
    for threads in args.local_threads:
        la = load_average(2)
        secs, blocks = run_local(w, spans, threads, params)
        row = {**base, "engine": "local", "workers": threads, "threads_per_worker": 1 if threads == 1 else threads,
               "seconds": round(secs, 3), "load_before": la, "load_after": load_average(2)}
        if ref is None:
            ref = blocks
            row["edges_directed"] = int(sum(b.nnz for b in blocks))
        else:
            row["equal_to_first"] = all((a != c).nnz == 0 for a, c in zip(ref, blocks))
        print(json.dumps(row), flush=True)
        out.append(row)
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    t0 = time.perf_counter()
    ray = ray_engine.ensure_ray(num_cpus=max(args.ray_workers))
    init = time.perf_counter() - t0
    for workers in args.ray_workers:
        t0 = time.perf_counter()  # warm-up: start the workers, load the kernel, outside the timing
        ray_engine.knn_blocks(w[:2048], [(i * 8, i * 8 + 8) for i in range(4 * workers)],
                              num_workers=workers, **params)
        warm = time.perf_counter() - t0
        la = load_average(2)
        t0 = time.perf_counter()
        blocks = ray_engine.knn_blocks(w, spans, num_workers=workers, threads_per_worker=1, **params)
        secs = time.perf_counter() - t0
        row = {**base, "engine": "ray", "workers": workers, "threads_per_worker": 1,
               "seconds": round(secs, 3), "ray_init_seconds": round(init, 2),
               "warmup_seconds": round(warm, 2), "load_before": la, "load_after": load_average(2),
               "equal_to_local": all((a != c).nnz == 0 for a, c in zip(ref, blocks))}
        print(json.dumps(row), flush=True)
        out.append(row)
    ray.shutdown()
    return out


def texts_for_embedding(n: int, data: Path) -> list[str]:
    scifact = (data / "scifact" / "corpus.jsonl").is_file()
    vocab = (vocabulary(scifact_texts(data, title=False)) if scifact else []) or [f"word{i}" for i in range(20000)]
    rng = np.random.default_rng(0)
    v = np.array(vocab)
    zipf = 1.0 / np.arange(1, len(v) + 1)
    zipf /= zipf.sum()
    return [" ".join(v[rng.choice(len(v), size=100, p=zipf)]) for _ in range(n)]


def bench_embed(n: int, args) -> list[dict]:
    import torch

    from funnel_core import offline
    from funnel_core.offline import ray as ray_engine

    texts = texts_for_embedding(n, args.data)
    tmp = Path(tempfile.mkdtemp(prefix="bench-embed-"))
    out, ref = [], None
    try:
        from funnel_core.embeddings import SentenceEmbedder

        SentenceEmbedder().encode(["warm up"])  # import sentence-transformers outside the timing
        for threads in args.local_threads:
            torch.set_num_threads(threads)
            la = load_average(2)
            t0 = time.perf_counter()
            offline.embed_texts(texts, tmp / f"local{threads}", engine="local", shard_rows=1024)
            secs = time.perf_counter() - t0
            ids, emb = offline.read_embeddings(tmp / f"local{threads}")
            row = {"n_texts": n, "engine": "local", "workers": threads, "torch_threads": threads,
                   "seconds": round(secs, 2), "texts_per_second": round(n / secs, 1),
                   "load_before": la, "load_after": load_average(2)}
            if ref is None:
                ref = emb
            print(json.dumps(row), flush=True)
            out.append(row)
        t0 = time.perf_counter()
        ray = ray_engine.ensure_ray(num_cpus=max(args.ray_workers))
        init = time.perf_counter() - t0
        for workers in args.ray_workers:
            la = load_average(2)
            t0 = time.perf_counter()
            offline.embed_texts(texts, tmp / f"ray{workers}", engine="ray", num_workers=workers,
                                shard_rows=max(64, n // (4 * workers)))
            secs = time.perf_counter() - t0
            ids, emb = offline.read_embeddings(tmp / f"ray{workers}")
            row = {"n_texts": n, "engine": "ray", "workers": workers, "torch_threads": 1,
                   "seconds": round(secs, 2), "texts_per_second": round(n / secs, 1),
                   "ray_init_seconds": round(init, 2), "includes_actor_start_and_model_load": True,
                   "max_abs_diff_to_local": float(np.abs(emb - ref).max()),
                   "load_before": la, "load_after": load_average(2)}
            print(json.dumps(row), flush=True)
            out.append(row)
        ray.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def efficiency(rows: list[dict], key: str) -> list[dict]:
    eff = []
    groups: dict = {}
    for r in rows:
        groups.setdefault((r[key], r.get("rows_computed"), r["engine"]), {})[r["workers"]] = r["seconds"]
    for (size, rows_computed, engine), by in sorted(groups.items(), key=lambda x: str(x[0])):
        if 1 in by and 2 in by:
            eff.append({key: size, "rows_computed": rows_computed, "engine": engine,
                        "seconds_1": by[1], "seconds_2": by[2], "speedup": round(by[1] / by[2], 3),
                        "parallel_efficiency": round(by[1] / (2 * by[2]), 3)})
    return eff


def main() -> None:
    p = parser(__doc__.split("\n")[0])  # --data, --quick (20k kNN, 500 embeddings), --out
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--rows", type=int, default=None,
                   help="compute only the first ROWS rows of sizes above 100k (each against all N)")
    p.add_argument("--block-size", type=int, default=4096)
    p.add_argument("--embed-n", type=int, default=10_000, help="texts to embed (0: skip)")
    p.add_argument("--local-threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--ray-workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--skip-knn", action="store_true")
    args = p.parse_args()
    args.out = args.out or OUT
    if args.quick:
        args.sizes, args.embed_n = [20_000], 500
    prev = json.loads(args.out.read_text()) if args.out.is_file() and not args.quick else {}
    knn_rows = prev.get("knn", [])
    embed_rows = prev.get("embeddings", [])
    if not args.skip_knn:
        for n in args.sizes:
            knn_rows = merge_rows(knn_rows, bench_knn(n, args.rows if n > 100_000 else None, args.block_size, args),
                                  lambda r: (r["n_documents"], r["rows_computed"], r["engine"], r["workers"]))
    if args.embed_n:
        embed_rows = merge_rows(embed_rows, bench_embed(args.embed_n, args), lambda r: (r["n_texts"], r["engine"], r["workers"]))
    import ray

    payload = {
        "benchmark": "offline_engines",
        "machine": {**machine(), "ray": ray.__version__},  # CPU model and flags under machine.hardware
        "notes": ("2 cores shared with other engineers' jobs (see load_before/load_after, often > 2): "
                  "absolute seconds are noisy and Ray cannot be faster than the local engine on 2 "
                  "cores; the point is that the Ray code path is the cluster code path. Parallel "
                  "efficiency = t(1 worker) / (2 * t(2 workers))."),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "knn": knn_rows,
        "knn_efficiency": efficiency(knn_rows, "n_documents"),
        "embeddings": embed_rows,
        "embeddings_efficiency": efficiency(embed_rows, "n_texts"),
    }
    save_json(args.out, payload)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
