"""Render the results tables of README.md and docs/ from benchmarks/results/*.json.

    python benchmarks/report.py            # rewrite the marked blocks in place
    python benchmarks/report.py --check    # exit 1 when a block is out of date (nothing written)

A block is the text between ``<!-- results:NAME:begin -->`` and ``<!-- results:NAME:end -->``;
everything outside the markers is left alone, so running the script twice changes nothing. No
number in a block is typed by hand: each comes from a JSON file, and every row names the command
that produced it, its sample size and its interval. Where a JSON holds per-question 0/1 outcomes or
a bootstrap interval the row shows that; for a proportion with only its mean and n recorded the
row shows a Wilson 95% interval (marked "Wilson"); where neither is possible the row says so.
A row whose JSON is missing (or lacks the fields) is left out with a warning.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
Row = tuple[str, str, str, str, str]   # what, result, n, interval, command


# -- helpers -------------------------------------------------------------------------------------
def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def wilson(p: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a proportion ``p`` observed on ``n`` trials."""
    if n <= 0:
        return (float("nan"), float("nan"))
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (centre - half, centre + half)


def f3(x: float) -> str:
    return f"{x:.3f}"


def ci(lo_hi, digits: int = 3) -> str:
    lo, hi = lo_hi
    return f"[{lo:.{digits}f}, {hi:.{digits}f}]"


def wci(p: float, n: int) -> str:
    return f"{ci(wilson(p, n))} (Wilson)"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


# -- the large SQuAD benchmark (issue 15) --------------------------------------------------------
def large() -> dict:
    return load("squad_large.json")


def large_cmd(d: dict) -> str:
    return f"`{d['command']}` (see docs/benchmarks.md)"


def large_sentences(d: dict) -> list[str]:
    """Where the funnel beats the best flat system and where it does not, from the JSON."""
    c = d["comparison"]
    f = c["funnel"]
    rows = d["systems_dev_a"]
    out = []
    for key, label in (("nearest_in_AR@4", "the flat system nearest in AR@4"),
                       ("nearest_in_time", "the flat system nearest in time"),
                       ("best_flat", "the best flat system")):
        if key not in c:
            continue
        x = c[key]
        diff = x["AR@4_difference"]
        mc = x["mcnemar_exact"]
        out.append(
            f"Against {label}, `{x['flat']}` (AR@4 {f3(x['AR@4_flat'])}, {x['seconds_p50_flat']:.2f} s/query), "
            f"the funnel chosen on train, `{f}` (AR@4 {f3(x['AR@4_funnel'])}, {x['seconds_p50_funnel']:.2f} s/query), "
            f"differs by **{diff['difference']:+.3f} AR@4** (paired bootstrap 95% {ci(diff['ci'])}; McNemar exact "
            f"p = {mc['p_value']:.3g}, {mc['a_only']} vs {mc['b_only']} discordant questions) at "
            f"**{x['time_ratio_funnel_over_flat']:.2f}x** the time.")
    # the same question in cross-encoder pairs per query (the cost that does not depend on the machine)
    allflat = {n: r for n, r in rows.items() if r["kind"] == "flat"}
    fr = rows[f]
    reach = [n for n in allflat if allflat[n]["AR@4"] >= fr["AR@4"]]
    if reach:
        cheapest = min(reach, key=lambda n: allflat[n]["pairs_per_query"])
        cr = allflat[cheapest]
        out.append(f"In cross-encoder pairs per query: the cheapest flat system with at least the funnel's AR@4 is "
                   f"`{cheapest}` (AR@4 {f3(cr['AR@4'])} with {cr['pairs_per_query']:.0f} pairs/query) against "
                   f"{fr['pairs_per_query']:.0f} pairs/query for `{f}` "
                   f"({fr['pairs_per_query'] / max(cr['pairs_per_query'], 1e-9):.1f}x the pairs).")
    else:
        best = max(allflat, key=lambda n: allflat[n]["AR@4"])
        out.append(f"No flat system reaches the funnel's AR@4 ({f3(fr['AR@4'])}); the best flat system is `{best}` "
                   f"({f3(allflat[best]['AR@4'])}, {allflat[best]['pairs_per_query']:.0f} pairs/query vs "
                   f"{fr['pairs_per_query']:.0f}).")
    # where does any funnel dominate any flat system?
    flats = {n: r for n, r in rows.items() if r["kind"] == "flat" and "seconds_p50" in r}
    funnels = {n: r for n, r in rows.items() if r["kind"] == "funnel" and "seconds_p50" in r}
    best_flat = max(flats, key=lambda n: flats[n]["AR@4"]) if flats else None
    if best_flat:
        bf = flats[best_flat]
        faster_equal = [n for n, r in funnels.items()
                        if r["AR@4_ci95"][1] >= bf["AR@4"] and r["seconds_p50"] < bf["seconds_p50"]]
        out.append(
            f"Highest AR@4 of any flat system: `{best_flat}` {f3(bf['AR@4'])} {ci(bf['AR@4_ci95'])}; of any funnel: "
            f"`{max(funnels, key=lambda n: funnels[n]['AR@4'])}` {f3(max(r['AR@4'] for r in funnels.values()))}. "
            + ("Funnels whose AR@4 interval reaches the best flat system's AR@4 at less time: "
               + ", ".join(f"`{n}` ({funnels[n]['seconds_p50'] / bf['seconds_p50']:.2f}x time)" for n in faster_equal)
               + "." if faster_equal else
               "No funnel configuration reaches the best flat system's AR@4 (within its interval) in less time."))
    return out


