"""Issue 19: DenseIndex HNSW (faiss) against exact search: recall@10/@100 and p50/p95 seconds
per query at 100k (and 1M) vectors.

    nice -n 10 python benchmarks/bench_dense_ann.py --sizes 100000 1000000

Vectors are SYNTHETIC: 384-d (MiniLM's width), drawn around 2,000 Gaussian cluster centres and
L2-normalised; queries are perturbed corpus vectors. Recall@k = overlap of the HNSW top-k with
the exact top-k (the numpy brute-force search of the same DenseIndex class), averaged over
queries. Each size is written to benchmarks/results/dense_ann.json as soon as it finishes.
"""

from __future__ import annotations

import json
import time

import numpy as np
from common import RESULTS, LatencyReport, parser, timer, write_json

from funnel_core.embeddings import DenseIndex, SentenceEmbedder
from funnel_core.units import Unit


def synthetic(n: int, d: int, nq: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(2000, d)).astype(np.float32)
    x = np.empty((n, d), dtype=np.float32)
    for s in range(0, n, 100_000):
        e = min(n, s + 100_000)
        x[s:e] = centers[rng.integers(2000, size=e - s)] + 0.6 * rng.normal(size=(e - s, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = x[rng.integers(n, size=nq)] + 0.3 * rng.normal(size=(nq, d)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return x, q


def run_size(n: int, d: int, nq: int, m: int, ef_search: list[int]) -> dict:
    x, q = synthetic(n, d, nq, seed=n)
    units = [Unit(id=str(i), text="") for i in range(n)]
    emb = SentenceEmbedder(cache=False)  # never loaded: embeddings and query embeddings are given
    exact = DenseIndex(emb, index="exact").index(units, embeddings=x)
    with timer() as tb:
        hnsw = DenseIndex(emb, index="hnsw", hnsw_m=m).index(units, embeddings=x)
    print(f"[{n}] HNSW built in {tb['seconds']:.1f} s")
    out: dict = {"n_vectors": n, "dimension": d, "n_queries": nq, "hnsw_m": m,
                 "ef_construction": hnsw.ef_construction, "hnsw_build_seconds": tb["seconds"],
                 "vectors": "synthetic (Gaussian clusters, L2-normalised)", "exact": {}, "hnsw": {}}
    truth = {}
    for k in (10, 100):
        rep = LatencyReport(f"exact k={k}")
        res = []
        for i in range(nq):
            with rep.time():
                res.append(exact.search_many(["q"], k=k, query_embeddings=q[i:i + 1])[0])
        truth[k] = [{u.id for u in r} for r in res]
        out["exact"][str(k)] = rep.summary()
    for ef in ef_search:
        hnsw.ef_search = ef
        row = {}
        for k in (10, 100):
            rep = LatencyReport(f"hnsw ef_search={ef} k={k}")
            rec = []
            for i in range(nq):
                with rep.time():
                    r = hnsw.search_many(["q"], k=k, query_embeddings=q[i:i + 1])[0]
                rec.append(len({u.id for u in r} & truth[k][i]) / k)
            row[str(k)] = {f"recall@{k}": float(np.mean(rec)), "latency": rep.summary()}
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
    args = p.parse_args()
    out_path = args.out or RESULTS / "dense_ann.json"
    result = json.loads(out_path.read_text()) if out_path.is_file() else {}
    sizes = {k: v for k, v in result.get("sizes", {}).items()}
    for n in (args.sizes if not args.quick else [20_000]):
        t0 = time.perf_counter()
        sizes[str(n)] = run_size(n, args.dim, args.queries, args.m, args.ef_search)
        sizes[str(n)]["total_seconds"] = time.perf_counter() - t0
        write_json("dense_ann", {"args": {k: str(v) for k, v in vars(args).items()}, "sizes": sizes}, out_path)


if __name__ == "__main__":
    main()
