"""BM25 at the funnel's first stage, into benchmarks/results/bm25.json: clustered recall, speed against the framework
baselines and against raw bm25s (docs/clustering.md, docs/performance.md), clustering time at scale; flat BM25
quality on SciFact runs through the evaluation harness (last line).

    python benchmarks/bench_bm25.py --data ../shared/data            # full run
    python benchmarks/bench_bm25.py --data ../shared/data --quick    # smoke run
    python benchmarks/bench_bm25.py --parts raw --rounds 5           # ours vs raw bm25s only
    funnel eval benchmarks/configs/scifact_fusion.toml --out benchmarks/results/scifact_fusion
"""

from __future__ import annotations

import gc
import json
import tempfile
import tracemalloc
from functools import partial

import numpy as np
from common import RESULTS, parser, qps, synthetic_corpus, synthetic_search, timer, vocabulary, write_json

from funnel_core.bm25 import BM25Index
from funnel_core.evaluation import load_beir
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
from funnel_core.funnelrag.clustering import bm25_knn_adjacency, cluster_documents
from funnel_core.text import count_tokens
from funnel_core.units import Unit

PARTS = ("clustered", "speed", "raw", "clustering")
#: the time ratios a / b of the raw part (< 1: a is faster), named a_vs_b, or a_vs_<the third name>
RATIOS = [("ours", "raw_bm25s"), ("ours_numba", "raw_bm25s_numba"), ("ours_batched", "raw_bm25s_batched"),
          ("ours_numba_batched", "ours_batched"), ("ours_batched", "ours", "ours_single"),
          ("ours_numba", "ours", "ours_numpy"), ("ours_numba_batched", "ours_numba", "ours_numba_single")]


def with_peak_mib(fn, *args, **kwargs) -> tuple:
    """``fn(*args, **kwargs)`` and the peak Python-heap + numpy allocation (tracemalloc) while it ran, in MiB."""
    tracemalloc.start()
    try:
        return fn(*args, **kwargs), tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def clustered_recall(ds, queries: dict[str, str], ks=(1, 2, 3, 5, 10, 20)) -> dict:
    with timer() as t:
        cidx = ClusteredBM25Index(max_tokens=4096).index(ds.corpus)
    sizes = np.array([c.metadata["n_tokens"] for c in cidx.clusters])
    members = np.array([len(c.metadata["members"]) for c in cidx.clusters])
    flat = dict(zip(queries, BM25Index().index(ds.corpus).search_many(list(queries.values()), k=1000)))
    recall = lambda q, docs: len(set(ds.qrels[q]) & {d.id for d in docs}) / len(ds.qrels[q])
    rows = []
    for k in ks:
        docs = {q: cidx.search(text, k=k) for q, text in queries.items()}  # flat: as many top documents
        rec_c, rec_f = (float(np.mean([recall(q, run[q][:len(docs[q])]) for q in queries])) for run in (docs, flat))
        rows.append({"k_clusters": k, "mean_documents": float(np.mean([len(d) for d in docs.values()])),
                     "recall_clustered": rec_c, "recall_flat_same_docs": rec_f, "ratio": rec_c / max(rec_f, 1e-9)})
    return {"n_documents": len(ds.corpus), "n_clusters": len(cidx.clusters),
            "compression": len(ds.corpus) / len(cidx.clusters), "build_seconds": t["seconds"],
            "tokens_per_cluster": {"mean": float(sizes.mean()), "median": float(np.median(sizes)),
                                   "max": int(sizes.max()), "min": int(sizes.min())},
            "documents_per_cluster": {"mean": float(members.mean()), "max": int(members.max()),
                                      "singletons": int((members == 1).sum())},
            "recall_at_k_clusters": rows}