def block_large_readme() -> str:
    d = large()
    s = d["samples"]
    return "\n\n".join(large_sentences(d)) + (
        f"\n\n(SQuAD train + dev-a corpus, {d['corpus']['passages']:,} passages; {s['dev_a_report']:,} dev-a "
        f"questions for AR@4, {s['dev_a_timing']} for time; choices tuned on {s['train_tuning']} train questions; "
        "full table, plot and method in [docs/benchmarks.md](docs/benchmarks.md).)")


def block_large_systems() -> str:
    d = large()
    rows = d["systems_dev_a"]
    def natural(name: str):
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]

    order = sorted(rows, key=lambda n: ({"first stage": 0, "flat": 1, "funnel": 2}[rows[n]["kind"]], natural(n)))
    body = []
    for n in order:
        r = rows[n]
        fs = r["kind"] == "first stage"
        body.append([f"`{n}`", r["kind"]] + [f3(r[f"AR@{k}"]) for k in (1, 2, 3, 4)]
                    + [ci(r["AR@4_ci95"]), f3(r["AR@10"]) if fs else "", f3(r["AR@20"]) if fs else "",
                       f"{r['pairs_per_query']:.0f}",
                       f"{r['seconds_p50']:.3f}" if "seconds_p50" in r else "",
                       f"{r['seconds_p95']:.3f}" if "seconds_p95" in r else ""])
    s = d["samples"]
    head = (f"{s['dev_a_report']:,} dev-a questions (AR), {s['dev_a_timing']} timed; command: "
            f"{large_cmd(d)}. Best funnel chosen on {s['train_tuning']} train questions: "
            f"`{d['best_funnel_chosen_on_train']}`. Hybrid alpha (train): {d['hybrid']['alpha']}. "
            f"HNSW recall@100 vs exact search: {d['dense']['recall@100_hnsw_vs_exact']:.3f}."
            + (f" Times: `{d['timing_run']['command']}` (systems with no time were not timed; load average "
               f"{d['load_average_before_timing'][0]:.0f} before and {d['load_average_after_timing'][0]:.0f} after "
               "on the 2 shared cores)." if "timing_run" in d else "") + "\n\n")
    return head + md_table(["system", "kind", "AR@1", "AR@2", "AR@3", "AR@4", "AR@4 95% CI (bootstrap)",
                            "AR@10", "AR@20", "CE pairs/query", "s/query p50", "s/query p95"], body)


def block_large_comparison() -> str:
    return "\n".join(f"- {s}" for s in large_sentences(large()))


