"""Issue 5 benchmark: flat vs funnel retrieval (the shape of FunnelRAG's Table 2), one run.

    python benchmarks/bench_funnel.py --data ../shared/data
    python benchmarks/bench_funnel.py --data ../shared/data --quick

Both paradigms use the same models and the same passages:

* flat   : dense all-MiniLM-L6-v2 over all passages -> top-400 reranked by the cross-encoder -> top-k
* funnel : clustered BM25 top-K clusters -> cross-encoder pre-ranking of documents -> later
           chunking into passages -> cross-encoder post-ranking of passages -> top-k

SQuAD (answer recall AR@1..4): articles -> ~1K-token documents of consecutive paragraphs ->
~100-word passages; cluster adjacency = neighbouring documents of an article + BM25 kNN.
SciFact (nDCG@10 / recall@100 at document level): abstracts clustered by BM25 kNN; passages =
sentence-aware ~60-word windows; a document scores by its best passage.

The cross-encoder is the MiniLM cross-encoder trained on SciFact train by
``benchmarks/prerank_model.py`` (``--ranker cross-encoder``, default), or the packaged MiniLM
bi-encoder as a reranker (``--ranker embedding``). ``--fid FOLDER`` post-ranks the funnel's passages
with a Fusion-in-Decoder checkpoint's cross-attention instead (the paper's stage 3; flat keeps the
cross-encoder, as in Table 2). A scaling run times the corpus-size-dependent
parts on synthetic corpora (10k, 100k, 1M passages). Writes results/funnel.json and funnel.png.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from common import cached_embeddings, parser, timer, write_json

from funnel_core.bm25 import BM25Index
from funnel_core.embeddings import DenseIndex, DenseRetrieve, SentenceEmbedder
from funnel_core.evaluation import answer_recall, contextual_integrity, ir_metrics, load_beir, load_squad
from funnel_core.funnel import Funnel
from funnel_core.funnelrag.chunking import LaterChunking
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index, ClusteredBM25Retrieve
from funnel_core.funnelrag.clustering import bm25_knn_adjacency
from funnel_core.funnelrag.presets import renamed
from funnel_core.text import count_tokens
from funnel_core.units import Unit

K_EVAL = (1, 2, 3, 4)


def make_ranker(kind: str, data: Path, batch_size: int, window_words: int | None, bf16: bool):
    """One ranker object for every reranking stage of both paradigms (the same model throughout).

    ``window_words`` makes the cross-encoder score a text longer than that many words by its best
    window (MaxP), so ~1K-token SQuAD documents are pre-ranked whole instead of by their first 192
    tokens; passages (<= 100 words) are shorter than a window and score exactly as before.
    """
    if kind == "embedding":
        from funnel_core.rerank.embedding import EmbeddingScorer

        return EmbeddingScorer(SentenceEmbedder(batch_size=batch_size), name="ranker"), "packaged MiniLM bi-encoder"
    from prerank_model import get_or_train

    from funnel_core.rerank.cross_encoder import CrossEncoderScorer

    path = get_or_train(data)
    return CrossEncoderScorer(str(path), library="transformers", batch_size=batch_size, max_length=192,
                              window_words=window_words, dtype="bfloat16" if bf16 else "auto",
                              name="ranker"), str(path)


def post_ranker(args, ranker):
    """The funnel's passage ranker: the FiD checkpoint given by ``--fid``, else the shared ranker."""
    if args.fid is None:
        return renamed(ranker, "post_ranking")
    from funnel_core.rerank.fid import FiDAttentionScorer

    return FiDAttentionScorer(model=str(args.fid), batch_size=args.batch_size, name="post_ranking")


# -- SQuAD ---------------------------------------------------------------------------------------
def squad_units(path: Path, doc_tokens: int = 1000):
    articles = load_squad(path)
    docs: list[Unit] = []
    rows, cols = [], []
    for a in articles:
        current: list[str] = []
        first = len(docs)
        for para in a.paragraphs + [None]:
            if para is None or (current and count_tokens(" ".join(current)) + count_tokens(para) > doc_tokens):
                if current:
                    docs.append(Unit(id=f"{a.title}/{len(docs) - first}", text="\n".join(current), level="document",
                                     metadata={"title": a.title}))
                current = []
            if para is not None:
                current.append(para)
        for i in range(first, len(docs) - 1):  # neighbouring documents of an article are linked
            rows.append(i)
            cols.append(i + 1)
    n = len(docs)
    links = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, n))
    adj = links.maximum(links.T) + bm25_knn_adjacency(BM25Index().index(docs))
    questions = [q for a in articles for q in a.questions]
    return docs, adj.tocsr(), questions


