"""Clustered BM25 recall, BM25 speed against the framework baselines, and
clustering time at scale — all in one run. (Flat BM25 quality on SciFact runs through the
evaluation harness: ``funnel eval benchmarks/configs/scifact_fusion.toml --out benchmarks/results/scifact_fusion``.)

    python benchmarks/bench_bm25.py --data ../shared/data            # full run
    python benchmarks/bench_bm25.py --data ../shared/data --quick    # smoke run
    python benchmarks/bench_bm25.py --parts raw --rounds 5           # ours vs raw bm25s only

Writes benchmarks/results/bm25.json and bm25.png: SciFact clusters and the recall of relevant documents
in the top-K clusters against flat BM25 at equal documents, queries/s, build seconds and peak memory
against raw bm25s, LangChain community and llama-index-retrievers-bm25 (docs/clustering.md), ours
against raw bm25s on one built index (``vs_raw_bm25s``, docs/performance.md), clustering seconds.
"""

from __future__ import annotations

import gc
import json
import time

import numpy as np
from common import RESULTS, parser, peak_memory, qps, synthetic_corpus, synthetic_search, timer, vocabulary, write_json

from funnel_core.bm25 import BM25Index
from funnel_core.evaluation import load_beir
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
from funnel_core.funnelrag.clustering import bm25_knn_adjacency, cluster_documents
from funnel_core.text import count_tokens
from funnel_core.units import Unit


def clustered_recall(ds, queries: dict[str, str], ks=(1, 2, 3, 5, 10, 20)) -> dict:
    qids = list(queries)
    with timer() as t:
        cidx = ClusteredBM25Index(max_tokens=4096).index(ds.corpus)
    sizes = np.array([c.metadata["n_tokens"] for c in cidx.clusters])
    members = np.array([len(c.metadata["members"]) for c in cidx.clusters])
    flat = BM25Index().index(ds.corpus)
    flat_res = flat.search_many([queries[q] for q in qids], k=1000)
    rows = []
    for k in ks:
        rec_c, rec_f, n_docs = [], [], []
        for q, fr in zip(qids, flat_res):
            docs = cidx.search(queries[q], k=k)
            rel = set(ds.qrels[q])
            got = {d.id for d in docs}
            rec_c.append(len(rel & got) / len(rel))
            rec_f.append(len(rel & {u.id for u in fr[:len(docs)]}) / len(rel))
            n_docs.append(len(docs))
        rows.append({"k_clusters": k, "mean_documents": float(np.mean(n_docs)),
                     "recall_clustered": float(np.mean(rec_c)), "recall_flat_same_docs": float(np.mean(rec_f)),
                     "ratio": float(np.mean(rec_c) / max(np.mean(rec_f), 1e-9))})
        print(f"[2] top-{k} clusters: {rows[-1]}")
    return {"n_documents": len(ds.corpus), "n_clusters": len(cidx.clusters),
            "compression": len(ds.corpus) / len(cidx.clusters), "build_seconds": t["seconds"],
            "tokens_per_cluster": {"mean": float(sizes.mean()), "median": float(np.median(sizes)),
                                   "max": int(sizes.max()), "min": int(sizes.min())},
            "documents_per_cluster": {"mean": float(members.mean()), "max": int(members.max()),
                                      "singletons": int((members == 1).sum())},
            "recall_at_k_clusters": rows}


class Systems:
    """Build/query adapters for the three BM25 implementations under comparison."""

    @staticmethod
    def ours(texts):
        index = BM25Index.from_texts(texts)
        return lambda q, k: index.search(q, k=k)

    @staticmethod
    def raw_bm25s(texts):
        """bm25s on its own, same tokenizer settings as ours (stopwords "en", English Snowball)."""
        return raw_bm25s_search(texts)

    @staticmethod
    def ours_batched(texts):
        index = BM25Index.from_texts(texts)
        return lambda qs, k: index.search_many(qs, k=k)

    @staticmethod
    def langchain_community(texts):
        from langchain_community.retrievers import BM25Retriever as LCBM25

        r = LCBM25.from_texts(texts, k=10)
        return lambda q, k: r.invoke(q)

    @staticmethod
    def llama_index_bm25(texts):
        from llama_index.core.schema import TextNode
        from llama_index.retrievers.bm25 import BM25Retriever as LIBM25

        nodes = [TextNode(text=t, id_=str(i)) for i, t in enumerate(texts)]
        r = LIBM25.from_defaults(nodes=nodes, similarity_top_k=10)
        return lambda q, k: r.retrieve(q)


