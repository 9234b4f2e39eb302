"""Benchmark of the "Searching for Best Practices in RAG" components.

1. SciFact (BEIR): BM25 (``funnel_core.bm25.BM25Index`` defaults), dense all-MiniLM-L6-v2
   (``DenseIndex``), the alpha hybrid ``S_h = alpha * S_sparse + S_dense`` (min-max normalised;
   alpha=0.3 as published, and alpha tuned on TRAIN qrels) and RRF (k=60, and k tuned on TRAIN).
   Reports TEST nDCG@10 and recall@100, all in one run.
2. SQuAD v1.1 (half dev): BM25 top-5 paragraphs per question, then ``ExtractiveCompressor``
   at ratio 0.4 (embedding and BM25 sentence scoring, plus a random-sentence control at the
   same budget): answer recall and whitespace tokens before/after on a fixed question sample.
3. Query classifier: stratified 5-fold cross-validated accuracy on the packaged labelled set.

Run::

    nice -n 10 python benchmarks/bench_hybrid.py --data /work/shared/data [--quick]

Corpus embeddings are cached under ``.cache/`` (gitignored), so reruns take seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tqdm import tqdm  # noqa: E402

from funnel_core.best_practices.fusion import HybridRetrieve  # noqa: E402
from funnel_core.bm25 import BM25Index  # noqa: E402
from funnel_core.embeddings import DenseIndex, SentenceEmbedder  # noqa: E402
from funnel_core.evaluation import has_answer, ir_metrics, load_beir, load_squad  # noqa: E402
from funnel_core.hardware import describe  # noqa: E402
from funnel_core.text import count_tokens, split_sentences  # noqa: E402
from funnel_core.units import Unit  # noqa: E402

METRICS = ["ndcg@10", "recall@100"]


def default_data() -> Path:
    return Path(os.environ.get("FUNNEL_DATA", ROOT.parent / "shared" / "data"))


# -- SciFact -------------------------------------------------------------------------------
def cached_embeddings(embedder: SentenceEmbedder, units: list[Unit], cache: Path,
                      tag: str) -> np.ndarray:
    """Corpus embeddings, computed once and cached as .npy keyed by model + ids + texts."""
    h = hashlib.sha1(embedder.model_name_or_path.encode())
    for u in units:
        h.update(u.id.encode())
        h.update(u.text.encode())
    path = cache / f"{tag}-{h.hexdigest()[:12]}.npy"
    if path.is_file():
        return np.load(path)
    cache.mkdir(parents=True, exist_ok=True)
    emb = embedder.encode([u.text for u in units], show_progress=True)
    np.save(path, emb)
    return emb


def evaluate(qrels: dict, results: dict[str, list[Unit]]) -> dict[str, float]:
    # Units carry their fused/first-stage scores; ranks are what ranx needs.
    run = {q: {u.id: float(len(us) - r) for r, u in enumerate(us)} for q, us in results.items()}
    return ir_metrics(qrels, run, METRICS)


def bench_scifact(data: Path, depth: int, quick: bool, cache: Path) -> dict:
    train = load_beir(data / "scifact", split="train")
    test = load_beir(data / "scifact", split="test")
    corpus = test.corpus
    t0 = time.perf_counter()
    bm25 = BM25Index().index(corpus)
    t_bm25_index = time.perf_counter() - t0

    embedder = SentenceEmbedder(batch_size=64)
    t0 = time.perf_counter()
    emb = cached_embeddings(embedder, corpus, cache, "scifact-minilm")
    t_embed = time.perf_counter() - t0
    dense = DenseIndex(embedder).index(corpus, embeddings=emb)

    splits = {"train": train, "test": test}
    lists: dict[str, dict[str, tuple[list[Unit], list[Unit]]]] = {}
    for split, ds in splits.items():
        queries = ds.split_queries()
        if quick:
            queries = dict(list(queries.items())[:150])
        qids = list(queries)
        texts = [queries[q] for q in qids]
        sparse = bm25.search_many(texts, k=depth)
        q_emb = embedder.encode(texts)
        dense_res = dense.search_many(texts, k=depth, query_embeddings=q_emb)
        lists[split] = {q: (s, d) for q, s, d in zip(qids, sparse, dense_res)}

    def hybrid_run(split: str, **kw) -> dict[str, list[Unit]]:
        # HybridRetrieve.fuse is exactly what the stage runs after calling both sides.
        stage = HybridRetrieve(bm25.search, dense.search, k=depth, **kw)
        return {q: stage.fuse(s, d) for q, (s, d) in lists[split].items()}

    def qrels_of(split: str) -> dict:
        return {q: splits[split].qrels[q] for q in lists[split]}

    # Tune on TRAIN only.
    alphas = [round(a, 2) for a in np.arange(0.0, 1.0001, 0.1)]
    tuning: dict[str, dict] = {"alpha_minmax": {}, "alpha_zscore": {}, "rrf_k": {}}
    for a in tqdm(alphas, desc="tune alpha (train)"):
        for norm in ("minmax", "zscore"):
            m = evaluate(qrels_of("train"), hybrid_run("train", alpha=a, normalization=norm))
            tuning[f"alpha_{norm}"][str(a)] = m["ndcg@10"]
    for k in tqdm([1, 5, 10, 20, 40, 60, 100, 200], desc="tune rrf k (train)"):
        m = evaluate(qrels_of("train"), hybrid_run("train", method="rrf", rrf_k=k))
        tuning["rrf_k"][str(k)] = m["ndcg@10"]
    best_alpha = float(max(tuning["alpha_minmax"], key=lambda a: (tuning["alpha_minmax"][a], -float(a))))
    best_alpha_z = float(max(tuning["alpha_zscore"], key=lambda a: (tuning["alpha_zscore"][a], -float(a))))
    best_k = int(max(tuning["rrf_k"], key=lambda k: (tuning["rrf_k"][k], -int(k))))

    systems = {
        "bm25": lambda split: {q: s for q, (s, d) in lists[split].items()},
        "dense_minilm": lambda split: {q: d for q, (s, d) in lists[split].items()},
        "hybrid_alpha0.3_minmax (paper default)": lambda split: hybrid_run(split, alpha=0.3),
        f"hybrid_alpha{best_alpha}_minmax (train-tuned)": lambda split: hybrid_run(split, alpha=best_alpha),
        f"hybrid_alpha{best_alpha_z}_zscore (train-tuned)": lambda split: hybrid_run(
            split, alpha=best_alpha_z, normalization="zscore"),
        "rrf_k60": lambda split: hybrid_run(split, method="rrf", rrf_k=60),
        f"rrf_k{best_k} (train-tuned)": lambda split: hybrid_run(split, method="rrf", rrf_k=best_k),
    }
    results = {name: {"train": evaluate(qrels_of("train"), fn("train")),
                      "test": evaluate(qrels_of("test"), fn("test"))}
               for name, fn in systems.items()}
    test = {n: r["test"] for n, r in results.items()}
    tuned = f"hybrid_alpha{best_alpha}_minmax (train-tuned)"
    ratios = {
        f"{tuned} / bm25 (ndcg@10)": test[tuned]["ndcg@10"] / test["bm25"]["ndcg@10"],
        f"{tuned} / dense_minilm (ndcg@10)": test[tuned]["ndcg@10"] / test["dense_minilm"]["ndcg@10"],
    }
    return {
        "dataset": "BEIR SciFact", "n_corpus": len(corpus),
        "n_queries": {s: len(lists[s]) for s in lists}, "candidate_depth_per_side": depth,
        "tuned_on": "train qrels (nDCG@10)", "reported_on": "test qrels",
        "best_alpha_minmax": best_alpha, "best_alpha_zscore": best_alpha_z, "best_rrf_k": best_k,
        "results": results, "ratios": ratios, "tuning_train_ndcg@10": tuning,
        "hybrid_beats_both_parts_on_test": all(
            test[tuned]["ndcg@10"] > test[b]["ndcg@10"] for b in ("bm25", "dense_minilm")),
        "seconds": {"bm25_index": t_bm25_index, "corpus_embeddings_(cached_if_small)": t_embed},
        "published_test_ndcg@10": {"bm25": 0.665, "all-MiniLM-L6-v2": 0.645},
    }


def bench_latency(data: Path, depth: int, n_queries: int, cache: Path) -> dict:
    """Seconds per SciFact test query of the hybrid stage end to end (BM25 search, query
    embedding with the warm MiniLM, dense search, alpha fusion), p50/p95 with the load average
    (issue 19's latency report). The embedding cache is off, so each query runs the model."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import LatencyReport

    test = load_beir(data / "scifact", split="test")
    bm25 = BM25Index().index(test.corpus)
    embedder = SentenceEmbedder(batch_size=64, cache=False)
    dense = DenseIndex(embedder, index="exact").index(
        test.corpus, embeddings=cached_embeddings(embedder, test.corpus, cache, "scifact-minilm"))
    stage = HybridRetrieve(bm25.search, dense.search, k=depth, alpha=0.3)
    queries = list(test.split_queries().values())[:n_queries]
    stage.run(queries[0], [])  # warm: loads the model
    rep = LatencyReport(f"hybrid alpha=0.3, {depth} per side, SciFact test")
    for q in queries:
        with rep.time():
            stage.run(q, [])
    return rep.summary()


# -- SQuAD compression -----------------------------------------------------------------------
def random_compress(units: list[Unit], ratio: float, rng: random.Random) -> list[Unit]:
    """Control: keep random sentences up to the same token budget (global, original order)."""
    sents = [(i, j, s) for i, u in enumerate(units) for j, s in enumerate(split_sentences(u.text))]
    total = sum(count_tokens(s) for _, _, s in sents)
    budget = ratio * total
    order = list(range(len(sents)))
    rng.shuffle(order)
    kept, used = set(), 0
    for n, idx in enumerate(order):
        t = count_tokens(sents[idx][2])
        if n == 0 or used + t <= budget:
            kept.add(idx)
            used += t
    out = []
    for i, u in enumerate(units):
        text = " ".join(s for k, (ui, _, s) in enumerate(sents) if ui == i and k in kept)
        if text:
            out.append(Unit(id=u.id, text=text))
    return out


def bench_squad(data: Path, n_questions: int, ratio: float, top_k: int, seed: int) -> dict:
    from funnel_core.best_practices.compress import ExtractiveCompressor

    articles = load_squad(data / "squad" / "squad-v1.1-dev-a.json")
    paragraphs = [Unit(id=f"{a.title}#{i}", text=p, metadata={"title": a.title})
                  for a in articles for i, p in enumerate(a.paragraphs)]
    questions = [q for a in articles for q in a.questions]
    rng = random.Random(seed)
    sample = rng.sample(questions, min(n_questions, len(questions)))
    index = BM25Index().index(paragraphs)
    retrieved = index.search_many([q.question for q in sample], k=top_k)
    compressors = {
        "embedding": ExtractiveCompressor(method="embedding", ratio=ratio, cache_size=1_000_000),
        "bm25": ExtractiveCompressor(method="bm25", ratio=ratio),
    }
    # Sentence embeddings of every retrieved paragraph, in large batches (the LRU cache a RAG
    # deployment would keep warm); per-question time below then covers the query + selection.
    t0 = time.perf_counter()
    unique = {u.id: u for units in retrieved for u in units}
    n_cached = compressors["embedding"].precompute(unique.values())
    precompute_seconds = time.perf_counter() - t0
    rows = {"before": [], **{f"after_{m}": [] for m in compressors}, "after_random": []}
    seconds = {m: 0.0 for m in compressors}
    ctl_rng = random.Random(seed + 1)
    for q, units in tqdm(list(zip(sample, retrieved)), desc="squad compression"):
        rows["before"].append((has_answer(" ".join(u.text for u in units), q.answers),
                               sum(count_tokens(u.text) for u in units)))
        for m, comp in compressors.items():
            t0 = time.perf_counter()
            out = comp(q.question, units)
            seconds[m] += time.perf_counter() - t0
            rows[f"after_{m}"].append((has_answer(" ".join(u.text for u in out), q.answers),
                                       sum(count_tokens(u.text) for u in out)))
        out = random_compress(units, ratio, ctl_rng)
        rows["after_random"].append((has_answer(" ".join(u.text for u in out), q.answers),
                                     sum(count_tokens(u.text) for u in out)))
    summary = {}
    for name, vals in rows.items():
        summary[name] = {"answer_recall": float(np.mean([v[0] for v in vals])),
                         "mean_tokens": float(np.mean([v[1] for v in vals]))}
    before = summary["before"]
    for name in rows:
        if name != "before":
            summary[name]["token_ratio_vs_before"] = summary[name]["mean_tokens"] / before["mean_tokens"]
            summary[name]["answer_recall_kept"] = (summary[name]["answer_recall"] / before["answer_recall"]
                                                   if before["answer_recall"] else None)
    return {"dataset": "SQuAD v1.1 dev half (squad-v1.1-dev-a.json)", "n_paragraphs": len(paragraphs),
            "n_questions_sampled": len(sample), "sample_seed": seed, "retriever": f"BM25 top-{top_k} paragraphs",
            "ratio": ratio, "tokens": "whitespace tokens (funnel_core.text.count_tokens)",
            "results": summary,
            "compressor_seconds_per_question": {m: s / len(sample) for m, s in seconds.items()},
            "embedding_cache": {"sentences": n_cached, "paragraphs": len(unique),
                                "precompute_seconds": precompute_seconds}}


# -- query classifier --------------------------------------------------------------------------
def bench_classifier(folds: int, seed: int) -> dict:
    from funnel_core.best_practices.classify import QueryClassifier, load_labelled_queries

    rows = load_labelled_queries()
    clf = QueryClassifier()
    cv = clf.cross_validate([r["query"] for r in rows], [r["label"] for r in rows],
                            folds=folds, seed=seed, groups=[r["task"] for r in rows])
    return {"n_examples": len(rows), "n_task_types": len({r["task"] for r in rows}),
            "labels": {lab: sum(r["label"] == lab for r in rows) for lab in ("retrieval", "sufficient")},
            **cv}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=default_data())
    ap.add_argument("--quick", action="store_true", help="150 queries per split, 100 SQuAD questions")
    ap.add_argument("--depth", type=int, default=100, help="candidates per side before fusion")
    ap.add_argument("--squad-questions", type=int, default=1000)
    ap.add_argument("--ratio", type=float, default=0.4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "hybrid.json")
    ap.add_argument("--only", choices=["scifact", "squad", "classifier", "latency"], default=None)
    ap.add_argument("--latency-queries", type=int, default=100)
    args = ap.parse_args()
    if args.only == "latency":  # update only the latency report of an existing hybrid.json
        kept = json.loads(args.out.read_text()) if args.out.is_file() else {}
        kept["latency"] = bench_latency(args.data, args.depth, args.latency_queries, args.cache)
        kept["latency"]["command"] = " ".join(["python", *sys.argv])
        kept["latency"]["hardware"] = describe()
        args.out.write_text(json.dumps(kept, indent=2))
        print(json.dumps(kept["latency"], indent=1))
        return

    report: dict = {"command": " ".join(["python", *sys.argv]), "quick": args.quick,
                    "machine": f"{platform.machine()} {os.cpu_count()} cores (shared, CPU only)"}
    t0 = time.perf_counter()
    if args.only in (None, "scifact"):
        report["scifact"] = bench_scifact(args.data, args.depth, args.quick, args.cache)
        print(json.dumps(report["scifact"]["results"], indent=1))
    if args.only in (None, "squad"):
        report["squad_compression"] = bench_squad(args.data, 100 if args.quick else args.squad_questions,
                                                  args.ratio, 5, args.seed)
        print(json.dumps(report["squad_compression"]["results"], indent=1))
    if args.only in (None, "classifier"):
        report["query_classifier"] = bench_classifier(5, args.seed)
    if args.only is None:
        report["latency"] = bench_latency(args.data, args.depth, args.latency_queries, args.cache)
        print(json.dumps(report["query_classifier"], indent=1))
    report["total_seconds"] = time.perf_counter() - t0
    report["hardware"] = describe()  # CPU flags and the precisions the models ran in
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
