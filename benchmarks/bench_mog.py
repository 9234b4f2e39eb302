"""Mix-of-Granularity on SQuAD v1.1 dev-a through the evaluation harness: fixed levels (``level_j``) vs
MoG (trained router; ``mog_uniform``: uniform weights) vs MoGG (2-sentence node graph, ``mogg_hop_j``
alone) vs LlamaIndex's AutoMergingRetriever.

Articles at even positions train the routers (one per ``LABEL_VARIANTS`` x ``SELECTION_VARIANTS``,
reported as ``router LABELS / SELECTION``); the odd ones are evaluated. Method and results:
docs/mix_of_granularity.md. ``--graph-scale`` instead times the MoGG graph build at 100k replicated
SQuAD nodes into ``results/mog_graph_scale.json``.

    nice -n 10 python benchmarks/bench_mog.py                 # writes benchmarks/results/mog/report.json.gz
"""

from __future__ import annotations

import json
import time
from collections import Counter

import numpy as np
from common import RESULTS, parser, write_json

from funnel_core.bm25 import BM25Index
from funnel_core.embeddings import SentenceEmbedder
from funnel_core.evaluation import EvalDataset, Report, evaluate, load_squad
from funnel_core.granularity import (
    GranularityBM25,
    GranularityRouter,
    GraphGranularityBuilder,
    MixOfGranularityRetrieve,
    MultiGranularityChunker,
    level_choice_counts,
    level_similarities,
    soft_labels,
)
from funnel_core.units import Unit

LABEL_VARIANTS = {"paper_ties_finer": {"tolerance": 0.0, "ties": "finer"},  # name -> soft_labels settings
                  "tolerance_0.25_finer": {"tolerance": 0.25, "ties": "finer"},
                  "ties_coarser": {"tolerance": 0.0, "ties": "coarser"}}
SELECTION_VARIANTS = {"paper": ("paper", 0.0), "paper_margin_0.2": ("paper", 0.2),  # name -> (preset, margin)
                      "paper_margin_0.5": ("paper", 0.5), "normalised": ("normalised", 0.0)}


def train_router(structure, questions, embedder, args, cache, sims=None, **label_settings):
    """Soft labels on the train half, then BCE training; returns the router, a report and the
    label similarities (reused by the other label variants)."""
    qs = [q.question for q in questions]
    t0 = time.perf_counter()
    sims = sims if sims is not None else level_similarities(
        qs, [min(q.answers, key=len) for q in questions], GranularityBM25(structure), similarity=args.similarity,
        embedder=embedder)
    labels = soft_labels(sims, **label_settings)
    label_seconds = time.perf_counter() - t0
    keep = labels.sum(1) > 0
    router = GranularityRouter(structure.n_gra, embedder=embedder, embedding_cache=cache)
    hist = router.fit([q for q, k in zip(qs, keep) if k], labels[keep], val_fraction=0.2, lr=1e-3,
                      patience=args.patience, seed=0)
    best = Counter(int(i) + 1 for i in labels[keep].argmax(1))
    return router, sims, {"n_train_questions": len(qs), "n_labelled": int(keep.sum()), "label_seconds": label_seconds,
                          "embed_seconds": hist["embed_seconds"], "mlp_train_seconds": hist["train_seconds"],
                          **{k: hist[k] for k in ("epochs_run", "best_epoch")}, "best_level_label_distribution":
                          {str(k): best.get(k, 0) for k in range(1, structure.n_gra + 1)}}