def raw_bm25s_search(texts=None, retriever=None, backend: str = "numpy"):
    """Raw bm25s search (``bm25s.tokenize`` with our default settings + ``BM25.retrieve``):
    built over ``texts``, or querying an already built bm25s ``retriever``."""
    import bm25s
    import Stemmer

    stem = Stemmer.Stemmer("english")
    if retriever is None:
        retriever = bm25s.BM25(method="lucene", k1=1.5, b=0.75)
        retriever.index(bm25s.tokenize(texts, stopwords="en", stemmer=stem, show_progress=False),
                        show_progress=False)

    def search(q, k):
        toks = bm25s.tokenize([q], stopwords="en", stemmer=stem, return_ids=False, show_progress=False)
        return retriever.retrieve(toks, k=k, show_progress=False, backend_selection=backend)

    def search_many(qs, k, n_threads=0):
        toks = bm25s.tokenize(qs, stopwords="en", stemmer=stem, return_ids=False, show_progress=False)
        return retriever.retrieve(toks, k=k, show_progress=False, n_threads=n_threads,
                                  backend_selection=backend)

    search.many = search_many  # type: ignore[attr-defined]
    return search


def vs_raw(texts: list[str], queries: list[str], rounds: int, ks=(10, 100)) -> dict:
    """Ours against raw bm25s over the SAME built bm25s index (so only the query path differs),
    numpy and numba backends, single queries and batches, interleaved: each round times every
    system once over all queries, in a rotated order; the figure per system is the median over
    rounds of its mean seconds per query, and p50/p95 come from the per-query timings."""
    import tempfile

    from common import LatencyReport

    with timer() as tb:
        ours_np = BM25Index.from_texts(texts, engine="numpy")
    with tempfile.TemporaryDirectory() as tmp:
        ours_np.save(tmp)
        ours_nb = BM25Index.load(tmp, engine="numba", verify=False)
    raw_np = raw_bm25s_search(retriever=ours_np._retriever)
    raw_nb = raw_bm25s_search(retriever=ours_nb._retriever, backend="numba")
    with timer() as tc:  # first numba calls: our kernels load from numba's disk cache (compiled once per install)
        ours_nb.search(queries[0], k=10)
        ours_nb.search_many(queries[:2], k=10)
        raw_nb.many(queries[:2], 10)
    for f in (lambda q, k: ours_np.search(q, k=k), raw_np):
        f(queries[0], 10)  # warm-up
    single = {"raw_bm25s": raw_np, "ours": lambda q, k: ours_np.search(q, k=k),
              "raw_bm25s_numba": raw_nb, "ours_numba": lambda q, k: ours_nb.search(q, k=k)}
    batched = {"raw_bm25s_batched": lambda qs, k: raw_np.many(qs, k),
               "ours_batched": lambda qs, k: ours_np.search_many(qs, k=k),
               "ours_batched_2threads": lambda qs, k: ours_np.search_many(qs, k=k, n_threads=2),
               "raw_bm25s_numba_batched": lambda qs, k: raw_nb.many(qs, k),
               "ours_numba_batched": lambda qs, k: ours_nb.search_many(qs, k=k),
               "ours_numba_batched_2threads": lambda qs, k: ours_nb.search_many(qs, k=k, n_threads=2)}
    names = list(single) + list(batched)
    for k in ks:  # warm every path (numba threading layer, caches) before timing
        for f in single.values():
            f(queries[0], k)
        for g in batched.values():
            g(queries[:4], k)
    out: dict = {"n_documents": len(texts), "n_queries": len(queries), "rounds": rounds,
                 "index_seconds": tb["seconds"], "numba_compile_seconds": tc["seconds"], "k": {}}
    for k in ks:
        reps = {n: LatencyReport(f"{n} k={k}") for n in names}
        means: dict[str, list[float]] = {n: [] for n in names}
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for n in order:
                if n in single:
                    f = single[n]
                    t_all = 0.0
                    for q in queries:
                        t0 = time.perf_counter()
                        f(q, k)
                        dt = time.perf_counter() - t0
                        reps[n].seconds.append(dt)
                        t_all += dt
                else:
                    t0 = time.perf_counter()
                    batched[n](queries, k)
                    t_all = time.perf_counter() - t0
                    reps[n].add(t_all, len(queries))
                means[n].append(t_all / len(queries))
        rows = {n: {"median_ms_per_query": 1e3 * float(np.median(means[n])),
                    "round_ms_per_query": [1e3 * m for m in means[n]],
                    "qps": 1.0 / float(np.median(means[n])), "latency": reps[n].summary()} for n in names}
        med = {n: rows[n]["median_ms_per_query"] for n in names}
        ratios = {"ours_vs_raw_bm25s": med["ours"] / med["raw_bm25s"],
                  "ours_numba_vs_raw_bm25s_numba": med["ours_numba"] / med["raw_bm25s_numba"],
                  "ours_batched_vs_ours_single": med["ours_batched"] / med["ours"],
                  "ours_batched_vs_raw_bm25s_batched": med["ours_batched"] / med["raw_bm25s_batched"],
                  "ours_numba_vs_ours_numpy": med["ours_numba"] / med["ours"],
                  "ours_numba_batched_vs_ours_batched": med["ours_numba_batched"] / med["ours_batched"],
                  "ours_numba_batched_vs_ours_numba_single": med["ours_numba_batched"] / med["ours_numba"]}
        out["k"][str(k)] = {"systems": rows, "time_ratios": ratios}
        print(f"[3b] k={k}: " + ", ".join(f"{n} {v:.2f} ms" for n, v in med.items()))
        print(f"[3b] k={k} time ratios (<1: first is faster): " + ", ".join(f"{n} {v:.3f}" for n, v in ratios.items()))
    return out


