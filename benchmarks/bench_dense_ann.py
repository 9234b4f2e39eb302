"""DenseIndex HNSW (faiss) against exact search: recall@10/@100 and p50/p95 seconds
per query at 100k (and 1M) vectors.

    nice -n 10 python benchmarks/bench_dense_ann.py --sizes 100000 1000000

Vectors are SYNTHETIC (384-d, around 2,000 Gaussian centres, L2-normalised); a query is a corpus
vector plus a random direction of norm ``--query-noise``. Recall@k, ``source@10``, ``sim_ratio@10``
and ``exact_sim`` are defined in docs/performance.md (with why runs before 2026-11-23 14:00 differ).
Each size (and HNSW setting) is written to benchmarks/results/dense_ann.json as soon as it finishes.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from common import RESULTS, LatencyReport, parser, timer, write_json

from funnel_core.embeddings import DenseIndex, SentenceEmbedder
from funnel_core.units import Unit


def synthetic(n: int, d: int, nq: int, seed: int = 0,
              query_noise: float = 0.3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(2000, d)).astype(np.float32)
    x = np.empty((n, d), dtype=np.float32)
    for s in range(0, n, 100_000):
        e = min(n, s + 100_000)
        x[s:e] = centers[rng.integers(2000, size=e - s)] + 0.6 * rng.normal(size=(e - s, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    source = rng.integers(n, size=nq)
    noise = rng.normal(size=(nq, d)).astype(np.float32)
    q = x[source] + query_noise * noise / np.linalg.norm(noise, axis=1, keepdims=True)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return x, q, source


def run_size(n: int, d: int, nq: int, m: int, ef_search: list[int], ef_construction: int = 80,
             query_noise: float = 0.3) -> dict:
    x, q, source = synthetic(n, d, nq, seed=n, query_noise=query_noise)
    units = [Unit(id=str(i), text="") for i in range(n)]
    emb = SentenceEmbedder(cache=False)  # never loaded: embeddings and query embeddings are given
    exact = DenseIndex(emb, index="exact").index(units, embeddings=x)
    with timer() as tb:
        hnsw = DenseIndex(emb, index="hnsw", hnsw_m=m, ef_construction=ef_construction).index(units, embeddings=x)
    print(f"[{n}] HNSW built in {tb['seconds']:.1f} s")
    out: dict = {"n_vectors": n, "dimension": d, "n_queries": nq, "hnsw_m": m,
                 "ef_construction": hnsw.ef_construction, "hnsw_build_seconds": tb["seconds"],
                 "vectors": "synthetic (Gaussian clusters, L2-normalised)",
                 "query_noise": query_noise, "exact": {}, "hnsw": {}}
    truth: dict = {}
    exact_sims: dict = {}
    for k in (10, 100):
        rep = LatencyReport(f"exact k={k}")
        res = []
        for i in range(nq):
            with rep.time():
                res.append(exact.search_many(["q"], k=k, query_embeddings=q[i:i + 1])[0])
        truth[k] = [{u.id for u in r} for r in res]
        exact_sims[k] = [[u.score for u in r] for r in res]
        out["exact"][str(k)] = rep.summary()
    ranks = np.asarray(exact_sims[100])
    out["exact_sim"] = {f"rank_{r}": float(ranks[:, r - 1].mean()) for r in (1, 2, 10, 100)}
    out["exact"]["source@10"] = float(np.mean([str(s) in t for s, t in zip(source, truth[10])]))
    for ef in ef_search:
        hnsw.ef_search = ef
        row = {}
        for k in (10, 100):
            rep = LatencyReport(f"hnsw ef_search={ef} k={k}")
            rec, found, ratio = [], [], []
            for i in range(nq):
                with rep.time():
                    r = hnsw.search_many(["q"], k=k, query_embeddings=q[i:i + 1])[0]
                rec.append(len({u.id for u in r} & truth[k][i]) / k)
                found.append(str(source[i]) in {u.id for u in r[:10]})
                ratio.append(sum(u.score for u in r[:10]) / sum(exact_sims[k][i][:10]))
            row[str(k)] = {f"recall@{k}": float(np.mean(rec)), "latency": rep.summary()}
            if k == 10:
                row[str(k)].update({"source@10": float(np.mean(found)), "sim_ratio@10": float(np.mean(ratio))})
        out["hnsw"][f"ef_search={ef}"] = row
        print(f"[{n}] ef_search={ef}: recall@10 {row['10']['recall@10']:.3f} p50 {row['10']['latency']['p50_s'] * 1e3:.2f} ms"
              f" / recall@100 {row['100']['recall@100']:.3f} p50 {row['100']['latency']['p50_s'] * 1e3:.2f} ms;"
              f" exact p50 {out['exact']['10']['p50_s'] * 1e3:.2f} ms")
    return out


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="*", default=[100_000, 1_000_000])
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--m", type=int, default=32)
    p.add_argument("--ef-search", type=int, nargs="*", default=[64, 128, 256])
    p.add_argument("--ef-construction", type=int, default=80)
    p.add_argument("--query-noise", type=float, default=0.3,
                   help="L2 norm of the perturbation added to a unit corpus vector to make a query")
    args = p.parse_args()
    out_path = args.out or RESULTS / "dense_ann.json"
    result = json.loads(out_path.read_text()) if out_path.is_file() else {}
    sizes = {k: v for k, v in result.get("sizes", {}).items() if "query_noise" in v}  # current queries only
    for n in (args.sizes if not args.quick else [20_000]):
        t0 = time.perf_counter()
        key = str(n) if (args.m, args.ef_construction) == (32, 80) else f"{n} M={args.m} efC={args.ef_construction}"
        sizes[key] = run_size(n, args.dim, args.queries, args.m, args.ef_search, args.ef_construction,
                              args.query_noise)
        sizes[key]["total_seconds"] = time.perf_counter() - t0
        sizes[key]["command"] = "python benchmarks/bench_dense_ann.py " + " ".join(sys.argv[1:])
        write_json("dense_ann", {"args": {k: str(v) for k, v in vars(args).items()}, "sizes": sizes}, out_path)


if __name__ == "__main__":
    main()