def build(name: str, texts: list[str]):
    """A ``search(q, k)`` over ``texts`` by ``name``'s BM25 (the LangChain and LlamaIndex retrievers return 10)."""
    if name == "ours":
        return BM25Index.from_texts(texts).search
    if name == "langchain_community":
        from langchain_community.retrievers import BM25Retriever
        return lambda q, k, r=BM25Retriever.from_texts(texts, k=10): r.invoke(q)
    from llama_index.core.schema import TextNode
    from llama_index.retrievers.bm25 import BM25Retriever
    nodes = [TextNode(text=t, id_=str(i)) for i, t in enumerate(texts)]
    return lambda q, k, r=BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=10): r.retrieve(q)


def speed(texts: list[str], queries: list[str], n_slow: int) -> dict:
    """Build seconds, peak memory and queries/s of each system (LangChain's on ``n_slow`` queries only)."""
    systems: dict = {}
    for name in ("ours", "llama_index_bm25", "langchain_community"):  # raw bm25s: the vs_raw part
        gc.collect()
        _, peak = with_peak_mib(build, name, texts)
        gc.collect()
        with timer() as tb:
            search = build(name, texts)
        qs = queries if name != "langchain_community" else queries[:n_slow]
        search(qs[0], k=10)  # warm-up
        systems[name] = {"build_seconds": tb["seconds"], "qps": qps(partial(search, k=10), qs),
                         "queries_timed": len(qs), "peak_build_mib": peak}
    systems["ours_batched"] = {"qps": qps(partial(BM25Index.from_texts(texts).search_many, k=10), queries,
                                          batch=len(queries)), "queries_timed": len(queries)}
    ratio = lambda key: {k: systems["ours"][key] / v[key] for k, v in systems.items() if key in v and k != "ours"}
    return {"n_documents": len(texts), "systems": systems, "qps_ratio_ours_vs": ratio("qps"),
            "build_ratio_ours_vs": ratio("build_seconds")}


def raw_bm25s(retriever, backend: str):
    """``search_many(queries, k)`` of raw bm25s on a built bm25s ``retriever``: ``bm25s.tokenize`` with our
    default settings (stopwords "en", English Snowball) + ``BM25.retrieve``."""
    import bm25s
    import Stemmer

    tokenize = partial(bm25s.tokenize, stopwords="en", stemmer=Stemmer.Stemmer("english"), return_ids=False,
                       show_progress=False)
    return lambda qs, k: retriever.retrieve(tokenize(qs), k=k, show_progress=False, backend_selection=backend)


def vs_raw(texts: list[str], queries: list[str], rounds: int, ks=(10, 100)) -> dict:
    """Ours against raw bm25s on the SAME built index (only the query path differs), numpy and numba, single queries
    and batches, each round every system over all queries in a rotated order; medians over rounds, p50/p95."""
    from common import LatencyReport

    with timer() as tb:
        ours = BM25Index.from_texts(texts, engine="numpy")
    with tempfile.TemporaryDirectory() as tmp:
        ours.save(tmp)
        ours_nb = BM25Index.load(tmp, engine="numba", verify=False)
    raw, raw_nb = raw_bm25s(ours._retriever, "numpy"), raw_bm25s(ours_nb._retriever, "numba")
    with timer() as tc:  # first numba calls: our kernels load from numba's disk cache (compiled once per install)
        for first_call, qs in ((ours_nb.search, queries[0]), (ours_nb.search_many, queries[:2]), (raw_nb, queries[:2])):
            first_call(qs, k=10)
    single = {"raw_bm25s": lambda q, k: raw([q], k), "ours": ours.search,
              "raw_bm25s_numba": lambda q, k: raw_nb([q], k), "ours_numba": ours_nb.search}
    batched = {"raw_bm25s_batched": raw, "ours_batched": ours.search_many,
               "ours_batched_2threads": partial(ours.search_many, n_threads=2),
               "raw_bm25s_numba_batched": raw_nb, "ours_numba_batched": ours_nb.search_many,
               "ours_numba_batched_2threads": partial(ours_nb.search_many, n_threads=2)}
    names = list(single) + list(batched)
    for k in ks:  # warm every path (numba threading layer, caches) before timing
        for n, f in {**single, **batched}.items():
            f(queries[0] if n in single else queries[:4], k=k)
    out: dict = {"n_documents": len(texts), "n_queries": len(queries), "rounds": rounds,
                 "index_seconds": tb["seconds"], "numba_compile_seconds": tc["seconds"], "k": {}}
    for k in ks:
        reps = {n: LatencyReport(f"{n} k={k}") for n in names}
        for r in range(rounds):
            for n in names[r % len(names):] + names[:r % len(names)]:
                if n in single:  # each query timed, for the percentiles
                    for q in queries:
                        with reps[n].time():
                            single[n](q, k=k)
                else:  # the batch's mean per query, once per query
                    with reps[n].time():
                        batched[n](queries, k=k)
                    reps[n].seconds[-1:] = [reps[n].seconds[-1] / len(queries)] * len(queries)
        means = {n: np.reshape(reps[n].seconds, (rounds, -1)).mean(axis=1) for n in names}  # per round
        med = {n: float(np.median(m)) for n, m in means.items()}
        rows = {n: {"median_ms_per_query": 1e3 * med[n], "round_ms_per_query": [1e3 * x for x in means[n]],
                    "qps": 1.0 / med[n], "latency": reps[n].summary()} for n in names}
        ratios = {f"{a}_vs_{alias[0] if alias else b}": med[a] / med[b] for a, b, *alias in RATIOS}
        out["k"][str(k)] = {"systems": rows, "time_ratios": ratios}
        print(f"[raw] k={k} time ratios: " + ", ".join(f"{n} {v:.3f}" for n, v in ratios.items()))
    return out