def speed(texts: list[str], queries: list[str], label: str, n_slow: int) -> dict:
    out = {"n_documents": len(texts), "systems": {}}
    for name in ("ours", "raw_bm25s", "llama_index_bm25", "langchain_community"):
        build = getattr(Systems, name)
        gc.collect()
        with peak_memory() as mem:
            build(texts)
        gc.collect()
        with timer() as tb:
            search = build(texts)
        qs = queries if name != "langchain_community" else queries[:n_slow]
        search(qs[0], 10)  # warm-up
        out["systems"][name] = {"build_seconds": tb["seconds"], "qps": qps(lambda q, s=search: s(q, 10), qs),
                                "queries_timed": len(qs), "peak_build_mib": mem["peak_mib"]}
        print(f"[3] {label} {name}: {out['systems'][name]}")
    batched = Systems.ours_batched(texts)
    out["systems"]["ours_batched"] = {"qps": qps(lambda b: batched(b, 10), queries, batch=len(queries)),
                                      "queries_timed": len(queries)}
    ours = out["systems"]["ours"]["qps"]
    out["qps_ratio_ours_vs"] = {k: ours / v["qps"] for k, v in out["systems"].items() if k != "ours"}
    out["build_ratio_ours_vs"] = {k: out["systems"]["ours"]["build_seconds"] / v["build_seconds"]
                                  for k, v in out["systems"].items() if "build_seconds" in v and k != "ours"}
    return out