def auto_merging(docs: list[str], args):
    """LlamaIndex's AutoMergingRetriever over the MoG hierarchy; its base our BM25 retriever over the leaves."""
    from llama_index.core import StorageContext
    from llama_index.core.node_parser import get_leaf_nodes
    from llama_index.core.retrievers import AutoMergingRetriever
    from llama_index.core.schema import Document

    from llama_index_funnel.granularity import MultiGranularityNodeParser
    from llama_index_funnel.retrievers import BM25Retriever

    nodes = MultiGranularityNodeParser(chunk_size=args.chunk_size, n_gra=args.n_gra).get_nodes_from_documents(
        [Document(text=t, id_=f"doc{i}") for i, t in enumerate(docs)])
    storage = StorageContext.from_defaults()
    storage.docstore.add_documents(nodes)
    leaves = get_leaf_nodes(nodes)
    return AutoMergingRetriever(BM25Retriever.from_defaults(nodes=leaves, similarity_top_k=args.am_leaves),
                                storage), len(leaves)


def graph_scale(nodes: list[Unit], args) -> dict:
    """MoGG edge-building time on replicated SQuAD nodes (exact at ``--graph-exact-nodes``,
    ``max_df`` at ``--graph-nodes``), and how many exact edges ``max_df`` keeps on the real nodes."""
    from funnel_core.granularity.graph import bm25_knn_graph

    runs = []
    for n_target, max_df in ((args.graph_exact_nodes, None), (args.graph_nodes, args.graph_max_df)):
        reps = int(np.ceil(n_target / len(nodes)))
        big = [Unit(id=f"r{r}/n{i}", text=u.text, metadata={"doc_index": r, "position": i})
               for r in range(reps) for i, u in enumerate(nodes)][:n_target]
        g = GraphGranularityBuilder(k_graph=args.k_graph, t_graph=args.t_graph, n_gra=args.n_gra,
                                    max_df=max_df).build_from_nodes(big)
        runs.append({"n_nodes": len(big), "max_df": max_df, "replicas": reps, "edge_build_seconds": g.build_seconds,
                     "n_edges": g.n_edges})
        print(runs[-1], flush=True)
    index = BM25Index().index(nodes)
    exact, approx = (set(zip(*bm25_knn_graph(index, args.k_graph, args.t_graph, max_df=m).nonzero()))
                     for m in (None, args.graph_max_df))
    return {"note": "exact = every BM25 pair score; max_df = terms in more than that fraction of nodes left out "
                    "of pair scores (approximate); replicated text makes each term's df replicas times larger.",
            "runs": runs, "max_df_quality": {"n_nodes": len(nodes), "max_df": args.graph_max_df,
                                             "edge_recall": len(exact & approx) / max(1, len(exact)),
                                             "edge_precision": len(exact & approx) / max(1, len(approx))}}