def clustering_scale(vocab: list[str], quick: bool) -> list[dict]:
    rows = []
    for n in [2_000, 10_000] if quick else [10_000, 100_000]:
        texts = synthetic_corpus(n, vocab, seed=n)
        with timer() as ti:
            index = BM25Index().index([Unit(id=str(i), text=t) for i, t in enumerate(texts)])
        with timer() as tk:
            adj = bm25_knn_adjacency(index)
        res, peak = with_peak_mib(cluster_documents, adj, [count_tokens(t) for t in texts], max_tokens=4096)
        rows.append({"n_documents": n, "bm25_index_seconds": ti["seconds"], "knn_graph_seconds": tk["seconds"],
                     "algorithm1_seconds": res.seconds, "total_seconds": ti["seconds"] + tk["seconds"] + res.seconds,
                     "n_clusters": len(res.members), "edges": int(adj.nnz // 2),
                     "mean_tokens_per_cluster": float(np.mean(res.sizes)), "algorithm1_peak_mib": peak})
    return rows


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds of the 'raw' part")
    p.add_argument("--parts", nargs="*", choices=PARTS, default=list(PARTS),
                   help="run only these parts; results of the others are kept from the existing JSON")
    args = p.parse_args()
    ds = load_beir(args.data / "scifact", "test")
    out_path = args.out or RESULTS / "bm25.json"
    result = {k: v for k, v in json.loads(out_path.read_text()).items() if k not in ("benchmark", "machine")} \
        if out_path.is_file() and set(args.parts) != set(PARTS) else {}
    texts, n_big = [u.text for u in ds.corpus], 20_000 if args.quick else 100_000
    parts = {"clustered": lambda: {"clustered": clustered_recall(ds, ds.split_queries())},
             "speed": lambda: {"speed_scifact": speed(texts, list(ds.queries.values())[:300], n_slow=100),
                               "speed_synthetic": speed(*synthetic_search(texts, n_big, 200), n_slow=20)},
             "raw": lambda: {"vs_raw_bm25s": vs_raw(*synthetic_search(texts, n_big, 200), rounds=args.rounds)},
             "clustering": lambda: {"clustering_scale": clustering_scale(vocabulary(texts), args.quick)}}
    for part in args.parts:
        result.update(parts[part]())
    result["notes"] = ("Single process on a 2-core machine; see load_average_at_start for how busy it was. "
                       "Ratios are measured back to back in one run. Peak memory is tracemalloc's peak of "
                       "Python+numpy allocations while building each index.")
    write_json("bm25", result, out_path)


if __name__ == "__main__":
    main()