def run_squad(args, ranker, embedder) -> dict:
    docs, adj, questions = squad_units(args.data / "squad" / "squad-v1.1-dev-a.json")
    chunk = LaterChunking(words=100, name="later_chunking")
    passages = chunk.run("", docs)
    with timer() as t_cl:
        cindex = ClusteredBM25Index(max_tokens=4096).index(docs, adjacency=adj)
    with timer() as t_dense:
        dense = DenseIndex(embedder).index(passages, cached_embeddings(embedder, [u.text for u in passages], "squad"))
    rng = random.Random(0)
    sample = rng.sample(questions, min(args.n_squad, len(questions)))
    flat = Funnel([DenseRetrieve(dense, k=args.flat_depth, name="dense"), renamed(ranker, "rerank") % 4])
    funnel = Funnel([ClusteredBM25Retrieve(cindex, k=args.squad_clusters, name="clustered_bm25"),
                     renamed(ranker, "pre_ranking") % args.squad_documents, chunk,
                     post_ranker(args, ranker) % 4])
    out = {"n_documents": len(docs), "n_passages": len(passages), "n_clusters": len(cindex.clusters),
           "tokens_per_cluster": float(np.mean([c.metadata["n_tokens"] for c in cindex.clusters])),
           "clustering_seconds": t_cl["seconds"], "dense_index_seconds": t_dense["seconds"],
           "n_questions": len(sample), "settings": {"flat": f"dense top-{args.flat_depth} -> rerank -> 4",
                                                     "funnel": f"clusters top-{args.squad_clusters} -> pre-rank "
                                                               f"documents % {args.squad_documents} -> 100-word passages -> post-rank % 4"}}
    out.update(evaluate_squad({"flat": flat, "funnel": funnel}, sample))
    return out


def evaluate_squad(paradigms: dict, sample) -> dict:
    res = {}
    for funnel in paradigms.values():  # load every model before timing
        funnel.search(sample[0].question)
    for name, funnel in paradigms.items():
        ar = {k: [] for k in K_EVAL}
        ci = []
        stage_secs = defaultdict(float)
        stage_units = defaultdict(lambda: [0, 0])
        stage_ar = defaultdict(float)
        total = 0.0
        for i, q in enumerate(sample):
            r = funnel.search(q.question, answers=q.answers)
            for k in K_EVAL:
                ar[k].append(answer_recall(r.units, q.answers, k))
            ci.append(contextual_integrity(r.units, 4))
            for s in r.trace.stages:
                stage_secs[s.name] += s.seconds
                stage_units[s.name][0] += s.units_in
                stage_units[s.name][1] += s.units_out
                stage_ar[s.name] += s.answer_recall or 0.0
            total += r.trace.seconds
            if (i + 1) % 25 == 0:
                print(f"  squad {name}: {i + 1}/{len(sample)} AR@4={np.mean(ar[4]):.3f} s/q={total / (i + 1):.3f}", flush=True)
        n = len(sample)
        res[name] = {f"AR@{k}": float(np.mean(v)) for k, v in ar.items()}
        res[name]["contextual_integrity@4"] = float(np.mean(ci))
        res[name]["seconds_per_query"] = total / n
        res[name]["stages"] = [{"name": s, "seconds_per_query": stage_secs[s] / n, "units_in": stage_units[s][0] / n,
                                "units_out": stage_units[s][1] / n, "answer_recall_after": stage_ar[s] / n}
                               for s in stage_secs]
        print(f"[squad] {name}: {res[name]}", flush=True)
    res["ratio_funnel_over_flat"] = {
        "seconds_per_query": res["funnel"]["seconds_per_query"] / res["flat"]["seconds_per_query"],
        **{f"AR@{k}": res["funnel"][f"AR@{k}"] / max(res["flat"][f"AR@{k}"], 1e-9) for k in K_EVAL}}
    res["AR@4_points_funnel_minus_flat"] = 100 * (res["funnel"]["AR@4"] - res["flat"]["AR@4"])
    return res


