"""The systems of ``bench_squad_large.py`` scored from cached cross-encoder scores, and their statistics.

Flat systems: a first stage (BM25, dense = faiss HNSW over MiniLM, their alpha fusion) reranked by the
cross-encoder at each of ``FLAT_DEPTHS``; funnels: the clusters of ``ClusteredBM25Index`` (``FUNNEL_GRID``),
their documents pre-ranked by MaxP over the passages' cached scores, the kept documents' passages post-ranked.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import squad_large_data as D

from funnel_core.best_practices.fusion import fuse
from funnel_core.evaluation.stats import bootstrap_ci, mcnemar_exact, paired_bootstrap

FIRST_K = 100
FIRST_STAGES = ("bm25", "dense", "hybrid")
FLAT_DEPTHS = (10, 20, 50, 100)
CLUSTER_SIZES = (1024, 2048, 4096, 8192)
RECALL_K = (1, 2, 3, 5, 10, 20)
#: (S, K clusters, k documents); the preset (4096, 10, 8) is funnelrag()'s defaults
FUNNEL_GRID = [(4096, 3, 2), (4096, 3, 4), (4096, 5, 4), (4096, 5, 8), (4096, 10, 4), (4096, 10, 8),
               (2048, 5, 4), (2048, 10, 4), (2048, 10, 8), (1024, 10, 4), (1024, 20, 8)]
PRESET = (4096, 10, 8)
ALPHAS = (0.1, 0.2, 0.3, 0.5, 0.7, 1.0)


def funnel_name(cfg) -> str:
    s, k, kd = cfg
    return f"funnel S{s} K{k} kd{kd}" + (" (preset)" if tuple(cfg) == PRESET else "")


def first_stages(qs, bm25, dense, q_emb, pid_index) -> dict[str, dict]:
    """BM25 and dense (HNSW) top-100 passages of each question: as units (to fuse) and as passage indices."""
    texts = [q.question for q in qs]
    bm = bm25.search_many(texts, k=FIRST_K)
    dn = dense.search_many(texts, k=FIRST_K, query_embeddings=np.stack([q_emb[q.id] for q in qs]))
    return {q.id: {"_bm25": b, "_dense": d, "bm25": [pid_index[u.id] for u in b], "dense": [pid_index[u.id] for u in d]}
            for q, b, d in zip(qs, bm, dn)}


def set_hybrid(cands, qs, alpha: float, pid_index) -> None:
    """The questions' hybrid candidates: the alpha fusion (min-max normalised) of their BM25 and dense top-100."""
    for q in qs:
        c = cands[q.id]
        c["hybrid"] = [pid_index[u.id] for u in fuse(c["_bm25"], c["_dense"], method="alpha", alpha=alpha, k=FIRST_K)]


def cluster_candidates(qs, cindexes, doc_index, kmax: int):
    """Per S and question: documents of the top-``kmax`` clusters as (doc index, cluster rank).

    Batched BM25 over the clusters, opened in the order ``ClusteredBM25Index.search`` opens them
    (cluster rank, then member order); the timing runs use ``search`` itself.
    """
    out = {}
    for s, ci in cindexes.items():
        res = ci.cluster_index.search_many([q.question for q in qs], k=kmax)
        out[s] = {q.id: [(doc_index[m], rank) for rank, c in enumerate(clusters) for m in c.metadata["members"]]
                  for q, clusters in zip(qs, res)}
    return out


def needed_pairs(qs, cands, clus, corpus, grid) -> dict[str, set[int]]:
    """The (question, passage) pairs any system scores: flat top-100s, passages of the funnels' clusters."""
    kmax = {s: max(k for s2, k, _ in grid if s2 == s) for s, _, _ in grid}
    need = {}
    for q in qs:
        need[q.id] = {i for fs in FIRST_STAGES for i in cands[q.id][fs][:max(FLAT_DEPTHS)]}
        for s, k in kmax.items():
            need[q.id].update(i for d, r in clus[s][q.id] if r < k for i in corpus.passages_of_doc[d])
    return need


def reranked(scores, qid: str, ids) -> list[int]:
    return sorted(ids, key=lambda i: -scores[(qid, i)])