def block_large_cluster_recall() -> str:
    d = large()
    out = []
    for s, rows in d["cluster_recall_dev_a"].items():
        info = d["corpus"]["clusters"].get(s, {})
        out.append(f"**S = {s}** ({info.get('clusters', '?')} clusters, "
                   f"{info.get('mean_documents_per_cluster', float('nan')):.2f} documents each on average)\n")
        out.append(md_table(["K clusters", "documents", "answer recall, clusters", "95% CI (bootstrap)",
                             "flat BM25, same #docs", "flat dense, same #docs", "clusters - BM25 (paired 95% CI)"],
                            [[str(r["K"]), f"{r['mean_documents']:.1f}", f3(r["clusters"]), ci(r["clusters_ci95"]),
                              f3(r["flat_bm25_documents"]), f3(r["flat_dense_documents"]),
                              f"{r['clusters_minus_bm25']['difference']:+.3f} {ci(r['clusters_minus_bm25']['ci'])}"]
                             for r in rows]))
        out.append("")
    n = d["samples"]["dev_a_report"]
    return (f"Answer recall of the documents inside the top-K clusters vs the same number of documents from flat "
            f"BM25 over documents and from dense MiniLM (documents ranked by their best passage), {n:,} dev-a "
            f"questions; command: {large_cmd(d)}.\n\n" + "\n".join(out).rstrip())


