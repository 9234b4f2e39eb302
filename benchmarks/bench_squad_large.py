"""The funnel against strong flat baselines on the large SQuAD corpus.

    # 1. (once) the cross-encoder, trained on SQuAD train questions only (models/minilm-squad-ce)
    funnel train benchmarks/train/squad_ce.toml
    # 2. candidates of every system; writes the (question, passage) pairs still to be scored
    python benchmarks/bench_squad_large.py --export-pairs .cache/squad_large/pairs.npz
    # 3. score them once, on a GPU or on the CPU (same script)
    python benchmarks/pairs.py .cache/squad_large/pairs.npz models/minilm-squad-ce .cache/squad_large/scores.npy
    # 4. metrics from the cached scores, cluster recall, JSON (time: time_squad_large.py)
    python benchmarks/bench_squad_large.py --import-scores .cache/squad_large/pairs.npz .cache/squad_large/scores.npy
    python benchmarks/bench_squad_large.py --quick            # minutes: tiny samples, CPU scoring

Corpus, systems (``FLAT_DEPTHS``, ``FUNNEL_GRID``), the train questions every choice is made on, and how
quality (cached scores, MaxP) and time (``time_squad_large.py``) are measured: docs/benchmarks.md.
"""

from __future__ import annotations

import gzip
import json
import sys
import time
from pathlib import Path

import faiss
import numpy as np
import squad_large_data as D
import squad_large_eval as E
from common import ROOT, parser, timed, write_json
from pairs import CACHE, ScoreCache
from squad_large_data import PASSAGE_WORDS, SEEDS, SQUAD_FILES, AnswerTexts
from trained import SQUAD_CE, require_model, training_facts

from funnel_core.bm25 import BM25Index
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
from funnel_core.hardware import describe