def evaluate(qs, cands, clus, corpus, scores, ans_p, ans_d, grid):
    """Hit rank of every system on every question, the pairs each real pipeline would score, and the
    funnels' documents and answer recall after retrieval and after pre-ranking."""
    ranks: dict[str, dict[str, int]] = defaultdict(dict)
    pairs: dict[str, list[int]] = defaultdict(list)
    extra: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))

    def rank(name: str, q, ranked: list[int], n_pairs: int) -> None:
        ranks[name][q.id] = ans_p.hit_rank(q.answers, ranked)
        pairs[name].append(n_pairs)

    for q in qs:
        for fs in FIRST_STAGES:
            rank(fs, q, cands[q.id][fs], 0)
            for d in FLAT_DEPTHS:
                top = cands[q.id][fs][:d]
                rank(f"{fs} -> CE@{d}", q, reranked(scores, q.id, top), len(top))
        for s, k, kd in grid:
            docs = [d for d, r in clus[s][q.id] if r < k]
            doc_score = {d: max(scores[(q.id, i)] for i in corpus.passages_of_doc[d]) for d in docs}
            kept = sorted(docs, key=lambda d: -doc_score[d])[:kd]   # stable: ties keep retrieval order
            psg = [i for d in kept for i in corpus.passages_of_doc[d]]
            name = funnel_name((s, k, kd))
            rank(name, q, reranked(scores, q.id, psg), sum(len(corpus.passages_of_doc[d]) for d in docs) + len(psg))
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
        row = {f"AR@{k}": float(ar(hr, k).mean()) for k in ((1, 2, 3, 4, 10, 20, 100) if first else (1, 2, 3, 4))}
        row["AR@4_ci95"] = list(bootstrap_ci(ar(hr, 4), n_boot=n_boot, seed=0))
        row["pairs_per_query"] = float(np.mean(pairs[name]))
        row.update({f"mean_{key}": float(np.mean(vals)) for key, vals in extra.get(name, {}).items()})
        row["kind"] = "first stage" if first else ("funnel" if name.startswith("funnel") else "flat")
        out[name] = row
    return out


def cluster_recall(qs, clus, flat_docs, ans_d) -> dict[str, list[dict]]:
    """Answer recall of the documents of the top-K clusters, and of as many flat BM25 / dense documents."""
    def recall(ranked):
        return [float(any(ans_d(q.answers, d) for d in r)) for q, r in zip(qs, ranked)]

    out = {}
    for s, per_q in clus.items():
        out[str(s)] = []
        for k in RECALL_K:
            docs = [[d for d, r in per_q[q.id] if r < k] for q in qs]
            rc = recall(docs)
            rb, rd = ([flat[q.id][:len(ds)] for q, ds in zip(qs, docs)] for flat in flat_docs.values())
            rb, rd = recall(rb), recall(rd)
            out[str(s)].append({"K": k, "mean_documents": float(np.mean([len(ds) for ds in docs])),
                                "clusters": float(np.mean(rc)), "flat_bm25_documents": float(np.mean(rb)),
                                "flat_dense_documents": float(np.mean(rd)),
                                "clusters_ci95": list(bootstrap_ci(rc, n_boot=1000)),
                                "clusters_minus_bm25": paired_bootstrap(rc, rb, n_boot=1000)})
    return out


def dense_doc_rankings(qs, dense, q_emb, corpus, depth=2000) -> dict[str, list[int]]:
    """Documents ranked by their best passage in the exact dense ranking (first appearance)."""
    doc_of_passage = np.empty(len(corpus.passages), dtype=np.int64)
    for d, ps in enumerate(corpus.passages_of_doc):
        doc_of_passage[ps] = d
    top = D.exact_top(dense.embeddings, np.stack([q_emb[q.id] for q in qs]), depth)
    return {q.id: list(dict.fromkeys(doc_of_passage[row].tolist())) for q, row in zip(qs, top)}


def comparisons(rows, ranks, qs, best_funnel, n_boot) -> dict:
    """The funnel chosen on train against the timed flat systems nearest in time, nearest in AR@4, the
    most accurate, at equal AR@4 (the fastest at least as accurate) and at equal time (the most accurate
    no slower; else the fastest), with paired bootstrap and McNemar tests on the same questions."""
    flat = {n: r for n, r in rows.items() if r["kind"] == "flat" and "seconds_p50" in r}
    f = rows[best_funnel]
    if not flat or "seconds_p50" not in f:
        return {"funnel": best_funnel}
    secs, acc = (lambda n: flat[n]["seconds_p50"]), (lambda n: flat[n]["AR@4"])
    best_flat = max(flat, key=lambda n: (acc(n), -secs(n)))
    reach = [n for n in flat if acc(n) >= f["AR@4"]]
    within = [n for n in flat if secs(n) <= f["seconds_p50"]]
    partners = {"nearest_in_time": min(flat, key=lambda n: abs(np.log(secs(n) / f["seconds_p50"]))),
                "nearest_in_AR@4": min(flat, key=lambda n: (abs(acc(n) - f["AR@4"]), secs(n))),
                "best_flat": best_flat,
                "equal_AR@4": min(reach, key=lambda n: (secs(n), -acc(n))) if reach else best_flat,
                "equal_time": max(within, key=lambda n: (acc(n), -secs(n))) if within else min(flat, key=secs)}
    fh = ar([ranks[best_funnel][q.id] for q in qs], 4)
    out = {"funnel": best_funnel}
    for label, other in partners.items():
        oh = ar([ranks[other][q.id] for q in qs], 4)
        out[label] = {"flat": other, "AR@4_funnel": f["AR@4"], "AR@4_flat": acc(other),
                      "AR@4_difference": paired_bootstrap(fh, oh, n_boot=n_boot),
                      "mcnemar_exact": mcnemar_exact(fh, oh),
                      "seconds_p50_funnel": f["seconds_p50"], "seconds_p50_flat": secs(other),
                      "time_ratio_funnel_over_flat": f["seconds_p50"] / secs(other)}
    out["equal_AR@4"]["flat_reaches_funnel_AR@4"] = bool(reach)
    out["equal_time"]["flat_within_funnel_time"] = bool(within)
    return out