def clustering_scale(vocab: list[str], sizes: list[int]) -> list[dict]:
    rows = []
    for n in sizes:
        texts = synthetic_corpus(n, vocab, seed=n)
        units = [Unit(id=str(i), text=t) for i, t in enumerate(texts)]
        with timer() as ti:
            index = BM25Index().index(units)
        with timer() as tk:
            adj = bm25_knn_adjacency(index)
        with peak_memory() as mem:
            res = cluster_documents(adj, [count_tokens(t) for t in texts], max_tokens=4096)
        rows.append({"n_documents": n, "bm25_index_seconds": ti["seconds"], "knn_graph_seconds": tk["seconds"],
                     "algorithm1_seconds": res.seconds, "total_seconds": ti["seconds"] + tk["seconds"] + res.seconds,
                     "n_clusters": len(res.members), "edges": int(adj.nnz // 2),
                     "mean_tokens_per_cluster": float(np.mean(res.sizes)), "algorithm1_peak_mib": mem["peak_mib"]})
        print(f"[4] clustering {n}: {rows[-1]}")
    return rows


def plot(result: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    rows = result["clustered"]["recall_at_k_clusters"]
    ax = axes[0]
    ax.plot([r["mean_documents"] for r in rows], [r["recall_clustered"] for r in rows], "o-", label="clustered BM25 (top-K clusters)")
    ax.plot([r["mean_documents"] for r in rows], [r["recall_flat_same_docs"] for r in rows], "s--", label="flat BM25 (same #docs)")
    for r in rows:
        ax.annotate(f"K={r['k_clusters']}", (r["mean_documents"], r["recall_clustered"]), fontsize=8)
    ax.set_xscale("log"); ax.set_xlabel("documents returned"); ax.set_ylabel("recall of relevant docs")
    ax.set_title("SciFact test: clusters vs flat"); ax.legend(fontsize=8)
    for ax, key in zip(axes[1:], ("speed_scifact", "speed_synthetic")):
        sysd = result[key]["systems"]
        names = list(sysd)
        ax.bar(names, [sysd[n]["qps"] for n in names], color=["C0", "C2", "C3", "C1"][:len(names)])
        ax.set_yscale("log"); ax.set_ylabel("queries / s (log)")
        ax.set_title(f"BM25 speed, {result[key]['n_documents']:,} docs")
        ax.tick_params(axis="x", rotation=20, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


PARTS = ("clustered", "speed", "raw", "clustering")


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds of the 'raw' part")
    p.add_argument("--parts", nargs="*", choices=PARTS, default=list(PARTS),
                   help="run only these parts; results of the others are kept from the existing JSON")
    args = p.parse_args()
    ds = load_beir(args.data / "scifact", "test")
    queries = ds.split_queries()
    out_path = args.out or RESULTS / "bm25.json"
    result = {k: v for k, v in json.loads(out_path.read_text()).items() if k not in ("benchmark", "machine")} \
        if out_path.is_file() and set(args.parts) != set(PARTS) else {}
    if "clustered" in args.parts:
        result["clustered"] = clustered_recall(ds, queries)
    texts = [u.text for u in ds.corpus]
    n_big = 20_000 if args.quick else 100_000
    if "speed" in args.parts:
        result["speed_scifact"] = speed(texts, list(ds.queries.values())[:300], "scifact", n_slow=100)
        result["speed_synthetic"] = speed(*synthetic_search(texts, n_big, 200), "synthetic", n_slow=20)
    if "raw" in args.parts:
        result["vs_raw_bm25s"] = vs_raw(*synthetic_search(texts, n_big, 200), rounds=args.rounds)
    if "clustering" in args.parts:
        result["clustering_scale"] = clustering_scale(vocabulary(texts), [2_000, 10_000] if args.quick else [10_000, 100_000])
    result["notes"] = ("Single process on a 2-core machine; see load_average_at_start for how busy it was. "
                       "Ratios are measured back to back in one run. Peak memory is tracemalloc's peak of "
                       "Python+numpy allocations while building each index.")
    path = write_json("bm25", result, out_path)
    if {"clustered", "speed_scifact", "speed_synthetic"} <= set(result):
        plot(result, path.with_suffix(".png"))


if __name__ == "__main__":
    main()