# -- SciFact -------------------------------------------------------------------------------------
def run_scifact(args, ranker, embedder) -> dict:
    ds = load_beir(args.data / "scifact", "test")
    queries = ds.split_queries()
    qids = sorted(queries)
    rng = random.Random(0)
    qids = sorted(rng.sample(qids, min(args.n_scifact, len(qids))))
    chunk = LaterChunking(words=60, name="later_chunking")
    passages = chunk.run("", ds.corpus)
    with timer() as t_cl:
        cindex = ClusteredBM25Index(max_tokens=4096).index(ds.corpus)
    with timer() as t_dense:
        dense = DenseIndex(embedder).index(passages, cached_embeddings(embedder, [u.text for u in passages], "scifact"))
    flat = Funnel([DenseRetrieve(dense, k=args.flat_depth, name="dense"), renamed(ranker, "rerank")])
    funnel = Funnel([ClusteredBM25Retrieve(cindex, k=args.scifact_clusters, name="clustered_bm25"),
                     renamed(ranker, "pre_ranking") % args.scifact_documents, chunk,
                     post_ranker(args, ranker)])
    res = {"n_documents": len(ds.corpus), "n_passages": len(passages), "n_clusters": len(cindex.clusters),
           "clustering_seconds": t_cl["seconds"], "dense_index_seconds": t_dense["seconds"],
           "n_queries": len(qids)}
    for f in (flat, funnel):  # load every model before timing
        f.search(queries[qids[0]])
    for name, f in (("flat", flat), ("funnel", funnel)):
        run: dict[str, dict[str, float]] = {}
        secs = defaultdict(float)
        total = 0.0
        for i, q in enumerate(qids):
            r = f.search(queries[q])
            scores: dict[str, float] = {}
            for u in r.units:  # document score = its best passage
                did = u.parent_id or u.id
                scores[did] = max(scores.get(did, -1e9), u.score)
            run[q] = scores
            for s in r.trace.stages:
                secs[s.name] += s.seconds
            total += r.trace.seconds
            if (i + 1) % 25 == 0:
                print(f"  scifact {name}: {i + 1}/{len(qids)} s/q={total / (i + 1):.3f}", flush=True)
        qrels = {q: ds.qrels[q] for q in qids}
        res[name] = {**ir_metrics(qrels, run, ["ndcg@10", "recall@100"]), "seconds_per_query": total / len(qids),
                     "stages": {s: v / len(qids) for s, v in secs.items()}}
        print(f"[scifact] {name}: {res[name]}", flush=True)
    res["ratio_funnel_over_flat"] = {k: res["funnel"][k] / max(res["flat"][k], 1e-9)
                                     for k in ("ndcg@10", "recall@100", "seconds_per_query")}
    return res