def main() -> None:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--chunk-size", type=int, default=32, help="finest chunk size in words")
    ap.add_argument("--n-gra", type=int, default=5)
    ap.add_argument("--k-r", type=int, default=10)
    ap.add_argument("--k-graph", type=int, default=3)
    ap.add_argument("--t-graph", type=float, default=0.3)
    ap.add_argument("--am-leaves", type=int, default=6, help="leaves AutoMerging's base retrieves")
    ap.add_argument("--similarity", default="hit", choices=["hit", "cosine", "tfidf"])
    ap.add_argument("--patience", type=int, default=10)
    ap.add_argument("--torch-threads", type=int, default=1, help="torch CPU threads (a tiny MLP)")
    ap.add_argument("--graph-scale", action="store_true", help="only time the MoGG graph build at scale")
    ap.add_argument("--graph-nodes", type=int, default=100_000)
    ap.add_argument("--graph-exact-nodes", type=int, default=20_000)
    ap.add_argument("--graph-max-df", type=float, default=0.01)
    args = ap.parse_args()

    articles = load_squad(args.data / "squad" / "squad-v1.1-dev-a.json")
    train_arts, test_arts = articles[0::2], articles[1::2]
    docs = lambda arts: ["\n\n".join(a.paragraphs) for a in arts]
    graph_builder = GraphGranularityBuilder(k_graph=args.k_graph, t_graph=args.t_graph, n_gra=args.n_gra)
    if args.graph_scale:
        nodes = [Unit(id=f"n{i}", text=u.text) for i, u in
                 enumerate(graph_builder.nodes(docs(test_arts)) + graph_builder.nodes(docs(train_arts)))]
        write_json("mog_graph_scale", {"command": "python benchmarks/bench_mog.py --graph-scale",
                                       **graph_scale(nodes, args)}, args.out)
        return

    import torch
    torch.set_num_threads(args.torch_threads)
    train_q = [q for a in train_arts for q in a.questions]
    test = EvalDataset(queries={q.id: q.question for a in test_arts for q in a.questions},
                       answers={q.id: list(q.answers) for a in test_arts for q in a.questions},
                       name="squad-v1.1-dev-a, odd articles", format="squad")
    if args.quick:
        train_q, test = [train_q[i] for i in sorted(np.random.default_rng(0).choice(len(train_q), 300, replace=False))], test.subset(300)
    embedder = SentenceEmbedder(batch_size=64)
    chunker = MultiGranularityChunker(chunk_size=args.chunk_size, n_gra=args.n_gra)
    cache: dict = {}  # query embeddings, shared by both routers
    train_h = chunker.split(docs(train_arts))
    routers, training, sims = {}, {}, None
    for label, settings in LABEL_VARIANTS.items():  # the first, paper_ties_finer (soft_labels' defaults), is MoG's
        routers[label], sims, training[label] = train_router(train_h, train_q, embedder, args, cache, sims, **settings)
    mog_router = routers["paper_ties_finer"]
    mogg_router, _, training["mogg"] = train_router(graph_builder.build(docs(train_arts)), train_q, embedder, args, cache)

    test_h, test_g = GranularityBM25(chunker.split(docs(test_arts))), GranularityBM25(graph_builder.build(docs(test_arts)))
    am, n_leaves = auto_merging(docs(test_arts), args)
    assert n_leaves == len(test_h.structure.levels[0]), "LlamaIndex parser and core chunker disagree"
    top3 = lambda mog: (lambda q: mog.retrieve(q, k=3))
    systems = {**{f"level_{j}": (lambda q, j=j: test_h.search_level(q, j, 3)) for j in range(1, args.n_gra + 1)},
               "mog": top3(MixOfGranularityRetrieve(test_h, mog_router, k_r=args.k_r)),
               "mog_uniform": top3(MixOfGranularityRetrieve(test_h, None, k_r=args.k_r)), "auto_merging": am,
               **{f"mogg_hop_{j}": (lambda q, j=j: test_g.search_level(q, j, 3)) for j in range(1, args.n_gra + 1)},
               "mogg": top3(MixOfGranularityRetrieve(test_g, mogg_router, k_r=args.k_r))}
    weights = {label: router.predict(list(test.queries.values())) for label, router in routers.items()}
    for sel, (preset, margin) in SELECTION_VARIANTS.items():
        if not margin:
            systems[f"uniform / {sel}"] = top3(MixOfGranularityRetrieve.from_preset(preset, test_h, None))
        for label, router in routers.items():
            systems[f"router {label} / {sel}"] = top3(MixOfGranularityRetrieve.from_preset(preset, test_h, router,
                                                                                          level_margin=margin))
            training[label].setdefault("chosen_level_counts", {})[sel] = level_choice_counts(weights[label], margin)
    report = evaluate(systems, test, metrics=["AR@1", "AR@3", "words@1", "words@3", "AR@10", "words@10"],
                      baseline="level_1", n_timing=0)
    out = args.out or RESULTS / "mog"
    extra = {"command": "python benchmarks/bench_mog.py" + (" --quick" if args.quick else ""),
             "split": "articles[0::2] train the routers, articles[1::2] evaluate (corpus = test articles only)",
             "config": {k: v for k, v in vars(args).items() if k not in ("data", "out")},
             "router_training": training}
    paths = Report.from_dict({**report.to_dict(), **extra}).save(out, plot=False, compress=True)
    print(report.to_markdown(["AR@1", "AR@3", "words@1", "words@3"]))
    print(json.dumps({k: str(v) for k, v in paths.items()}))


if __name__ == "__main__":
    main()
