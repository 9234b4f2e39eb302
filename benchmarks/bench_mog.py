"""Mix-of-Granularity on SQuAD v1.1 (half dev set): fixed levels vs MoG vs MoGG vs AutoMerging.

The 24 articles are split deterministically into two halves (even positions -> train, odd ->
test). Each article is one document (its paragraphs joined). The router is trained on the
questions of the train half, with soft labels from the gold answers (hit rate of the shortest
gold answer in each level's best BM25 snippet); everything is evaluated on the questions of the
test half, over a corpus built from the test articles only.

Reported for every method: answer recall@1 (a gold answer string in the first returned unit)
and @3, and the words returned (whitespace tokens) at 1 and 3:

* ``level_j``: BM25 over the level-``j`` chunks alone (j = 1..n_gra);
* ``mog``: MoG with the trained router; ``mog_uniform``: MoG with uniform weights;
* ``mogg``: MoGG (graph of 2-sentence nodes, hop ranges 1..n_gra) with its own trained router;
  ``mogg_hop_j``: BM25 over the ``j``-hop snippets alone;
* ``auto_merging``: LlamaIndex ``AutoMergingRetriever`` over the same hierarchy (docstore holds
  every level), its base retriever a BM25 retriever over the leaves (top ``--am-leaves``).

Also: router training time on CPU, label and chosen-level distributions, and the MoGG graph
build time at 100k nodes (the SQuAD nodes replicated; replicated text, not new text).

    python benchmarks/bench_mog.py --data /work/shared/data [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tqdm import tqdm  # noqa: E402

from funnel_core.bm25 import BM25Index  # noqa: E402
from funnel_core.embeddings import SentenceEmbedder  # noqa: E402
from funnel_core.evaluation import has_answer, load_squad  # noqa: E402
from funnel_core.granularity import (  # noqa: E402
    GranularityBM25,
    GranularityRouter,
    GraphGranularityBuilder,
    MixOfGranularityRetrieve,
    MultiGranularityChunker,
    level_similarities,
    soft_labels,
)
from funnel_core.hardware import describe  # noqa: E402
from funnel_core.text import count_tokens  # noqa: E402


def default_data() -> str:
    return os.environ.get("FUNNEL_DATA", str(ROOT.parent / "shared" / "data"))


class Scorer:
    """Accumulates AR@1/AR@3 and words returned for one method."""

    def __init__(self) -> None:
        self.ar1, self.ar3, self.w1, self.w3, self.n_out = [], [], [], [], []

    def add(self, texts: list[str], answers: list[str]) -> None:
        self.ar1.append(float(bool(texts) and has_answer(texts[0], answers)))
        self.ar3.append(float(has_answer(" ".join(texts[:3]), answers)))
        self.w1.append(count_tokens(texts[0]) if texts else 0)
        self.w3.append(sum(count_tokens(t) for t in texts[:3]))
        self.n_out.append(len(texts))

    def result(self) -> dict:
        return {"AR@1": float(np.mean(self.ar1)), "AR@3": float(np.mean(self.ar3)),
                "words@1": float(np.mean(self.w1)), "words@3": float(np.mean(self.w3)),
                "n_queries": len(self.ar1)}


def train_router(name, structure, questions, embedder, args, cache):
    """Soft labels on the train half, then BCE training; returns router and a report."""
    index = GranularityBM25(structure)
    qs = [q.question for q in questions]
    refs = [min(q.answers, key=len) for q in questions]
    t0 = time.perf_counter()
    sims = level_similarities(qs, refs, index, similarity=args.similarity, embedder=embedder)
    labels = soft_labels(sims)
    label_seconds = time.perf_counter() - t0
    keep = labels.sum(1) > 0
    router = GranularityRouter(structure.n_gra, embedder=embedder, embedding_cache=cache)
    t1 = time.perf_counter()
    hist = router.fit([q for q, k in zip(qs, keep) if k], labels[keep], val_fraction=0.2,
                      lr=1e-3, patience=args.patience, seed=0)
    fit_seconds = time.perf_counter() - t1
    best = Counter(int(i) + 1 for i in labels[keep].argmax(1))
    report = {
        "n_train_questions": len(qs), "n_labelled": int(keep.sum()),
        "n_dropped_no_level_matches": int((~keep).sum()),
        "label_seconds": label_seconds, "fit_seconds_total": fit_seconds,
        "embed_seconds": hist["embed_seconds"], "mlp_train_seconds": hist["train_seconds"],
        "epochs_run": hist["epochs_run"], "best_epoch": hist["best_epoch"],
        "best_val_bce": hist["best_val_loss"],
        "best_level_label_distribution": {str(k): best.get(k, 0) for k in range(1, structure.n_gra + 1)},
    }
    print(f"[{name}] router: {report}", flush=True)
    return router, report


class LeafBM25Retriever:
    """Factory for a small LlamaIndex BM25 retriever over leaf nodes (AutoMerging's base)."""

    @staticmethod
    def make(leaves, k):
        from llama_index_funnel._base import UnitRetriever, nodes_to_units

        class _Leaf(UnitRetriever):
            def __init__(self) -> None:
                self.index = BM25Index().index(nodes_to_units(leaves))
                self._leaves = leaves
                super().__init__()

            def _search(self, query):
                return self.index.search(query, k=k)

            def _originals(self):
                return self._leaves

        return _Leaf()


def graph_scale(nodes, n_target, args, max_df=None) -> dict:
    """Edge-building time at ``n_target`` nodes by replicating ``nodes``."""
    from funnel_core.units import Unit

    reps = int(np.ceil(n_target / len(nodes)))
    big = [Unit(id=f"r{r}/n{i}", text=u.text, metadata={"doc_index": r, "position": i})
           for r in range(reps) for i, u in enumerate(nodes)][:n_target]
    builder = GraphGranularityBuilder(k_graph=args.k_graph, t_graph=args.t_graph, n_gra=args.n_gra,
                                      max_df=max_df)
    t0 = time.perf_counter()
    g = builder.build_from_nodes(big)
    total = time.perf_counter() - t0
    t1 = time.perf_counter()
    reach = g.reach(args.n_gra)
    hop_seconds = time.perf_counter() - t1
    out = {"n_nodes": len(big), "max_df": max_df, "exact": max_df is None,
           "text": f"SQuAD 2-sentence nodes replicated x{reps} (replicated text)",
           "edge_build_seconds": g.build_seconds, "build_from_nodes_seconds": total,
           "n_edges": g.n_edges, f"reach_{args.n_gra}_hops_seconds": hop_seconds,
           f"mean_nodes_within_{args.n_gra}_hops": float(reach.nnz / len(big))}
    print(out, flush=True)
    return out


def max_df_edge_recall(nodes, args, max_df) -> dict:
    """How many exact kNN edges the ``max_df`` approximation keeps (real, unreplicated nodes)."""
    from funnel_core.granularity.graph import bm25_knn_graph

    index = BM25Index().index(nodes)
    t0 = time.perf_counter()
    exact = bm25_knn_graph(index, args.k_graph, args.t_graph)
    t1 = time.perf_counter()
    approx = bm25_knn_graph(index, args.k_graph, args.t_graph, max_df=max_df)
    t2 = time.perf_counter()
    a, b = set(zip(*exact.nonzero())), set(zip(*approx.nonzero()))
    return {"n_nodes": len(nodes), "max_df": max_df, "exact_seconds": t1 - t0,
            "approx_seconds": t2 - t1, "edge_recall": len(a & b) / max(1, len(a)),
            "edge_precision": len(a & b) / max(1, len(b))}


def run_graph_scale(nodes, args) -> dict:
    return {
        "note": "exact = every BM25 pair score; max_df = terms in more than that fraction of nodes "
                "left out of pair scores (approximate). Replicated text makes each term's df "
                "replicas times larger, so these runs are harder than 100k distinct nodes.",
        "runs": [graph_scale(nodes, n, args, md) for n, md in args.graph_runs],
        "max_df_quality": max_df_edge_recall(nodes, args, args.graph_max_df),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=default_data())
    ap.add_argument("--quick", action="store_true", help="300 questions per half, 20k-node graph")
    ap.add_argument("--chunk-size", type=int, default=32, help="finest chunk size in words")
    ap.add_argument("--n-gra", type=int, default=5)
    ap.add_argument("--k-r", type=int, default=10)
    ap.add_argument("--k-graph", type=int, default=3)
    ap.add_argument("--t-graph", type=float, default=0.3)
    ap.add_argument("--am-leaves", type=int, default=6, help="leaves AutoMerging's base retrieves")
    ap.add_argument("--similarity", default="hit", choices=["hit", "cosine", "tfidf"])
    ap.add_argument("--patience", type=int, default=10)
    ap.add_argument("--graph-nodes", type=int, default=100_000)
    ap.add_argument("--graph-exact-nodes", type=int, default=20_000,
                    help="largest replicated graph built exactly (the exact build is ~quadratic here)")
    ap.add_argument("--graph-max-df", type=float, default=0.01)
    ap.add_argument("--only-graph-scale", action="store_true",
                    help="only (re)run the MoGG graph scale part and merge it into --out")
    ap.add_argument("--torch-threads", type=int, default=1,
                    help="torch CPU threads (1 suits a tiny MLP on a shared machine)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "mog.json"))
    args = ap.parse_args()

    t_start = time.perf_counter()
    articles = load_squad(Path(args.data) / "squad" / "squad-v1.1-dev-a.json")
    train_arts, test_arts = articles[0::2], articles[1::2]
    docs = lambda arts: ["\n\n".join(a.paragraphs) for a in arts]  # noqa: E731
    train_q = [q for a in train_arts for q in a.questions]
    test_q = [q for a in test_arts for q in a.questions]
    if args.quick:
        rng = np.random.default_rng(0)
        train_q = [train_q[i] for i in sorted(rng.choice(len(train_q), 300, replace=False))]
        test_q = [test_q[i] for i in sorted(rng.choice(len(test_q), 300, replace=False))]
        args.graph_nodes = min(args.graph_nodes, 20_000)
        args.graph_exact_nodes = min(args.graph_exact_nodes, 5_000)
    args.graph_runs = [(args.graph_exact_nodes, None), (args.graph_nodes, args.graph_max_df)]
    print(f"train: {len(train_arts)} articles / {len(train_q)} questions; "
          f"test: {len(test_arts)} articles / {len(test_q)} questions", flush=True)

    if args.only_graph_scale:
        builder = GraphGranularityBuilder(k_graph=args.k_graph, t_graph=args.t_graph, n_gra=args.n_gra)
        nodes = builder.nodes(docs(test_arts)) + builder.nodes(docs(train_arts))
        nodes = [u.copy() for u in nodes]
        for i, u in enumerate(nodes):
            u.id = f"n{i}"
        result = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
        result["mogg_graph_scale"] = run_graph_scale(nodes, args)
        Path(args.out).write_text(json.dumps(result, indent=2))
        print(json.dumps(result["mogg_graph_scale"], indent=1))
        return

    import torch

    torch.set_num_threads(args.torch_threads)
    embedder = SentenceEmbedder(batch_size=64)
    chunker = MultiGranularityChunker(chunk_size=args.chunk_size, n_gra=args.n_gra)
    graph_builder = GraphGranularityBuilder(k_graph=args.k_graph, t_graph=args.t_graph,
                                            n_gra=args.n_gra)

    # -- structures ----------------------------------------------------------------------
    train_h, test_h = chunker.split(docs(train_arts)), chunker.split(docs(test_arts))
    train_g, test_g = graph_builder.build(docs(train_arts)), graph_builder.build(docs(test_arts))
    structure_info = {
        "hierarchy_units_per_level_test": [len(lv) for lv in test_h.levels],
        "hierarchy_mean_words_per_level_test": [float(np.mean([count_tokens(u.text) for u in lv]))
                                                for lv in test_h.levels],
        "graph_nodes_test": len(test_g.nodes), "graph_edges_test": test_g.n_edges,
        "graph_build_seconds_test": test_g.build_seconds,
        "graph_mean_words_per_hop_test": [float(np.mean([count_tokens(u.text) for u in lv]))
                                          for lv in test_g.levels],
    }
    print(structure_info, flush=True)

    # -- routers (train half) ------------------------------------------------------------
    cache: dict = {}  # query embeddings, shared by both routers within this run
    mog_router, mog_train = train_router("MoG", train_h, train_q, embedder, args, cache)
    mogg_router, mogg_train = train_router("MoGG", train_g, train_q, embedder, args, cache)

    # -- evaluation (test half) ----------------------------------------------------------
    test_idx_h, test_idx_g = GranularityBM25(test_h), GranularityBM25(test_g)
    mog = MixOfGranularityRetrieve(test_idx_h, mog_router, k_r=args.k_r)
    mog_uniform = MixOfGranularityRetrieve(test_idx_h, None, k_r=args.k_r)
    mogg = MixOfGranularityRetrieve(test_idx_g, mogg_router, k_r=args.k_r)
    qs = [q.question for q in test_q]
    t0 = time.perf_counter()
    w_mog = mog_router.predict(qs)
    w_mogg = mogg_router.predict(qs)
    route_seconds = time.perf_counter() - t0

    from llama_index.core import StorageContext
    from llama_index.core.node_parser import get_leaf_nodes
    from llama_index.core.retrievers import AutoMergingRetriever
    from llama_index.core.schema import Document

    from llama_index_funnel.granularity import MultiGranularityNodeParser

    li_nodes = MultiGranularityNodeParser(chunk_size=args.chunk_size, n_gra=args.n_gra) \
        .get_nodes_from_documents([Document(text=t, id_=f"doc{i}")
                                   for i, t in enumerate(docs(test_arts))])
    storage = StorageContext.from_defaults()
    storage.docstore.add_documents(li_nodes)
    leaves = get_leaf_nodes(li_nodes)
    auto_merging = AutoMergingRetriever(LeafBM25Retriever.make(leaves, args.am_leaves), storage)
    assert len(leaves) == len(test_h.levels[0]), "LlamaIndex parser and core chunker disagree"

    scorers: dict[str, Scorer] = {}
    sc = lambda name: scorers.setdefault(name, Scorer())  # noqa: E731
    chosen = {"mog": Counter(), "mogg": Counter()}
    am_all = {"AR": [], "words": [], "n_nodes": []}
    timings = Counter()
    for qi, q in enumerate(tqdm(test_q, desc="evaluating", mininterval=5)):
        for j in range(1, args.n_gra + 1):
            sc(f"level_{j}").add([u.text for u in test_idx_h.search_level(q.question, j, 3)], q.answers)
            sc(f"mogg_hop_{j}").add([u.text for u in test_idx_g.search_level(q.question, j, 3)], q.answers)
        t = time.perf_counter()
        out = mog.retrieve(q.question, k=3, weights=w_mog[qi])
        timings["mog"] += time.perf_counter() - t
        sc("mog").add([u.text for u in out], q.answers)
        if out:
            chosen["mog"][out[0].funnel["chosen_level"]] += 1
        sc("mog_uniform").add([u.text for u in mog_uniform.retrieve(q.question, k=3)], q.answers)
        t = time.perf_counter()
        out = mogg.retrieve(q.question, k=3, weights=w_mogg[qi])
        timings["mogg"] += time.perf_counter() - t
        sc("mogg").add([u.text for u in out], q.answers)
        if out:
            chosen["mogg"][out[0].funnel["chosen_level"]] += 1
        t = time.perf_counter()
        merged = auto_merging.retrieve(q.question)
        timings["auto_merging"] += time.perf_counter() - t
        texts = [n.node.get_content() for n in merged]
        sc("auto_merging").add(texts, q.answers)
        am_all["AR"].append(float(has_answer(" ".join(texts), q.answers)))
        am_all["words"].append(sum(count_tokens(x) for x in texts))
        am_all["n_nodes"].append(len(texts))

    methods = {name: s.result() for name, s in scorers.items()}
    n = len(test_q)
    result = {
        "benchmark": "Mix-of-Granularity on SQuAD v1.1 dev half (24 articles)",
        "command": "python benchmarks/bench_mog.py --data /work/shared/data" + (" --quick" if args.quick else ""),
        "split": "articles[0::2] train router, articles[1::2] evaluate (corpus = test articles only)",
        "config": {k: v for k, v in vars(args).items() if k not in ("data", "out")},
        "n_test_questions": n,
        "structure": structure_info,
        "methods": methods,
        "auto_merging_all_returned": {"AR(all nodes)": float(np.mean(am_all["AR"])),
                                      "words(all nodes)": float(np.mean(am_all["words"])),
                                      "mean_nodes_returned": float(np.mean(am_all["n_nodes"]))},
        "router_training": {"mog": mog_train, "mogg": mogg_train, "device": "cpu",
                            "routing_seconds_all_test_queries": route_seconds},
        "chosen_level_distribution": {k: {str(j): v.get(j, 0) for j in range(1, args.n_gra + 1)}
                                      for k, v in chosen.items()},
        "retrieve_ms_per_query": {k: 1000 * v / n for k, v in timings.items()},
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, shared with "
                   "other jobs (timings are noisy)",
        "hardware": describe(),  # CPU flags and the precisions the models ran in
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))  # before the long scale run
    print("graph scale run ...", flush=True)
    nodes = [u.copy() for u in test_g.nodes + train_g.nodes]
    for i, u in enumerate(nodes):
        u.id = f"n{i}"
    result["mogg_graph_scale"] = run_graph_scale(nodes, args)
    result["total_seconds"] = time.perf_counter() - t_start
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("methods", "chosen_level_distribution",
                                             "mogg_graph_scale", "auto_merging_all_returned")},
                     indent=1))


if __name__ == "__main__":
    main()