def block_large_ce() -> str:
    t = load("squad_ce_training.json")
    curve = t.get("loss_curve", [])
    pts = ", ".join(f"{c['step']}: {c['loss']:.2f}" for c in curve[:: max(1, len(curve) // 8)])
    return md_table(["what", "value"], [
        ["init", t["init"]], ["training questions", f"{t['groups']:,} groups from {t['train_questions_sampled']:,} "
                                                    "sampled SQuAD train questions (the 400 tuning questions excluded)"],
        ["positives / negatives", f"{t['positives']}; {t['negatives']}"],
        ["steps, time", f"{t['steps']:,} steps, {t['train_seconds']:.0f} s ({t.get('gpu') or 'CPU'}, {t['dtype']})"],
        ["listwise loss, first / last 50 steps", f"{t['loss_first50']:.3f} / {t['loss_last50']:.3f} (chance ln 6 = 1.792)"],
        ["loss curve (step: loss)", pts],
        ["where", t.get("where_trained", "")],
        ["command", "; ".join(f"`{c}`" for c in t.get("commands", []))]])


# -- README rows from the other JSON files -------------------------------------------------------
def rows_readme() -> list[Row]:
    rows: list[Row] = []

    def add(fn: Callable[[], list[Row]], what: str) -> None:
        try:
            rows.extend(fn())
        except (FileNotFoundError, KeyError, TypeError, ValueError) as exc:
            print(f"report: left out {what}: {type(exc).__name__}: {exc}", file=sys.stderr)

    def squad_large_rows() -> list[Row]:
        d = large()
        r = d["systems_dev_a"]
        s = d["samples"]
        n = f"{s['dev_a_report']:,} dev-a q ({s['dev_a_timing']} timed)"
        best_flat = max((k for k in r if r[k]["kind"] == "flat"), key=lambda k: r[k]["AR@4"])
        bf = d["best_funnel_chosen_on_train"]
        preset = next(k for k in r if "preset" in k)
        out = []
        for name in dict.fromkeys([best_flat, "hybrid -> CE@10", "bm25 -> CE@20", bf, preset]):
            if name not in r:
                continue
            x = r[name]
            t = f", {x['seconds_p50']:.2f} s/query p50" if "seconds_p50" in x else ""
            out.append((f"large SQuAD corpus ({d['corpus']['passages']:,} passages): `{name}`",
                        f"AR@4 **{f3(x['AR@4'])}**, AR@1 {f3(x['AR@1'])}, {x['pairs_per_query']:.0f} CE pairs/query{t}",
                        n, ci(x["AR@4_ci95"]) + " (bootstrap)", large_cmd(d)))
        k5 = next((row for row in d["cluster_recall_dev_a"].get("4096", []) if row["K"] == 5), None)
        if k5:
            out.append(("large SQuAD corpus: answer recall in top-5 clusters (S=4096) vs flat BM25 documents",
                        f"{f3(k5['clusters'])} at {k5['mean_documents']:.1f} documents vs {f3(k5['flat_bm25_documents'])}",
                        f"{s['dev_a_report']:,} dev-a q", ci(k5["clusters_ci95"]) + " (bootstrap)", large_cmd(d)))
        return out

    def ce_rows() -> list[Row]:
        t = load("squad_ce_training.json")
        return [("MiniLM cross-encoder trained on SQuAD train (listwise, BM25 hard negatives)",
                 f"{t['steps']:,} steps, {t['train_seconds']:.0f} s on {t.get('gpu') or 'CPU'} ({t['dtype']}); "
                 f"loss {t['loss_first50']:.2f} -> {t['loss_last50']:.2f}", f"{t['groups']:,} train questions",
                 "n/a (training run)", "; ".join(f"`{c.split('#')[0].strip()}`" for c in t.get("commands", [])))]

    def bm25_rows() -> list[Row]:
        p = load("prerank.json")
        b = load("bm25.json")
        cmd = "`python benchmarks/bm25.py`".replace("bm25.py", "bench_bm25.py")
        m = p["flat_bm25"]
        out = [("flat BM25, SciFact test nDCG@10", f"**{m['ndcg@10']:.3f}** (published: BEIR {p['published']['bm25_beir']}, "
                f"Pyserini {p['published']['bm25_pyserini_flat']}); Recall@100 {m['recall@100']:.3f}",
                f"{p['queries']} test queries", "not recorded", cmd)]
        sp = b["speed_scifact"]["systems"]
        out.append(("BM25 queries/s vs LlamaIndex BM25 / LangChain community BM25 (SciFact)",
                    f"{sp['ours']['qps']:,.0f} vs {sp['llama_index_bm25']['qps']:,.0f} vs "
                    f"{sp['langchain_community']['qps']:.1f}", f"{sp['ours']['queries_timed']} / "
                    f"{sp['llama_index_bm25']['queries_timed']} / {sp['langchain_community']['queries_timed']} queries",
                    "not recorded (one timing run)", cmd))
        sy = b["speed_synthetic"]
        ss = sy["systems"]
        out.append((f"same, {sy['n_documents']:,} synthetic docs",
                    f"{ss['ours']['qps']:,.0f} vs {ss['llama_index_bm25']['qps']:,.0f} vs {ss['langchain_community']['qps']:.1f}",
                    f"{ss['ours']['queries_timed']} / {ss['llama_index_bm25']['queries_timed']} / "
                    f"{ss['langchain_community']['queries_timed']} queries", "not recorded (one timing run)", cmd))
        c = b["clustered"]
        k5 = next(r for r in c["recall_at_k_clusters"] if r["k_clusters"] == 5)
        out.append(("clustering SciFact (Algorithm 1, BM25 kNN, S=4096): recall of relevant docs in top-5 clusters",
                    f"{c['n_documents']:,} docs -> {c['n_clusters']} clusters; {k5['recall_clustered']:.3f} at "
                    f"{k5['mean_documents']:.0f} docs vs {k5['recall_flat_same_docs']:.3f} for flat BM25 at the same count",
                    "SciFact test queries (count not recorded in bm25.json)", "not recorded", cmd))
        for r in b.get("clustering_scale", []):
            out.append((f"clustering time, {r['n_documents']:,} synthetic docs (BM25 index + kNN graph + Algorithm 1)",
                        f"{r['total_seconds']:.1f} s ({r['bm25_index_seconds']:.0f} + {r['knn_graph_seconds']:.0f} + "
                        f"{r['algorithm1_seconds']:.0f} s)", "one run", "not recorded (one run)", cmd))
        return out

    def prerank_rows() -> list[Row]:
        out = []
        for name, cmd in (("prerank.json", "`python benchmarks/prerank_model.py --retrain && python benchmarks/bench_prerank.py --tune-fuse-on-train 100`"),
                          ("prerank_maxp100.json", "`python benchmarks/bench_prerank.py --window-words 100 --skip-throughput --fuse-weight 0.3 --out benchmarks/results/prerank_maxp100.json`")):
            p = load(name)
            dep = p["rerank"]["depths"]
            mx = " (MaxP, 100-word windows)" if p["rerank"].get("window_words") else ""
            out.append((f"SciFact-trained MiniLM cross-encoder{mx}: rerank BM25 top-10 / top-100, nDCG@10",
                        f"alone **{dep['10']['cross_encoder']['ndcg@10']:.3f} / {dep['100']['cross_encoder']['ndcg@10']:.3f}**; "
                        f"interpolated with BM25 (w 0.3) {dep['10']['interpolated_ce_bm25_w0.3']['ndcg@10']:.3f} / "
                        f"{dep['100']['interpolated_ce_bm25_w0.3']['ndcg@10']:.3f}; flat BM25 {p['flat_bm25']['ndcg@10']:.3f}",
                        f"{p['queries']} test queries", "not recorded", cmd))
        return out

    def funnel_rows() -> list[Row]:
        f = load("funnel.json")
        sq = f["squad"]
        n = sq["n_questions"]
        cmd = "`python benchmarks/bench_funnel.py --data ../shared/data`"
        out = [(f"small SQuAD corpus ({sq['n_passages']:,} passages, dev-a only), flat dense top-400 -> CE vs funnel "
                f"(SciFact-trained CE)",
                f"AR@4 flat {sq['flat']['AR@4']:.2f}, {sq['flat']['seconds_per_query']:.2f} s/query; funnel "
                f"{sq['funnel']['AR@4']:.2f}, {sq['funnel']['seconds_per_query']:.2f} s/query",
                f"{n} questions", f"flat {wci(sq['flat']['AR@4'], n)}; funnel {wci(sq['funnel']['AR@4'], n)}", cmd)]
        sc = f["scifact"]
        out.append(("SciFact test, flat dense top-400 passages -> CE vs funnel",
                    f"nDCG@10 flat {sc['flat']['ndcg@10']:.3f}, {sc['flat']['seconds_per_query']:.2f} s/query; funnel "
                    f"{sc['funnel']['ndcg@10']:.3f}, {sc['funnel']['seconds_per_query']:.2f} s/query",
                    f"{sc['n_queries']} queries", "not recorded", cmd))
        return out

    def hybrid_rows() -> list[Row]:
        h = load("hybrid.json")
        s = h["scifact"]
        res = s["results"]
        tuned = next(k for k in res if k.startswith(f"hybrid_alpha{s['best_alpha_minmax']}_minmax"))
        cmd = "`python benchmarks/bench_hybrid.py`"
        out = [("hybrid BM25 + MiniLM on SciFact test (alpha tuned on train)",
                f"nDCG@10 **{res[tuned]['test']['ndcg@10']:.3f}** vs BM25 {res['bm25']['test']['ndcg@10']:.3f}, dense "
                f"{res['dense_minilm']['test']['ndcg@10']:.3f}", f"{s['n_queries']['test']} test queries", "not recorded", cmd)]
        c = h["squad_compression"]
        n = c["n_questions_sampled"]
        r = c["results"]
        out.append(("extractive compression (SQuAD dev-a, BM25 top-5 paragraphs, ratio 0.4)",
                    f"answer recall {r['before']['answer_recall']:.3f} -> {r['after_bm25']['answer_recall']:.3f} (BM25 "
                    f"sentences), tokens x{r['after_bm25']['token_ratio_vs_before']:.2f}; random sentences "
                    f"{r['after_random']['answer_recall']:.3f}", f"{n} questions",
                    wci(r["after_bm25"]["answer_recall"], n), cmd))
        q = h["query_classifier"]
        out.append(("query classifier (labelled queries, 15 task types)", f"{q['folds']}-fold accuracy "
                    f"{q['cv_accuracy_mean']:.3f} +- {q['cv_accuracy_std']:.3f} (sd over folds)",
                    f"{q['n_examples']} queries", "sd over folds only", cmd))
        return out

    def mog_rows() -> list[Row]:
        m = load("mog.json")
        me = m["methods"]
        n = m["n_test_questions"]
        return [("Mix-of-Granularity on SQuAD dev-a (held-out half), AR@1",
                 f"level 1 {me['level_1']['AR@1']:.3f}, level 5 {me['level_5']['AR@1']:.3f}, MoG {me['mog']['AR@1']:.3f}, "
                 f"MoGG {me['mogg']['AR@1']:.3f}, AutoMerging {me['auto_merging']['AR@1']:.3f}", f"{n} questions",
                 f"MoG {wci(me['mog']['AR@1'], n)}", f"`{m['command'].split(' --data')[0]}`")]

    def fid_rows() -> list[Row]:
        f = load("fid.json")
        sp = f["speed"]["passages_per_second"]
        q = f["quality"]
        a = q["answer_recall"]
        return [("FiD attention scorer speed (50 passages x 130 tokens, CPU), passages/s",
                 f"MiniLM CE {sp['cross_encoder_minilm']:.2f}, FiD t5-small-sized {sp['t5-small-sized']:.2f}, t5-base-sized "
                 f"{sp['t5-base-sized']:.2f}", f"{f['speed']['repeats']} repeats", "not recorded", "`python benchmarks/bench_fid.py`"),
                ("decoder-only attention reranker (SmolLM2-135M), SQuAD AR@1",
                 f"{a['attention_calibrated@1']:.3f} vs BM25 order {a['bm25@1']:.3f}", f"{q['questions_done']} questions",
                 f"difference {ci(q['calibrated_vs_bm25']['bootstrap95'])} (bootstrap)", "`python benchmarks/bench_fid.py`")]

    def llm_rows() -> list[Row]:
        r = load("bench_rankrag.json")
        f = load("bench_fbrag.json")
        n = f["setup"]["questions"]
        a = f["answer_recall_at_kept"]
        return [("RankRAG with SmolLM2-135M, SciFact nDCG@10", f"{r['subset']['rankrag_ndcg@10']:.3f} vs BM25 "
                 f"{r['subset']['bm25_ndcg@10']:.3f}", f"{r['setup']['queries']} queries", "not recorded",
                 "`python benchmarks/bench_rankrag.py`"),
                ("FB-RAG with SmolLM2-135M, SQuAD answer recall (3 chunks kept)",
                 f"BM25 backward-only {a['backward_only_bm25']:.2f}, Ours-FB {a['ours_fb']:.2f}, Ours-F {a['ours_f']:.2f}",
                 f"{n} questions", f"Ours-FB {wci(a['ours_fb'], n)}", "`python benchmarks/bench_fbrag.py`")]

    for fn, what in ((squad_large_rows, "squad_large"), (ce_rows, "squad_ce_training"), (bm25_rows, "bm25"),
                     (prerank_rows, "prerank"), (funnel_rows, "funnel"), (hybrid_rows, "hybrid"),
                     (mog_rows, "mog"), (fid_rows, "fid"), (llm_rows, "rankrag/fbrag")):
        add(fn, what)
    return rows


def block_readme_table() -> str:
    return md_table(["what", "result", "sample", "95% interval", "command"], [list(r) for r in rows_readme()])


def block_clustering_scifact() -> str:
    b = load("bm25.json")
    p = load("prerank.json")
    c = b["clustered"]
    ss, sy = b["speed_scifact"]["systems"], b["speed_synthetic"]["systems"]
    rec = c["recall_at_k_clusters"]
    ks = " / ".join(str(r["k_clusters"]) for r in rec)
    rows = [["flat BM25, SciFact test nDCG@10 / Recall@100",
             f"{p['flat_bm25']['ndcg@10']:.3f} / {p['flat_bm25']['recall@100']:.3f} ({p['queries']} test queries)"],
            [f"queries/s, SciFact ({b['speed_scifact']['n_documents']:,} docs): ours / llama-index-retrievers-bm25 / LangChain community",
             f"{ss['ours']['qps']:,.0f} / {ss['llama_index_bm25']['qps']:,.0f} / {ss['langchain_community']['qps']:.1f} "
             f"({ss['ours']['queries_timed']} / {ss['llama_index_bm25']['queries_timed']} / {ss['langchain_community']['queries_timed']} queries timed, one run)"],
            [f"queries/s, {b['speed_synthetic']['n_documents']:,} synthetic docs",
             f"{sy['ours']['qps']:,.0f} / {sy['llama_index_bm25']['qps']:,.0f} / {sy['langchain_community']['qps']:.1f}"],
            [f"peak memory building the {b['speed_synthetic']['n_documents']:,}-doc index (tracemalloc)",
             f"{sy['ours']['peak_build_mib']:.0f} / {sy['llama_index_bm25']['peak_build_mib']:.0f} / "
             f"{sy['langchain_community']['peak_build_mib']:.0f} MiB"],
            ["SciFact clusters (S = 4096)", f"{c['n_clusters']} clusters for {c['n_documents']:,} docs "
             f"({c['compression']:.1f}x), {c['tokens_per_cluster']['mean']:,.0f} tokens each on average"],
            [f"recall of relevant docs in the top-{ks} clusters (interval not recorded)",
             " / ".join(f"{r['recall_clustered']:.3f}" for r in rec) + " (flat BM25 at the same number of docs: "
             + " / ".join(f"{r['recall_flat_same_docs']:.3f}" for r in rec) + ")"]]
    for r in b.get("clustering_scale", []):
        rows.append([f"clustering time, {r['n_documents']:,} synthetic docs (BM25 index + kNN graph + Algorithm 1)",
                     f"{r['total_seconds']:.1f} s"])
    return md_table(["measurement", "result"], rows)


def block_funnel_small_squad() -> str:
    f = load("funnel.json")
    sq = f["squad"]
    n = sq["n_questions"]
    rows = []
    for name, label in (("flat", sq["settings"]["flat"]), ("funnel", sq["settings"]["funnel"])):
        r = sq[name]
        rows.append([f"{name}: {label}"] + [f"{r[f'AR@{k}']:.2f}" for k in (1, 2, 3, 4)]
                    + [wci(r["AR@4"], n), f"{r['contextual_integrity@4']:.2f}", f"{r['seconds_per_query']:.2f}"])
    ratio = sq["ratio_funnel_over_flat"]
    rows.append(["ratio funnel / flat"] + [f"{ratio[f'AR@{k}']:.2f}" for k in (1, 2, 3, 4)] + ["", "",
                                                                                            f"{ratio['seconds_per_query']:.2f}"])
    return (f"SQuAD dev-a only ({n} questions; {sq['n_documents']} documents, {sq['n_passages']:,} passages, "
            f"{sq['n_clusters']} clusters); command: `python benchmarks/bench_funnel.py --data ../shared/data`\n\n"
            + md_table(["paradigm", "AR@1", "AR@2", "AR@3", "AR@4", "AR@4 95% interval",
                        "contextual integrity@4 (lower is better)", "seconds/query"], rows))



# -- cross-encoder runtimes on CPU (issue 19) ----------------------------------------------------
def block_ce_backends() -> str:
    d = load("ce_backends.json")
    st, runs = d["settings"], d["runtimes"]
    rows = []
    for name, r in runs.items():
        def num(key: str, fmt: str, r: dict = r) -> str:
            v = r.get(key)
            return "—" if v is None else format(v, fmt)
        rows.append([name, num("pairs_per_s", ".1f"), num("speedup_vs_torch_fp32", ".2f") + "x",
                     num("p50_query_seconds", ".2f"), num("p95_query_seconds", ".2f"),
                     num("max_abs_score_diff_vs_torch_fp32", ".2g"),
                     num("ndcg@10", ".4f"), num("ndcg@10_loss_vs_fp32", "+.4f"),
                     str(r.get("queries", "—")), "yes" if r.get("meets_target") else "no"])
    hw = d["hardware"]
    met = d["target"]["met_by"]
    lines = [md_table(["runtime", "pairs/s", "vs torch fp32", "p50 s/query", "p95 s/query",
                       "max abs score diff", "nDCG@10", "nDCG loss", "nDCG queries", "target met"],
                      rows), "",
             f"Speed: the first {st['timing_queries']} SciFact test queries (sorted ids), BM25 "
             f"top-{st['timing_depth']} each, every runtime, interleaved per query. nDCG@10: BM25 "
             f"top-{st['depth']} reranked (rest of the top-100 in BM25 order), over the test "
             f"queries counted in the table (of {d['queries']}), for "
             f"{', '.join(st['ndcg_runtimes'])}; loss measured "
             f"against {d['ndcg_reference']}. BM25 alone on all {d['queries']} queries: "
             f"{d['bm25_ndcg@10']:.4f} (this zero-shot model reranks below BM25: the table "
             "compares runtimes, not models). "
             f"{'Complete.' if d['complete'] else 'Run cut short: nDCG covers the queries counted in the table.'}",
             "",
             f"Model: `{d['model']['path']}` — {d['model']['note']}. max_length {st['max_length']}, "
             f"batch {st['batch_size']}, {st['backend']}; OpenVINO inference precision "
             f"{st['openvino_inference_precision']}.",
             "",
             f"Machine: {hw['cpu_model']}, {hw['cpus']} cores shared with other jobs, flags "
             f"{', '.join(hw['cpu_flags'])}; torch CPU capability {hw.get('torch_cpu_capability')}; "
             f"load average before {d['load_average_before'][0]:.1f}, after "
             f"{d['load_average_after'][0]:.1f}.",
             "",
             f"Target (>= {d['target']['speedup_vs_torch_fp32']:g}x torch fp32 pairs/s at <= "
             f"{d['target']['max_ndcg@10_loss']} nDCG@10 loss): "
             + (f"met by {', '.join(met)}." if met else "not met by any runtime in this run.")
             + f" `runtime=\"auto\"` picks `{d['cpu_auto_runtime']}` on a CPU.",
             "", f"Reproduce: `{d['command']}`"]
    return "\n".join(lines)

BLOCKS: dict[str, Callable[[], str]] = {
    "clustering-scifact": block_clustering_scifact,
    "funnel-small-squad": block_funnel_small_squad,
    "readme-table": block_readme_table,
    "large-summary": block_large_readme,
    "large-systems": block_large_systems,
    "large-comparison": block_large_comparison,
    "large-cluster-recall": block_large_cluster_recall,
    "large-ce": block_large_ce,
    "ce-backends": block_ce_backends,
}
FILES = [ROOT / "README.md", ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "clustering.md",
         ROOT / "docs" / "funnel.md", ROOT / "docs" / "performance.md"]
MARK = re.compile(r"(<!-- results:([a-z0-9-]+):begin -->\n)(.*?)(<!-- results:\2:end -->)", re.S)


def render(text: str) -> str:
    def sub(m: re.Match) -> str:
        name = m.group(2)
        if name not in BLOCKS:
            print(f"report: unknown block {name!r}; left as is", file=sys.stderr)
            return m.group(0)
        try:
            body = BLOCKS[name]()
        except (FileNotFoundError, KeyError, TypeError, ValueError, StopIteration) as exc:
            print(f"report: block {name!r} left as is ({type(exc).__name__}: {exc})", file=sys.stderr)
            return m.group(0)
        return m.group(1) + body.rstrip() + "\n" + m.group(4)

    return MARK.sub(sub, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="report stale blocks, write nothing")
    args = ap.parse_args(argv)
    stale = []
    for path in FILES:
        if not path.is_file():
            continue
        old = path.read_text(encoding="utf-8")
        new = render(old)
        if new != old:
            stale.append(path)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    for p in stale:
        print(f"{'stale' if args.check else 'updated'}: {p.relative_to(ROOT)}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