METHOD = ("AR@k from cached cross-encoder scores: each (question, passage) pair is scored once "
          "(cache key: model hash, question id, passage index); a funnel's MaxP document score is the "
          "max of its passages' cached scores because its 100-word windows are exactly the corpus "
          "passages. AR@k = a passage among the top k contains a gold answer string (SQuAD "
          "normalisation). Seconds per query: each system's real funnel_core pipeline, uncached, models "
          "warm, systems run round-robin per question, on the timing sample, on this machine's CPU (2 "
          "shared cores; load average in the JSON) with the cross-encoder in {dtype}, "
          "batch size {batch}. Bulk scores for the cache may come from a GPU in fp16 "
          "(pairs.py); 'AR@4_hit_agreement_real_vs_cached' checks them against the CPU pipeline on "
          "the timing sample.")


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--squad", type=Path, nargs="+", default=SQUAD_FILES,
                   help="SQuAD-format files forming the corpus (the *train* file's questions tune, dev-a's report)")
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
    grid = list(E.FUNNEL_GRID)
    if args.quick:
        args.n_train, args.n_report, args.bootstrap, args.cpu_score = 10, 20, 200, True
        grid = [(4096, 3, 2), E.PRESET]
    if not args.export_texts:
        require_model(args.model, "SQuAD cross-encoder")
    t_start = time.perf_counter()
    flags = describe()  # the CPU facts the JSON records; bf16 autocast only where the CPU runs bf16 natively
    dtype = "bf16 autocast" if flags["cpu_native_bf16"] else "fp32"
    timings: dict[str, float] = {}
    corpus = timed(timings, "corpus_seconds", lambda: D.build_corpus(args.squad))
    passages, documents = corpus.passages, corpus.documents
    print(f"{len(documents)} documents, {len(passages)} passages", flush=True)
    split = {"train": corpus.tuning_sample()[:args.n_train], "dev-a": corpus.report_sample(args.n_report)}
    tune_qs, report_qs = split.values()
    all_qs = tune_qs + report_qs
    print(f"questions: {len(tune_qs)} train (tuning), {len(report_qs)} dev-a (report)", flush=True)
    if args.export_texts:
        texts = {"passages": [u.text for u in passages],
                 **{k: [q.question for q in v] for k, v in corpus.embedded_questions().items()}}
        args.export_texts.write_bytes(gzip.compress(json.dumps(texts).encode("utf-8")))
        print(f"wrote {args.export_texts}; embed with: python benchmarks/embed_texts.py {args.export_texts} "
              f"MINILM_FOLDER {args.embeddings}", flush=True)
        return
    from funnel_core.embeddings import SentenceEmbedder

    embedder = SentenceEmbedder(batch_size=args.batch_size)
    t0 = time.perf_counter()
    emb, emb_source = D.passage_embeddings(args.embeddings, passages, embedder)
    q_emb = D.question_embeddings(args.embeddings, corpus, all_qs, embedder)
    timings["embeddings_seconds"] = time.perf_counter() - t0
    built: dict[str, float] = {}
    dense = timed(built, "build_seconds", lambda: D.dense_index(passages, emb, embedder))
    bm25 = timed(timings, "bm25_passages_seconds", lambda: BM25Index().index(passages))
    adj = timed(timings, "adjacency_seconds", corpus.adjacency)
    cindexes, cluster_info = {}, {}
    for s in E.CLUSTER_SIZES:
        t0 = time.perf_counter()
        cindexes[s] = ClusteredBM25Index(max_tokens=s).index(documents, adjacency=adj)
        clusters = cindexes[s].clusters
        cluster_info[str(s)] = {"clusters": len(clusters), "seconds": time.perf_counter() - t0,
                                "mean_documents_per_cluster": len(documents) / len(clusters),
                                "mean_tokens_per_cluster": float(np.mean([c.metadata["n_tokens"] for c in clusters]))}
    print(f"clusters: {cluster_info}", flush=True)

    # hybrid alpha tuned on train (first-stage AR@20 of the fused top-100); HNSW against exact search
    ans_p, ans_d = AnswerTexts([u.text for u in passages]), AnswerTexts([d.text for d in documents])
    cands = E.first_stages(all_qs, bm25, dense, q_emb, corpus.passage_index)
    alpha_scores = {}
    for a in E.ALPHAS:
        E.set_hybrid(cands, tune_qs, a, corpus.passage_index)
        alpha_scores[a] = float(np.mean([ans_p.hit_rank(q.answers, cands[q.id]["hybrid"][:20]) > 0 for q in tune_qs]))
    alpha = max(E.ALPHAS, key=lambda a: (alpha_scores[a], -abs(a - 0.3)))
    E.set_hybrid(cands, all_qs, alpha, corpus.passage_index)
    print(f"hybrid alpha tuned on train (AR@20): {alpha_scores} -> {alpha}", flush=True)
    exact = D.exact_top(dense.embeddings, np.stack([q_emb[q.id] for q in report_qs]), E.FIRST_K)
    hnsw_recall = {k: float(np.mean([len(set(cands[q.id]["dense"][:k]) & set(e[:k])) / k
                                     for q, e in zip(report_qs, exact)])) for k in (100, 10)}

    clus = E.cluster_candidates(all_qs, cindexes, corpus.doc_index, max(E.RECALL_K))
    scores = ScoreCache(args.model)
    if args.import_scores:
        scores.import_scores(*args.import_scores)
    need = E.needed_pairs(all_qs, cands, clus, corpus, grid)
    missing = scores.missing(need)
    n_missing, q_text, p_text = sum(map(len, missing.values())), {q.id: q.question for q in all_qs}, ans_p.texts
    print(f"pairs needed: {sum(map(len, need.values()))}, missing from the cache: {n_missing}", flush=True)
    if args.export_pairs:
        return scores.export(args.export_pairs, missing, q_text, p_text)
    if n_missing and not args.cpu_score:
        sys.exit(f"{n_missing} pairs are not scored yet; run with --export-pairs FILE (then pairs.py and "
                 "--import-scores), or with --cpu-score to score them here.")
    scores.score(missing, q_text, p_text, args.batch_size)
    ranks, rows = {}, {}
    for name, qs in split.items():
        ranks[name], pairs_cnt, extra = E.evaluate(qs, cands, clus, corpus, scores.scores, ans_p, ans_d, grid)
        rows[name] = E.summarize(qs, ranks[name], pairs_cnt, extra, n_boot=args.bootstrap)
    funnels = [n for n, r in rows["train"].items() if r["kind"] == "funnel"]
    best_funnel = max(funnels, key=lambda n: (rows["train"][n]["AR@4"], -rows["train"][n]["pairs_per_query"]))
    print(f"best funnel on train: {best_funnel} AR@4 {rows['train'][best_funnel]['AR@4']:.3f}", flush=True)

    # first-stage recall of clusters vs flat documents on dev-a (and train)
    doc_bm25 = BM25Index().index(documents).search_many([q.question for q in all_qs], k=200)
    flat_docs = {"bm25": {q.id: [corpus.doc_index[u.id] for u in r] for q, r in zip(all_qs, doc_bm25)},
                 "dense": E.dense_doc_rankings(all_qs, dense, q_emb, corpus)}
    recall = {name: E.cluster_recall(qs, clus, flat_docs, ans_d) for name, qs in split.items()}
    model = args.model.relative_to(ROOT) if args.model.is_relative_to(ROOT) else args.model
    result = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "command": "python benchmarks/bench_squad_large.py" + (" --quick" if args.quick else ""),
        "corpus": {"files": [str(f) for f in args.squad], "documents": len(documents), "passages": len(passages),
                   "passage_words": PASSAGE_WORDS, "clusters": cluster_info, "dense_embeddings": emb_source},
        "samples": {"train_tuning": len(tune_qs), "dev_a_report": len(report_qs),
                    "dev_a_timing": 0,  # time_squad_large.py times
                    "seeds": SEEDS},
        "cross_encoder": {"model": str(model), "cache_key": scores.model_key, "max_length": 192,
                          "batch_size": args.batch_size, "timing_dtype": dtype,
                          "training": training_facts(args.model)},
        "cpu_flags": flags,
        "dense": {"type": "faiss IndexHNSWFlat", **D.HNSW, "faiss": faiss.__version__, **built,
                  **{f"recall@{k}_hnsw_vs_exact": r for k, r in hnsw_recall.items()}},
        "hybrid": {"alpha": alpha, "alpha_AR@20_on_train": {str(a): v for a, v in alpha_scores.items()},
                   "fusion": "funnel_core.best_practices.fusion.fuse(method='alpha', normalization='minmax') "
                             "of BM25 top-100 and dense top-100"},
        "best_funnel_chosen_on_train": best_funnel,
        "systems_dev_a": rows["dev-a"], "systems_train": rows["train"],
        "comparison": {"funnel": best_funnel},  # time_squad_large.py compares, with the harness's seconds
        "cluster_recall_dev_a": recall["dev-a"], "cluster_recall_train": recall["train"],
        "build_seconds": timings,
        "method": METHOD.format(dtype=dtype, batch=args.batch_size),
        "wall_seconds": time.perf_counter() - t_start,
    }
    name = "squad_large_quick" if args.quick else "squad_large"
    path = write_json(name, result, args.out)
    with gzip.open(path.with_name(name + "_per_question.jsonl.gz"), "wt", encoding="utf-8") as f:
        for s, qs in split.items():
            for q in qs:
                hits = {n: ranks[s][n][q.id] for n in ranks[s]}
                f.write(json.dumps({"id": q.id, "split": s, "hit_rank": hits}, sort_keys=True) + "\n")
    print("quality written; time the real pipelines through the evaluation harness with\n"
          "  python benchmarks/time_squad_large.py --n-timing 50 --quiet-check --quiet-load 1.0", flush=True)


if __name__ == "__main__":
    main()
