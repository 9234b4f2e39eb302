"""The funnel against strong flat baselines on the large SQuAD corpus.

    # 1. (once) the cross-encoder, trained on SQuAD train questions only (models/minilm-squad-ce)
    funnel train benchmarks/train/squad_ce.toml
    # 2. candidates of every system; writes the (question, passage) pairs still to be scored
    python benchmarks/bench_squad_large.py --export-pairs .cache/squad_large/pairs.npz
    # 3. score them once, on a GPU or on the CPU (same script)
    python benchmarks/pairs.py .cache/squad_large/pairs.npz models/minilm-squad-ce .cache/squad_large/scores.npy
    # 4. metrics from the cached scores, real-pipeline timings, cluster recall, JSON + plot
    python benchmarks/bench_squad_large.py --import-scores .cache/squad_large/pairs.npz .cache/squad_large/scores.npy
    python benchmarks/bench_squad_large.py --quick            # minutes: tiny samples, CPU scoring

Corpus, systems (``FLAT_DEPTHS``, ``FUNNEL_GRID``), the train questions every choice is made on, and how
quality (cached scores, MaxP) and time (``time_squad_large.py``) are measured: docs/benchmarks.md.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from common import ROOT, parser, timed, write_json
from squad_large_data import PASSAGE_WORDS, AnswerTexts, build_corpus
from trained import SQUAD_CE, SQUAD_FILES, require_model, tuning_question_ids

from funnel_core.best_practices.fusion import HybridRetrieve, fuse
from funnel_core.bm25 import BM25Index, BM25Retrieve
from funnel_core.evaluation.stats import bootstrap_ci, mcnemar_exact, paired_bootstrap
from funnel_core.funnel import Funnel, Stage
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
from funnel_core.funnelrag.presets import funnelrag, renamed
from funnel_core.hardware import describe
from funnel_core.units import Unit

CACHE = ROOT / ".cache" / "squad_large"
FIRST_K = 100
FLAT_DEPTHS = (10, 20, 50, 100)
CLUSTER_SIZES = (1024, 2048, 4096, 8192)
RECALL_K = (1, 2, 3, 5, 10, 20)
#: (S, K clusters, k documents); the preset (4096, 10, 8) is funnelrag()'s defaults
FUNNEL_GRID = [(4096, 3, 2), (4096, 3, 4), (4096, 5, 4), (4096, 5, 8), (4096, 10, 4), (4096, 10, 8),
               (2048, 5, 4), (2048, 10, 4), (2048, 10, 8), (1024, 10, 4), (1024, 20, 8)]
PRESET = (4096, 10, 8)
ALPHAS = (0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
TRAIN_SEED, REPORT_SEED, TIMING_SEED = 0, 1, 2


def funnel_name(cfg) -> str:
    s, k, kd = cfg
    return f"funnel S{s} K{k} kd{kd}" + (" (preset)" if tuple(cfg) == PRESET else "")


# -- dense first stage (faiss HNSW) --------------------------------------------------------------
class FaissDense:
    """Inner-product HNSW index over normalised MiniLM embeddings, with exact search for checks."""

    def __init__(self, emb: np.ndarray, m: int = 32, ef_construction: int = 200, ef_search: int = 128):
        import faiss

        faiss.omp_set_num_threads(1)
        self.emb = np.ascontiguousarray(emb, dtype=np.float32)
        t0 = time.perf_counter()
        self.index = faiss.IndexHNSWFlat(self.emb.shape[1], m, faiss.METRIC_INNER_PRODUCT)
        self.index.hnsw.efConstruction = ef_construction
        self.index.add(self.emb)
        self.index.hnsw.efSearch = ef_search
        self.build_seconds = time.perf_counter() - t0
        self.settings = {"type": "faiss IndexHNSWFlat", "M": m, "efConstruction": ef_construction,
                         "efSearch": ef_search, "faiss": faiss.__version__}

    def search(self, q_emb: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        sims, idx = self.index.search(np.ascontiguousarray(q_emb, dtype=np.float32), k)
        return sims, idx

    def exact(self, q_emb: np.ndarray, k: int) -> np.ndarray:
        out = []
        for b in range(0, len(q_emb), 512):
            sims = q_emb[b:b + 512] @ self.emb.T
            top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
            order = np.take_along_axis(sims, top, 1).argsort(axis=1)[:, ::-1]
            out.append(np.take_along_axis(top, order, 1))
        return np.concatenate(out)


class FaissRetrieve(Stage):
    """A real first stage for the timing runs: embed the query (CPU), HNSW top-k."""

    def __init__(self, dense: FaissDense, embedder, passages: list[Unit], k: int = FIRST_K, name: str = "dense"):
        self.dense, self.embedder, self.passages, self.k, self.name = dense, embedder, passages, k, name

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        k = min(self.k, self.cutoff) if self.cutoff else self.k
        sims, idx = self.dense.search(self.embedder.encode([query]), k)
        return [self.passages[i].rescored(float(s), self.name) for s, i in zip(sims[0], idx[0]) if i >= 0]


# -- embeddings ----------------------------------------------------------------------------------
def load_embeddings(prefix: Path, name: str) -> np.ndarray | None:
    parts = sorted(prefix.parent.glob(f"{prefix.name}.{name}.*.npy"), key=lambda p: int(p.stem.rsplit(".", 1)[1]))
    if not parts:
        return None
    e = np.concatenate([np.load(p) for p in parts]).astype(np.float32)
    return e / np.linalg.norm(e, axis=1, keepdims=True)


def question_embeddings(args, corpus, qs, embedder) -> dict[str, np.ndarray]:
    """Embeddings of the sampled questions: from the precomputed files when present, else encoded here."""
    out = {}
    pre = {"dev-a": load_embeddings(args.embeddings, "dev_a"), "train": load_embeddings(args.embeddings, "train_tune")}
    order = {"dev-a": [q.id for q in corpus.questions.get("dev-a", [])],
             "train": [q.id for q in corpus.questions.get("train", []) if q.id in tuning_question_ids(corpus.questions["train"])]}
    for split, e in pre.items():
        if e is not None and len(e) == len(order[split]):
            out.update(zip(order[split], e))
    missing = [q for q in qs if q.id not in out]
    if missing:
        enc = embedder.encode([q.question for q in missing])
        out.update(zip([q.id for q in missing], enc))
    return out


# -- the score cache -----------------------------------------------------------------------------
def model_key(model_dir: Path) -> str:
    """The score cache's key of a checkpoint: the SHA-1 of its weights (16 hex digits)."""
    h = hashlib.sha1()
    with open(model_dir / "model.safetensors", "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def read_scores(path: Path, qids: set[str] | None = None) -> dict[tuple[str, int], float]:
    """``{(question id, passage index): score}`` of a score-cache file (of the questions ``qids`` only)."""
    z = np.load(path, allow_pickle=False)
    names = json.loads(gzip.decompress(z["qids"].tobytes()))
    qi, pi, s = z["qi"], z["pi"], z["s"]
    if qids is not None:
        mask = np.isin(qi, np.array([i for i, q in enumerate(names) if q in qids], dtype=np.int64))
        qi, pi, s = qi[mask], pi[mask], s[mask]
    return {(names[a], int(p)): float(x) for a, p, x in zip(qi, pi, s)}


class ScoreCache:
    """Cross-encoder scores keyed by (model, question id, passage index), kept in one .npz per model."""

    def __init__(self, model_dir: Path):
        self.model_key = model_key(model_dir)
        self.path = CACHE / f"scores-{self.model_key}.npz"
        self.scores = read_scores(self.path) if self.path.is_file() else {}

    def save(self) -> None:
        qids = sorted({q for q, _ in self.scores})
        pos = {q: i for i, q in enumerate(qids)}
        keys = list(self.scores)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(self.path, qi=np.array([pos[q] for q, _ in keys], dtype=np.int32),
                            pi=np.array([p for _, p in keys], dtype=np.int32),
                            s=np.array([self.scores[k] for k in keys], dtype=np.float32),
                            qids=np.frombuffer(gzip.compress(json.dumps(qids).encode()), dtype=np.uint8))

    def __getitem__(self, key):
        return self.scores[key]

    def missing(self, needed: dict[str, set[int]]) -> dict[str, list[int]]:
        return {q: sorted(p for p in ps if (q, p) not in self.scores) for q, ps in needed.items()
                if any((q, p) not in self.scores for p in ps)}


# -- candidates ----------------------------------------------------------------------------------
def first_stages(qs, bm25, dense, q_emb, pid_index, passages, alpha):
    texts = [q.question for q in qs]
    bm = bm25.search_many(texts, k=FIRST_K)
    qe = np.stack([q_emb[q.id] for q in qs])
    sims, idx = dense.search(qe, FIRST_K)
    out = {}
    for j, q in enumerate(qs):
        b_units = bm[j]
        d_units = [passages[i].rescored(float(s), "dense") for s, i in zip(sims[j], idx[j]) if i >= 0]
        out[q.id] = {"bm25": [pid_index[u.id] for u in b_units], "dense": [int(i) for i in idx[j] if i >= 0],
                     "_bm25_units": b_units, "_dense_units": d_units}
    set_hybrid(out, qs, pid_index, alpha)
    return out


def set_hybrid(cands, qs, pid_index, alpha):
    for q in qs:
        c = cands[q.id]
        c["hybrid"] = [pid_index[u.id] for u in fuse(c["_bm25_units"], c["_dense_units"], method="alpha",
                                                      alpha=alpha, k=FIRST_K)]


def cluster_candidates(qs, cindexes, doc_index, kmax):
    """Per S and question: documents of the top-``kmax`` clusters as (doc index, cluster rank).

    Batched BM25 over the clusters, opened in the order ``ClusteredBM25Index.search`` opens them
    (cluster rank, then member order); the timing runs use ``search`` itself.
    """
    out = {}
    for s, ci in cindexes.items():
        res = ci.cluster_index.search_many([q.question for q in qs], k=kmax[s])
        out[s] = {q.id: [(doc_index[m], rank) for rank, c in enumerate(clusters) for m in c.metadata["members"]]
                  for q, clusters in zip(qs, res)}
    return out


def needed_pairs(qs, cands, clus, corpus, grid):
    need: dict[str, set[int]] = defaultdict(set)
    kmax_cfg = defaultdict(int)
    for s, k, _ in grid:
        kmax_cfg[s] = max(kmax_cfg[s], k)
    for q in qs:
        c = cands[q.id]
        for sysname in ("bm25", "dense", "hybrid"):
            need[q.id].update(c[sysname][:max(FLAT_DEPTHS)])
        for s, kmax in kmax_cfg.items():
            for d, rank in clus[s][q.id]:
                if rank < kmax:
                    need[q.id].update(corpus.passages_of_doc[d])
    return need


# -- evaluation from cached scores ---------------------------------------------------------------
def evaluate(qs, cands, clus, corpus, scores: ScoreCache, ans_p: AnswerTexts, ans_d: AnswerTexts, grid):
    """Hit rank of every system on every question, plus the pairs each real pipeline would score."""
    ranks: dict[str, dict[str, int]] = defaultdict(dict)
    pairs: dict[str, list[int]] = defaultdict(list)
    extra: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for q in qs:
        c = cands[q.id]
        for fs in ("bm25", "dense", "hybrid"):
            ranks[fs][q.id] = ans_p.hit_rank(q.answers, c[fs])
            pairs[fs].append(0)
            for d in FLAT_DEPTHS:
                top = c[fs][:d]
                order = sorted(top, key=lambda i: -scores[(q.id, i)])
                name = f"{fs} -> CE@{d}"
                ranks[name][q.id] = ans_p.hit_rank(q.answers, order)
                pairs[name].append(len(top))
        for cfg in grid:
            s, k, kd = cfg
            docs = [d for d, r in clus[s][q.id] if r < k]
            doc_score = {d: max(scores[(q.id, i)] for i in corpus.passages_of_doc[d]) for d in docs}
            kept = sorted(docs, key=lambda d: -doc_score[d])[:kd]   # stable: ties keep retrieval order
            psg = [i for d in kept for i in corpus.passages_of_doc[d]]
            order = sorted(psg, key=lambda i: -scores[(q.id, i)])
            name = funnel_name(cfg)
            ranks[name][q.id] = ans_p.hit_rank(q.answers, order)
            pairs[name].append(sum(len(corpus.passages_of_doc[d]) for d in docs) + len(psg))
            extra[name]["docs_retrieved"].append(len(docs))
            extra[name]["recall_after_retrieval"].append(float(any(ans_d(q.answers, d) for d in docs)))
            extra[name]["recall_after_pre_ranking"].append(float(any(ans_d(q.answers, d) for d in kept)))
    return ranks, pairs, extra


def ar(hit_ranks, k) -> np.ndarray:
    r = np.asarray(hit_ranks)
    return ((r > 0) & (r <= k)).astype(np.float64)


def summarize(qs, ranks, pairs, extra, n_boot: int) -> dict:
    out = {}
    for name, per_q in ranks.items():
        hr = [per_q[q.id] for q in qs]
        first = "->" not in name and not name.startswith("funnel")
        ks = (1, 2, 3, 4, 10, 20, 100) if first else (1, 2, 3, 4)
        row = {f"AR@{k}": float(ar(hr, k).mean()) for k in ks}
        row["AR@4_ci95"] = list(bootstrap_ci(ar(hr, 4), n_boot=n_boot, seed=0))
        row["pairs_per_query"] = float(np.mean(pairs[name]))
        for key, vals in extra.get(name, {}).items():
            row[f"mean_{key}"] = float(np.mean(vals))
        row["kind"] = "first stage" if first else ("funnel" if name.startswith("funnel") else "flat")
        out[name] = row
    return out


# -- real pipelines and timing -------------------------------------------------------------------
def build_pipelines(systems, bm25, dense, embedder, passages, cindexes, ranker, alpha):
    def first(fs, k):
        if fs == "bm25":
            return BM25Retrieve(bm25, k=k, name="bm25")
        if fs == "dense":
            return FaissRetrieve(dense, embedder, passages, k=k)
        return HybridRetrieve(BM25Retrieve(bm25, k=FIRST_K), FaissRetrieve(dense, embedder, passages, k=FIRST_K),
                              alpha=alpha, k=k, name="hybrid")

    pipes = {}
    for name in systems:
        if name.startswith("funnel"):
            s, k, kd = parse_funnel(name)
            pipes[name] = funnelrag(cindexes[s], ranker, k_clusters=k, k_documents=kd, k_passages=4,
                                    passage_words=PASSAGE_WORDS)
        elif "->" in name:
            fs, d = name.split(" -> CE@")
            pipes[name] = Funnel([first(fs, int(d)), renamed(ranker, "rerank") % 4])
        else:
            pipes[name] = Funnel([first(name, FIRST_K)])
    return pipes


def parse_funnel(name: str):
    parts = name.split()
    return int(parts[1][1:]), int(parts[2][1:]), int(parts[3][2:])


# -- first-stage recall of clusters vs flat ----------------------------------------------
def cluster_recall(qs, clus, doc_bm25, doc_index, cands_dense_doc, ans_d: AnswerTexts, ks):
    out = {}
    for s, per_q in clus.items():
        rows = []
        for k in ks:
            rc, rb, rd, nd = [], [], [], []
            for q in qs:
                docs = [d for d, r in per_q[q.id] if r < k]
                n = len(docs)
                nd.append(n)
                rc.append(float(any(ans_d(q.answers, d) for d in docs)))
                rb.append(float(any(ans_d(q.answers, d) for d in doc_bm25[q.id][:n])))
                rd.append(float(any(ans_d(q.answers, d) for d in cands_dense_doc[q.id][:n])))
            rows.append({"K": k, "mean_documents": float(np.mean(nd)), "clusters": float(np.mean(rc)),
                         "flat_bm25_documents": float(np.mean(rb)), "flat_dense_documents": float(np.mean(rd)),
                         "clusters_ci95": list(bootstrap_ci(rc, n_boot=1000)),
                         "clusters_minus_bm25": paired_bootstrap(rc, rb, n_boot=1000)})
        out[str(s)] = rows
    return out


def dense_doc_rankings(qs, dense, q_emb, corpus, depth=2000):
    """Documents ranked by their best passage in the exact dense ranking (first appearance)."""
    doc_of_passage = np.empty(len(corpus.passages), dtype=np.int64)
    for d, ps in enumerate(corpus.passages_of_doc):
        doc_of_passage[ps] = d
    top = dense.exact(np.stack([q_emb[q.id] for q in qs]), depth)
    out = {}
    for q, row in zip(qs, top):
        seen, order = set(), []
        for i in row:
            d = int(doc_of_passage[i])
            if d not in seen:
                seen.add(d)
                order.append(d)
        out[q.id] = order
    return out


# -- comparison and plot -------------------------------------------------------------------------
def comparisons(rows, ranks, qs, best_funnel, n_boot):
    flat = {n: r for n, r in rows.items() if r["kind"] == "flat" and "seconds_p50" in r}
    f = rows[best_funnel]
    out = {"funnel": best_funnel}
    if not flat or "seconds_p50" not in f:
        return out
    near_time = min(flat, key=lambda n: abs(np.log(flat[n]["seconds_p50"] / f["seconds_p50"])))
    near_ar = min(flat, key=lambda n: (abs(flat[n]["AR@4"] - f["AR@4"]), flat[n]["seconds_p50"]))
    best_flat = max(flat, key=lambda n: (flat[n]["AR@4"], -flat[n]["seconds_p50"]))
    # equal AR@4: the fastest flat system with at least the funnel's AR@4 (else the most accurate one);
    # equal time: the most accurate flat system no slower than the funnel (else the fastest one)
    reach = [n for n in flat if flat[n]["AR@4"] >= f["AR@4"]]
    equal_ar = (min(reach, key=lambda n: (flat[n]["seconds_p50"], -flat[n]["AR@4"])) if reach else best_flat)
    within = [n for n in flat if flat[n]["seconds_p50"] <= f["seconds_p50"]]
    equal_time = (max(within, key=lambda n: (flat[n]["AR@4"], -flat[n]["seconds_p50"])) if within
                  else min(flat, key=lambda n: flat[n]["seconds_p50"]))
    fh = ar([ranks[best_funnel][q.id] for q in qs], 4)
    for label, other in (("nearest_in_time", near_time), ("nearest_in_AR@4", near_ar), ("best_flat", best_flat),
                         ("equal_AR@4", equal_ar), ("equal_time", equal_time)):
        oh = ar([ranks[other][q.id] for q in qs], 4)
        out[label] = {"flat": other, "AR@4_funnel": f["AR@4"], "AR@4_flat": flat[other]["AR@4"],
                      "AR@4_difference": paired_bootstrap(fh, oh, n_boot=n_boot),
                      "mcnemar_exact": mcnemar_exact(fh, oh),
                      "seconds_p50_funnel": f["seconds_p50"], "seconds_p50_flat": flat[other]["seconds_p50"],
                      "time_ratio_funnel_over_flat": f["seconds_p50"] / flat[other]["seconds_p50"]}
    out["equal_AR@4"]["flat_reaches_funnel_AR@4"] = bool(reach)
    out["equal_time"]["flat_within_funnel_time"] = bool(within)
    return out


def plot(rows, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    for kind, colour, marker in (("flat", "C0", "o"), ("funnel", "C1", "s")):
        pts = [(n, r) for n, r in rows.items() if r["kind"] == kind and "seconds_p50" in r]
        if not pts:
            continue
        x = [r["seconds_p50"] for _, r in pts]
        y = [r["AR@4"] for _, r in pts]
        err = np.array([[r["AR@4"] - r["AR@4_ci95"][0], r["AR@4_ci95"][1] - r["AR@4"]] for _, r in pts]).T
        ax.errorbar(x, y, yerr=err, fmt=marker, color=colour, label=kind, capsize=2, ms=5)
        for (n, r), xi, yi in zip(pts, x, y):
            ax.annotate(n.replace("funnel ", "").replace(" (preset)", "*"), (xi, yi), fontsize=6,
                        xytext=(3, 2), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("seconds per query (p50, real pipeline, CPU)")
    ax.set_ylabel("AR@4 (95% bootstrap interval)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# -- main ----------------------------------------------------------------------------------------
def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--squad", type=Path, nargs="+", default=SQUAD_FILES,
                   help="SQuAD-format files forming the corpus (questions of the *train* file tune, of the *dev-a* file report)")
    p.add_argument("--model", type=Path, default=SQUAD_CE,
                   help="cross-encoder folder (default: funnel train benchmarks/train/squad_ce.toml)")
    p.add_argument("--embeddings", type=Path, default=CACHE / "emb",
                   help="prefix of precomputed MiniLM embeddings (embed_texts.py); computed here when absent")
    p.add_argument("--n-train", type=int, default=400, help="tuning questions (train; held out of CE training)")
    p.add_argument("--n-report", type=int, default=4961, help="reported questions (dev-a, seeded sample)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--bootstrap", type=int, default=2000)
    p.add_argument("--export-pairs", type=Path, default=None, help="write the unscored pairs here and stop")
    p.add_argument("--import-scores", type=Path, nargs=2, default=None, metavar=("PAIRS", "SCORES"),
                   help="add scores computed by pairs.py to the cache")
    p.add_argument("--export-texts", type=Path, default=None,
                   help="write the texts to embed (passages, dev-a questions, train tuning questions) as a "
                        "json.gz for embed_texts.py, and stop")
    p.add_argument("--cpu-score", action="store_true", help="score missing pairs here on the CPU")
    args = p.parse_args()
    grid = list(FUNNEL_GRID)
    if args.quick:
        args.n_train, args.n_report, args.bootstrap = 10, 20, 200
        args.cpu_score = True
        grid = [(4096, 3, 2), PRESET]
    if not args.export_texts:
        require_model(args.model, "SQuAD cross-encoder")
    t_start = time.perf_counter()
    flags = describe()  # the CPU facts the JSON records; bf16 autocast only where the CPU runs bf16 natively
    bf16 = bool(flags["cpu_native_bf16"])
    timings = {}

    corpus = timed(timings, "corpus_seconds", lambda: build_corpus(args.squad))
    passages, documents = corpus.passages, corpus.documents
    pid_index = {u.id: i for i, u in enumerate(passages)}
    doc_index = {d.id: i for i, d in enumerate(documents)}
    print(f"{len(documents)} documents, {len(passages)} passages", flush=True)

    train_all = corpus.questions["train"]
    tune_ids = tuning_question_ids(train_all)
    rng = random.Random(TUNE_SEED_OF := 0)
    tune_qs = [q for q in rng.sample(train_all, min(400, len(train_all))) if q.id in tune_ids][:args.n_train]
    dev_all = corpus.questions["dev-a"]
    report_qs = random.Random(REPORT_SEED).sample(dev_all, len(dev_all))[:args.n_report]  # prefixes of one permutation
    all_qs = tune_qs + report_qs
    print(f"questions: {len(tune_qs)} train (tuning), {len(report_qs)} dev-a (report)", flush=True)
    if args.export_texts:
        texts = {"passages": [u.text for u in passages], "dev_a": [q.question for q in dev_all],
                 "train_tune": [q.question for q in train_all if q.id in tune_ids]}
        args.export_texts.write_bytes(gzip.compress(json.dumps(texts).encode("utf-8")))
        print(f"wrote {args.export_texts}; embed with: python benchmarks/embed_texts.py {args.export_texts} "
              f"MINILM_FOLDER {args.embeddings}", flush=True)
        return
    from funnel_core.embeddings import SentenceEmbedder

    embedder = SentenceEmbedder(batch_size=args.batch_size)
    t0 = time.perf_counter()
    emb = load_embeddings(args.embeddings, "passages")
    emb_source = f"{args.embeddings}.passages.*.npy (embed_texts.py, float16 storage)"
    if emb is None or len(emb) != len(passages):
        from common import cached_embeddings

        emb = cached_embeddings(embedder, [u.text for u in passages], "squad_large")
        emb_source = "encoded here (CPU, fp32)"
    q_emb = question_embeddings(args, corpus, all_qs, embedder)
    timings["embeddings_seconds"] = time.perf_counter() - t0
    dense = FaissDense(emb)
    bm25 = timed(timings, "bm25_passages_seconds", lambda: BM25Index().index(passages))
    adj = timed(timings, "adjacency_seconds", corpus.adjacency)
    cindexes, cluster_info = {}, {}
    for s in CLUSTER_SIZES:
        t0 = time.perf_counter()
        cindexes[s] = ClusteredBM25Index(max_tokens=s).index(documents, adjacency=adj)
        cluster_info[str(s)] = {"clusters": len(cindexes[s].clusters), "seconds": time.perf_counter() - t0,
                                "mean_documents_per_cluster": len(documents) / len(cindexes[s].clusters),
                                "mean_tokens_per_cluster": float(np.mean([c.metadata["n_tokens"] for c in cindexes[s].clusters]))}
    print(f"clusters: {cluster_info}", flush=True)

    # HNSW vs exact recall
    qe_rep = np.stack([q_emb[q.id] for q in report_qs])
    _, approx = dense.search(qe_rep, FIRST_K)
    exact = dense.exact(qe_rep, FIRST_K)
    hnsw_recall = float(np.mean([len(set(a) & set(e)) / FIRST_K for a, e in zip(approx, exact)]))
    hnsw_recall10 = float(np.mean([len(set(a[:10]) & set(e[:10])) / 10 for a, e in zip(approx, exact)]))

    # tune alpha on train (first-stage AR@20 of the fused top-100)
    ans_p, ans_d = AnswerTexts([u.text for u in passages]), AnswerTexts([d.text for d in documents])
    cands = first_stages(all_qs, bm25, dense, q_emb, pid_index, passages, 0.3)
    alpha_scores = {}
    for a in ALPHAS:
        set_hybrid(cands, tune_qs, pid_index, a)
        alpha_scores[a] = float(np.mean([ar([ans_p.hit_rank(q.answers, cands[q.id]["hybrid"][:20])], 20)[0] for q in tune_qs]))
    alpha = max(ALPHAS, key=lambda a: (alpha_scores[a], -abs(a - 0.3)))
    set_hybrid(cands, all_qs, pid_index, alpha)
    print(f"hybrid alpha tuned on train (AR@20): {alpha_scores} -> {alpha}", flush=True)

    kmax = {s: max(RECALL_K) for s in CLUSTER_SIZES}
    clus = cluster_candidates(all_qs, cindexes, doc_index, kmax)
    need = needed_pairs(all_qs, cands, clus, corpus, grid)
    scores = ScoreCache(args.model)
    if args.import_scores:
        from pairs import read_pairs

        pq, _, qi, pi = read_pairs(args.import_scores[0])
        s_arr = np.load(args.import_scores[1])
        # pairs files carry question ids in place of texts' order: see export below
        meta = json.loads(Path(str(args.import_scores[0]) + ".ids.json").read_text())
        for a, b, s in zip(qi, pi, s_arr):
            scores.scores[(meta["question_ids"][a], int(meta["passage_index"][b]))] = float(s)
        scores.save()
        print(f"imported {len(s_arr)} scores into {scores.path}", flush=True)
    missing = scores.missing(need)
    n_missing = sum(len(v) for v in missing.values())
    print(f"pairs needed: {sum(len(v) for v in need.values())}, missing from the cache: {n_missing}", flush=True)
    if args.export_pairs:
        from pairs import write_pairs

        qids = sorted(missing)
        q_text = {q.id: q.question for q in all_qs}
        used = sorted({p for ps in missing.values() for p in ps})
        ppos = {p: j for j, p in enumerate(used)}
        qi = [j for j, q in enumerate(qids) for _ in missing[q]]
        pi = [ppos[p] for q in qids for p in missing[q]]
        write_pairs(args.export_pairs, [q_text[q] for q in qids], [passages[p].text for p in used], qi, pi)
        Path(str(args.export_pairs) + ".ids.json").write_text(json.dumps({"question_ids": qids, "passage_index": used}))
        print(f"wrote {len(qi)} pairs to {args.export_pairs}; score them with pairs.py, then --import-scores",
              flush=True)
        return
    if n_missing:
        if not args.cpu_score:
            sys.exit(f"{n_missing} pairs are not scored yet; run with --export-pairs FILE (then pairs.py and "
                     "--import-scores), or with --cpu-score to score them here.")
        from pairs import score

        qlist = [q for q in missing for _ in missing[q]]
        plist = [p for q in missing for p in missing[q]]
        q_text = {q.id: q.question for q in all_qs}
        s_arr, info = score([q_text[q] for q in qlist], [passages[p].text for p in plist],
                            np.arange(len(qlist)), np.arange(len(plist)), str(args.model),
                            batch_size=args.batch_size, device="cpu", log_every=2000)
        for q, pp, s in zip(qlist, plist, s_arr):
            scores.scores[(q, pp)] = float(s)
        scores.save()
        print(f"scored {len(qlist)} pairs on CPU: {info}", flush=True)

    ranks, pairs_cnt, extra = evaluate(all_qs, cands, clus, corpus, scores, ans_p, ans_d, grid)
    tune_rows = summarize(tune_qs, ranks, *_subset(pairs_cnt, extra, all_qs, tune_qs), n_boot=args.bootstrap)
    rows = summarize(report_qs, ranks, *_subset(pairs_cnt, extra, all_qs, report_qs), n_boot=args.bootstrap)
    funnels = [n for n in tune_rows if tune_rows[n]["kind"] == "funnel"]
    best_funnel = max(funnels, key=lambda n: (tune_rows[n]["AR@4"], -tune_rows[n]["pairs_per_query"]))
    print(f"best funnel on train: {best_funnel} AR@4 {tune_rows[best_funnel]['AR@4']:.3f}", flush=True)

    # first-stage recall of clusters vs flat on dev-a (and train)
    doc_bm25_index = BM25Index().index(documents)
    doc_bm25 = {q.id: [doc_index[u.id] for u in r] for q, r in
                zip(all_qs, doc_bm25_index.search_many([q.question for q in all_qs], k=200))}
    dense_docs = dense_doc_rankings(all_qs, dense, q_emb, corpus)
    recall_report = cluster_recall(report_qs, {s: {q.id: v[q.id] for q in report_qs} for s, v in clus.items()},
                                   doc_bm25, doc_index, dense_docs, ans_d, RECALL_K)
    recall_tune = cluster_recall(tune_qs, {s: {q.id: v[q.id] for q in tune_qs} for s, v in clus.items()},
                                 doc_bm25, doc_index, dense_docs, ans_d, RECALL_K)

    comp = comparisons(rows, ranks, report_qs, best_funnel, args.bootstrap)
    result = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "command": "python benchmarks/bench_squad_large.py" + (" --quick" if args.quick else ""),
        "corpus": {"files": [str(f) for f in args.squad], "documents": len(documents), "passages": len(passages),
                   "passage_words": PASSAGE_WORDS, "clusters": cluster_info, "dense_embeddings": emb_source},
        "samples": {"train_tuning": len(tune_qs), "dev_a_report": len(report_qs),
                    "dev_a_timing": 0,  # time_squad_large.py times
                    "seeds": {"train": TUNE_SEED_OF, "report": REPORT_SEED, "timing": TIMING_SEED}},
        "cross_encoder": {"model": str(args.model.relative_to(ROOT)) if args.model.is_relative_to(ROOT) else str(args.model),
                          "cache_key": scores.model_key, "max_length": 192, "batch_size": args.batch_size,
                          "timing_dtype": "bf16 autocast" if bf16 else "fp32",
                          "training": _training_summary(args.model)},
        "cpu_flags": flags,
        "dense": {**dense.settings, "build_seconds": dense.build_seconds,
                  "recall@100_hnsw_vs_exact": hnsw_recall, "recall@10_hnsw_vs_exact": hnsw_recall10},
        "hybrid": {"alpha": alpha, "alpha_AR@20_on_train": {str(a): v for a, v in alpha_scores.items()},
                   "fusion": "funnel_core.best_practices.fusion.fuse(method='alpha', normalization='minmax') of BM25 top-100 and dense top-100"},
        "best_funnel_chosen_on_train": best_funnel,
        "systems_dev_a": rows, "systems_train": tune_rows,
        "comparison": comp,
        "cluster_recall_dev_a": recall_report, "cluster_recall_train": recall_tune,
        "build_seconds": timings,
        "method": ("AR@k from cached cross-encoder scores: each (question, passage) pair is scored once "
                   "(cache key: model hash, question id, passage index); a funnel's MaxP document score is the "
                   "max of its passages' cached scores because its 100-word windows are exactly the corpus "
                   "passages. AR@k = a passage among the top k contains a gold answer string (SQuAD "
                   "normalisation). Seconds per query: each system's real funnel_core pipeline, uncached, models "
                   "warm, systems run round-robin per question, on the timing sample, on this machine's CPU (2 "
                   f"shared cores; load average in the JSON) with the cross-encoder in {'bf16 autocast' if bf16 else 'fp32'}, "
                   f"batch size {args.batch_size}. Bulk scores for the cache may come from a GPU in fp16 "
                   "(pairs.py); 'AR@4_hit_agreement_real_vs_cached' checks them against the CPU pipeline on "
                   "the timing sample."),
        "wall_seconds": time.perf_counter() - t_start,
    }
    name = "squad_large_quick" if args.quick else "squad_large"
    path = write_json(name, result, args.out)
    with gzip.open(path.with_name(name + "_per_question.jsonl.gz"), "wt", encoding="utf-8") as f:
        for split, qs in (("train", tune_qs), ("dev-a", report_qs)):
            for q in qs:
                f.write(json.dumps({"id": q.id, "split": split, "hit_rank": {n: ranks[n][q.id] for n in ranks}},
                                   sort_keys=True) + "\n")
    plot(rows, path.with_suffix(".png"),
         f"SQuAD train+dev-a corpus ({len(passages)} passages): {len(report_qs)} dev-a questions, "
         "time on 0")

    print("quality written; time the real pipelines through the evaluation harness with\n"
          "  python benchmarks/time_squad_large.py --n-timing 50 --quiet-check --quiet-load 1.0", flush=True)


def _subset(pairs_cnt, extra, all_qs, qs):
    pos = {q.id: i for i, q in enumerate(all_qs)}
    idx = [pos[q.id] for q in qs]
    p = {n: [v[i] for i in idx] for n, v in pairs_cnt.items()}
    e = {n: {k: [v[i] for i in idx] for k, v in d.items()} for n, d in extra.items()}
    return p, e


def _training_summary(model: Path) -> dict:
    f = model / "summary.json"
    if not f.is_file():
        return {}
    s = json.loads(f.read_text())
    return {k: s.get(k) for k in ("steps", "train_seconds", "train_questions_sampled", "groups", "dtype",
                                  "loss_first50", "loss_last50", "negative_depth", "stopped_early")}


if __name__ == "__main__":
    main()