# -- scaling -------------------------------------------------------------------------------------
def run_scaling(args, rerank_seconds: dict) -> list[dict]:
    """Time the corpus-size-dependent parts of each paradigm on synthetic corpora.

    flat: exact inner-product top-400 over N random 384-d unit vectors (what DenseIndex does);
    funnel: BM25 over the clusters of N synthetic 100-word passages (40 passages per cluster,
    ~4K tokens). The reranking costs do not depend on N; they are taken from the SQuAD run.
    """
    from bench_bm25 import synthetic_corpus

    ds = load_beir(args.data / "scifact", "test")
    vocab = sorted({w for u in ds.corpus[:3000] for w in u.text.lower().split() if w.isalpha()})
    queries = [u.text.split(".")[0] for u in ds.corpus[:50]]
    rows = []
    rng = np.random.default_rng(0)
    for n in args.scale_sizes:
        emb = rng.standard_normal((n, 384), dtype=np.float32)
        emb /= np.linalg.norm(emb, axis=1, keepdims=True)
        dense = DenseIndex(SentenceEmbedder())
        dense.units = [Unit(id=str(i), text="") for i in range(n)]
        dense.embeddings = emb
        q_emb = rng.standard_normal((len(queries), 384), dtype=np.float32)
        t0 = time.perf_counter()
        for i in range(len(queries)):
            dense.search_many([queries[i]], k=args.flat_depth, query_embeddings=q_emb[i:i + 1])
        flat_search = (time.perf_counter() - t0) / len(queries)
        del emb, dense
        n_clusters = max(1, n // 40)
        texts = synthetic_corpus(n_clusters * 40, vocab, seed=n, words=100)
        cluster_texts = [" ".join(texts[i * 40:(i + 1) * 40]) for i in range(n_clusters)]
        del texts
        with timer() as tb:
            cidx = BM25Index.from_texts(cluster_texts, level="cluster")
        del cluster_texts
        t0 = time.perf_counter()
        for q in queries:
            cidx.search(q, k=args.squad_clusters)
        funnel_search = (time.perf_counter() - t0) / len(queries)
        del cidx
        rows.append({"n_passages": n, "flat_dense_search_s": flat_search, "funnel_cluster_bm25_s": funnel_search,
                     "cluster_bm25_build_s": tb["seconds"],
                     "flat_total_s": flat_search + rerank_seconds["flat"],
                     "funnel_total_s": funnel_search + rerank_seconds["funnel"]})
        print(f"[scale] {rows[-1]}", flush=True)
    return rows


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    sq = result["squad"]
    for ax, name in zip(axes[:2], ("flat", "funnel")):
        stages = sq[name]["stages"]
        y = np.arange(len(stages))[::-1]
        widths = [max(s["units_out"], 0.5) for s in stages]
        ax.barh(y, widths, left=[-w / 2 for w in widths], color="C0" if name == "flat" else "C1", alpha=0.8)
        for yi, s in zip(y, stages):
            ax.text(0, yi, f"{s['name']}: {s['units_in']:.0f}->{s['units_out']:.0f} units, "
                           f"{1000 * s['seconds_per_query']:.0f} ms, AR {s['answer_recall_after']:.2f}",
                    ha="center", va="center", fontsize=7)
        ax.set_yticks([]); ax.set_xticks([])
        ax.set_title(f"SQuAD {name}: AR@4={sq[name]['AR@4']:.3f}, {sq[name]['seconds_per_query']:.2f} s/query")
    ax = axes[2]
    rows = result.get("scaling", [])
    if rows:
        ns = [r["n_passages"] for r in rows]
        depth = result.get("args", {}).get("flat_depth", "400")
        ax.plot(ns, [r["flat_total_s"] for r in rows], "o-", label=f"flat (dense + rerank {depth})")
        ax.plot(ns, [r["funnel_total_s"] for r in rows], "s-", label="funnel (cluster BM25 + rerank)")
        ax.plot(ns, [r["flat_dense_search_s"] for r in rows], "o:", label="flat: dense search only")
        ax.plot(ns, [r["funnel_cluster_bm25_s"] for r in rows], "s:", label="funnel: cluster BM25 only")
        ax.set_xscale("log"); ax.set_yscale("log")
        ax.set_xlabel("passages in corpus"); ax.set_ylabel("seconds per query")
        ax.set_title("time per query vs corpus size"); ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--ranker", choices=("cross-encoder", "embedding"), default="cross-encoder")
    p.add_argument("--fid", type=Path, default=None, metavar="FOLDER",
                   help="FiD (T5) checkpoint that post-ranks the funnel's passages (default: the --ranker model)")
    p.add_argument("--n-squad", type=int, default=100)
    p.add_argument("--n-scifact", type=int, default=50)
    p.add_argument("--window-words", type=int, default=120,
                   help="cross-encoder MaxP window for texts longer than this (0: truncate instead)")
    p.add_argument("--no-bf16", action="store_true", help="score in fp32 (default: bf16 autocast)")
    p.add_argument("--squad-clusters", type=int, default=3)
    p.add_argument("--squad-documents", type=int, default=4)
    p.add_argument("--scifact-clusters", type=int, default=3)
    p.add_argument("--scifact-documents", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--flat-depth", type=int, default=400, help="passages the flat paradigm reranks")
    p.add_argument("--skip-scifact", action="store_true", help="SQuAD only (the SciFact part encodes ~25k passages)")
    p.add_argument("--scale-sizes", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    args = p.parse_args()
    if args.quick:
        args.n_squad, args.n_scifact, args.scale_sizes = 20, 10, [10_000]
    ranker, ranker_desc = make_ranker(args.ranker, args.data, args.batch_size, args.window_words or None,
                                      not args.no_bf16)
    embedder = SentenceEmbedder(batch_size=args.batch_size)
    result = {"ranker": {"kind": args.ranker, "model": ranker_desc, "repr": repr(ranker)}, "args": {k: str(v) for k, v in vars(args).items()}}
    result["squad"] = run_squad(args, ranker, embedder)
    if not args.skip_scifact:
        result["scifact"] = run_scifact(args, ranker, embedder)
    rerank = {name: sum(s["seconds_per_query"] for s in result["squad"][name]["stages"]
                        if s["name"] not in ("dense", "clustered_bm25")) for name in ("flat", "funnel")}
    result["scaling"] = run_scaling(args, rerank) if args.scale_sizes else []
    result["notes"] = ("2-core CPU; per-stage seconds come from the funnel traces. "
                       "Scaling: corpus-size-dependent parts measured on synthetic corpora (random unit "
                       "vectors for the dense side, synthetic text clusters for BM25), plus the measured "
                       "SQuAD reranking time per query, which does not depend on corpus size.")
    path = write_json("funnel", result, args.out)
    plot(result, path.with_suffix(".png"))


if __name__ == "__main__":
    main()
