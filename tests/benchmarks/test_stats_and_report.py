"""The results-table generator (benchmarks/report.py); the statistics are tested in tests/evaluation/.

Expected values are computed by hand from the definitions, not from the code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import report  # noqa: E402

from funnel_core.evaluation.stats import percentile  # noqa: E402


def test_percentile_and_wilson_by_hand():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([0, 10], 95) == pytest.approx(9.5)
    # Wilson 95% for 50/100: [0.4038, 0.5962] (textbook value)
    lo, hi = report.wilson(0.5, 100)
    assert lo == pytest.approx(0.4038, abs=1e-4) and hi == pytest.approx(0.5962, abs=1e-4)
    # 0/20: lower bound 0, upper 0.1611
    lo, hi = report.wilson(0.0, 20)
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(0.1611, abs=1e-4)


def test_render_rewrites_only_marked_blocks_and_is_idempotent(monkeypatch):
    monkeypatch.setitem(report.BLOCKS, "demo", lambda: "| a |\n|---|\n| 1 |")
    text = ("intro\n<!-- results:demo:begin -->\nold typed row\n<!-- results:demo:end -->\noutro\n"
            "<!-- results:nosuch:begin -->\nkept\n<!-- results:nosuch:end -->\n")
    once = report.render(text)
    assert "old typed row" not in once and "| 1 |" in once
    assert once.startswith("intro\n") and once.endswith("kept\n<!-- results:nosuch:end -->\n")
    assert report.render(once) == once


def test_committed_tables_are_up_to_date():
    """`python benchmarks/report.py` on the committed JSON changes nothing (no hand-typed drift)."""
    assert report.main(["--check"]) == 0


# -- the generated blocks, checked against the JSON read here, independently of the renderers --------
def cells(block: str) -> list[list[str]]:
    """The body rows of the (first) markdown table in ``block``, as stripped cells without bold."""
    lines = [ln for ln in block.splitlines() if ln.startswith("|")]
    return [[c.strip().strip("*") for c in ln.strip("|").split("|")] for ln in lines[2:]]


def test_every_marker_in_the_docs_has_a_renderer_and_renders():
    names = {m.group(2) for path in report.FILES for m in report.MARK.finditer(path.read_text(encoding="utf-8"))}
    # the tables this session moved out of hand-typing are among them
    assert {"prerank-scifact", "funnel-scifact", "cluster-scale",
            "large-summary"} <= names
    for name in names:
        assert name in report.BLOCKS, f"marker {name!r} has no renderer"
        assert report.BLOCKS[name]().strip()


def test_readme_rows_render_without_leaving_any_out(capsys):
    rows = report.rows_readme()
    assert "left out" not in capsys.readouterr().err
    assert len(rows) >= 10 and all(len(r) == 5 and r[4] for r in rows)   # every row names its command


def test_check_fails_on_a_block_that_cannot_render(monkeypatch, tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- results:broken:begin -->\nx\n<!-- results:broken:end -->\n", encoding="utf-8")

    def broken() -> str:
        raise KeyError("no such field")

    monkeypatch.setitem(report.BLOCKS, "broken", broken)
    monkeypatch.setattr(report, "FILES", [doc])
    assert report.main(["--check"]) == 1       # up to date as text, but not rendered from the JSON


@pytest.mark.parametrize("block, run, systems, metrics, key", [
    ("prerank-scifact", "scifact", report.PRERANK_SYSTEMS, ["ndcg@10", "recall@10", "recall@100"], "ndcg@10"),
    ("funnel-scifact", "scifact", report.FUNNEL_SYSTEMS, ["ndcg@10", "recall@10", "recall@100"], "ndcg@10"),
    ("squad-reader", "squad_reader", report.READER_SYSTEMS, ["AR@1", "AR@2", "EM@2", "F1@2"], "F1@2")])
def test_harness_blocks_are_the_json(block, run, systems, metrics, key):
    """docs/prerank.md, docs/funnel.md, docs/benchmarks.md: a row per system of the run, each metric and
    the paired difference against BM25 read back from the report by hand; the bold cell is the best."""
    from funnel_core.evaluation import Report

    d = Report.load(BENCH / "results" / run).to_dict()
    rows = {r[0]: r[1:] for r in cells(report.BLOCKS[block]())}
    for name, label in systems.items():
        for i, m in enumerate(metrics):
            s = d["summary"][name][m]
            assert rows[label][i] == f"{s['mean']:.3f} [{s['ci'][0]:.3f}, {s['ci'][1]:.3f}]"
        c = d["comparisons"].get(name, {}).get(key)
        assert rows[label][len(metrics)] == (f"{c['difference']:+.3f} [{c['ci'][0]:.3f}, {c['ci'][1]:.3f}]" if c else "")
    best = max(round(d["summary"][n][key]["mean"], 3) for n in systems)
    col = 1 + metrics.index(key)
    raw = [ln.strip("|").split("|")[col].strip() for ln in report.BLOCKS[block]().splitlines() if ln.startswith("|")][2:]
    assert all(c.startswith("**") == (float(c.strip("*").split()[0]) == best) for c in raw)


def test_postrank_fid_tables_are_the_json():
    """The FiD post-ranking tables of docs/postrank.md: cells read back from the JSON by hand."""
    import json
    d = json.loads((BENCH / "results" / "postrank_fid_minilm.json").read_text(encoding="utf-8"))
    rows = {r[0]: r[1:] for r in cells(report.BLOCKS["postrank-fid-schemes"]())}
    all_q = d["results_all_questions"]
    # scheme (ii): plain and "+ query" columns come from two different JSON keys
    assert rows["FiD (ii) max over layers"] == [
        f"{all_q['fid_max_layers']['AR@1']['mean']:.3f}", f"{all_q['fid_max_layers+query']['AR@1']['mean']:.3f}",
        f"{all_q['fid_max_layers']['AR@4']['mean']:.3f}", f"{all_q['fid_max_layers+query']['AR@4']['mean']:.3f}"]
    assert rows["BM25 order"] == [f"{all_q['bm25']['AR@1']['mean']:.3f}", "", f"{all_q['bm25']['AR@4']['mean']:.3f}", ""]
    ce = {r[0]: r[1:] for r in cells(report.BLOCKS["postrank-fid-ce"]())}
    x = d["with_cross_encoder"]["results"]["cross_encoder"]["AR@3"]
    assert ce["SQuAD cross-encoder (MiniLM, bench15)"][2] == f"{x['mean']:.3f} [{x['ci95'][0]:.3f}, {x['ci95'][1]:.3f}]"


def test_bold_best_and_seconds_by_hand():
    rows = [["a", "0.500 [0.1, 0.9]"], ["b", ""], ["c", "0.700"], ["d", "0.700 [0.6, 0.8]"]]
    assert [r[1] for r in report.bold_best(rows, [1])] == ["0.500 [0.1, 0.9]", "", "**0.700**", "**0.700 [0.6, 0.8]**"]
    assert report.secs(0.00065) == "0.00065" and report.secs(1.234) == "1.23"


def _scale_json(seconds: float, rss_mib: float) -> dict:
    row = {"n_documents": 1_000_000, "corpus": "synthetic", "load_average_at_start": [2.0, 2.0, 2.0],
           "step_seconds": {"bm25_index": 10.0, "knn_graph": seconds - 40.0, "algorithm1": 10.0,
                            "cluster_units": 10.0, "cluster_index": 10.0},
           "pipeline_seconds": seconds, "cpu_seconds": seconds, "peak_rss_mib": rss_mib, "n_clusters": 100}
    return {"target": {"n_documents": 1_000_000, "seconds": 600, "peak_rss_gib": 8},
            "runs": {"after": {"args": {"label": "after"}, "rows": [row]}}}


@pytest.mark.parametrize("seconds,rss_mib,time_word,mem_word", [(923.0, 5741.0, "misses", "meets"),
                                                                 (540.0, 9000.0, "meets", "misses")])
def test_cluster_scale_block_says_whether_the_target_is_met(monkeypatch, seconds, rss_mib, time_word, mem_word):
    monkeypatch.setattr(report, "load", lambda name: _scale_json(seconds, rss_mib))
    text = report.BLOCKS["cluster-scale"]()
    assert f"**{seconds:.0f} s** wall ({time_word} the 600 s target" in text
    assert f"**{rss_mib / 1024:.1f} GiB** peak RSS ({mem_word} the 8 GiB target)" in text
    assert "`knn_graph`" in text                                    # the slowest step is named


def _large(funnel_s: float, flat_fast_s: float, ci_equal_time: list[float]) -> dict:
    def sysrow(kind, ar4, s):
        return {"kind": kind, "AR@4": ar4, "seconds_p50": s, "pairs_per_query": 10.0 if kind == "flat" else 300.0,
                "AR@4_ci95": [ar4 - 0.01, ar4 + 0.01]}

    def comp(flat, ar_flat, s_flat):
        return {"flat": flat, "AR@4_funnel": 0.90, "AR@4_flat": ar_flat,
                "AR@4_difference": {"difference": 0.90 - ar_flat, "ci": ci_equal_time},
                "mcnemar_exact": {"p_value": 0.5, "a_only": 3, "b_only": 4},
                "seconds_p50_funnel": funnel_s, "seconds_p50_flat": s_flat,
                "time_ratio_funnel_over_flat": funnel_s / s_flat}

    return {"systems_dev_a": {"flat fast": sysrow("flat", 0.91, flat_fast_s), "flat slow": sysrow("flat", 0.95, 20.0),
                              "funnel A": sysrow("funnel", 0.90, funnel_s), "funnel B": sysrow("funnel", 0.80, 30.0)},
            "comparison": {"funnel": "funnel A",
                           "equal_AR@4": {**comp("flat fast", 0.91, flat_fast_s), "flat_reaches_funnel_AR@4": True},
                           "equal_time": {**comp("flat fast", 0.91, flat_fast_s), "flat_within_funnel_time": True}}}


def test_plain_summary_says_where_the_funnel_wins_and_loses():
    # funnel A: 0.90 in 1 s; the fastest flat system at >= 0.90 takes 2 s -> faster at equal AR@4, and no
    # flat system is at least as accurate in at most 1 s -> funnel A is listed; funnel B (0.80, 30 s) is not
    won = report.large_plain(_large(1.0, 2.0, [0.01, 0.03]))
    assert "**At equal AR@4 the funnel is faster**" in won[0] and "**0.50x the time**" in won[0]
    assert "the funnel is more accurate" in won[1]
    assert "`funnel A`" in won[2] and "`funnel B`" not in won[2]
    lost = report.large_plain(_large(10.0, 2.0, [-0.03, -0.01]))
    assert "slower" in lost[0] and "**5.00x the time**" in lost[0]
    assert "the funnel is less accurate" in lost[1]
    assert "none beats the flat systems" in lost[2]
    tie = report.large_plain(_large(10.0, 2.0, [-0.01, 0.01]))
    assert "no difference the sample can resolve" in tie[1]


def test_equal_accuracy_and_equal_time_partners_of_the_funnel():
    """squad_large_eval.comparisons: at equal AR@4 the fastest flat system with at least the funnel's AR@4;
    at equal time the most accurate flat system no slower than the funnel."""
    from types import SimpleNamespace

    import squad_large_eval as B

    qs = [SimpleNamespace(id=f"q{i}") for i in range(100)]
    hits = {"flat X": 92, "flat Y": 95, "flat Z": 93, "funnel F": 92}      # questions answered in the top-4
    secs = {"flat X": 1.0, "flat Y": 5.0, "flat Z": 20.0, "funnel F": 10.0}
    rows = {n: {"kind": n.split()[0], "AR@4": hits[n] / 100, "seconds_p50": secs[n]} for n in hits}
    ranks = {n: {q.id: (1 if i < hits[n] else 0) for i, q in enumerate(qs)} for n in hits}
    c = B.comparisons(rows, ranks, qs, "funnel F", n_boot=200)
    assert c["equal_AR@4"]["flat"] == "flat X" and c["equal_AR@4"]["flat_reaches_funnel_AR@4"]
    assert c["equal_AR@4"]["time_ratio_funnel_over_flat"] == pytest.approx(10.0)
    assert c["equal_time"]["flat"] == "flat Y" and c["equal_time"]["flat_within_funnel_time"]
    assert c["equal_time"]["AR@4_difference"]["difference"] == pytest.approx(-0.03)
    # a funnel faster than every flat system: the equal-time partner is the fastest flat one, flagged
    rows["funnel F"]["seconds_p50"] = 0.5
    c = B.comparisons(rows, ranks, qs, "funnel F", n_boot=200)
    assert c["equal_time"]["flat"] == "flat X" and not c["equal_time"]["flat_within_funnel_time"]


def test_harness_tables_are_the_json():
    """Cells of the tables rendered from the harness's reports equal the JSON, read independently."""
    from funnel_core.evaluation import Report

    res = BENCH / "results"
    f = Report.load(res / "scifact_fusion").to_dict()
    row = next(r for r in report.BLOCKS["hybrid-scifact"]().splitlines() if r.startswith("| RRF, k = 60"))
    s = f["summary"]["rrf60"]["ndcg@10"]
    assert f"| {s['mean']:.3f} [{s['ci'][0]:.3f}, {s['ci'][1]:.3f}] |" in row.replace("**", "")
    t = f["tuning"]["hybrid_tuned"]
    assert f"alpha = {t['chosen']}, chosen on the {t['questions']} questions" in report.BLOCKS["hybrid-scifact"]()
    m = Report.load(res / "mog").to_dict()
    chosen = m["router_training"]["paper_ties_finer"]["chosen_level_counts"]["paper_margin_0.5"]
    line = next(r for r in report.BLOCKS["mog-router"]().splitlines()
                if "router `paper_ties_finer`, selection `paper_margin_0.5`" in r)
    assert " / ".join(map(str, chosen)) in line
    assert f"| {m['summary']['router paper_ties_finer / paper_margin_0.5']['AR@1']['mean']:.3f} [" in line


def test_one_renderer_for_any_harness_report(tmp_path, monkeypatch):
    """harness_table on a report the harness wrote: means, intervals and paired differences from its
    summary, the best mean in bold, cost columns only when the run counted or timed them."""
    from funnel_core.evaluation import EvalDataset, evaluate
    from funnel_core.units import Unit

    ds = EvalDataset(queries={f"q{i}": f"q{i}" for i in range(4)}, answers={f"q{i}": ["yes"] for i in range(4)},
                     name="toy")
    hits = {"a": [1, 1, 0, 0], "b": [1, 1, 1, 0]}  # AR@1 0.5 and 0.75 by construction

    def system(name):
        return lambda q: [Unit(id=q, text="yes" if hits[name][int(q[1:])] else "no")]

    rep = evaluate({"a": system("a"), "b": system("b")}, ds, metrics=["AR@1"], n_timing=0, progress=False)
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "report.json").write_text(json.dumps({**rep.to_dict(), "command": "python toy.py"}))
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    out = report.harness_table("toy", labels={"b": "system B", "a": "system A"}, bold=["AR@1"], vs_baseline="AR@1")
    rows = cells(out)
    assert [r[0] for r in rows] == ["system B", "system A"]  # the labels' order
    ci_b = rep.summary["b"]["AR@1"]["ci"]
    assert rows[0][1] == f"0.750 [{ci_b[0]:.3f}, {ci_b[1]:.3f}]" and "**0.750" in out and "**0.500" not in out
    assert rows[0][2].startswith("+0.250 [") and rows[1][2] == ""  # b - a paired; a is the baseline
    assert "pairs/query" not in out and "s/query" not in out  # nothing scored, nothing timed
    assert "4 questions of `toy`" in out and "`python toy.py`" in out and "seconds not measured" in out
    what, result, n, interval, cmd = report.harness_row("toy", "toy row", ["AR@1"], {"b": "B", "a": "A"})
    assert result == "AR@1 **B 0.750**, A 0.500" and n == "4 questions" and cmd == "`python toy.py`"


def _harness_timing(load: float) -> dict:
    """A real harness report over two of squad_large.json's system names (fixed rankings, fake clock)."""
    from funnel_core.evaluation import EvalDataset, evaluate
    from funnel_core.units import Unit

    ds = EvalDataset(queries={"q1": "one", "q2": "two", "q3": "three"}, answers={q: ["x"] for q in ("q1", "q2", "q3")})
    now = [0.0]

    def system(cost):
        def run(query):
            now[0] += cost
            return [Unit(id="d", text="x")]
        return run

    rep = evaluate({"bm25": system(0.01), "bm25 -> CE@20": system(0.25)}, ds, metrics=["AR@4"], n_timing=3,
                   progress=False, load_reader=lambda: load, cores=2, clock=lambda: now[0], max_load=1.0)
    out = rep.to_dict()
    out["command"] = "python benchmarks/time_squad_large.py --n-timing 3"
    return out


def test_large_tables_take_their_seconds_from_the_harness_report():
    res = report.load("squad_large.json")
    merged = report.merge_timing(res, _harness_timing(load=0.4))
    rows = merged["systems_dev_a"]
    assert rows["bm25 -> CE@20"]["seconds_p50"] == pytest.approx(0.25)
    assert rows["bm25"]["seconds_p50"] == pytest.approx(0.01) and rows["bm25"]["timed_questions"] == 3
    # a system the harness did not time keeps no seconds from the older, differently measured run
    assert all("seconds_p50" not in r for n, r in rows.items() if n not in ("bm25", "bm25 -> CE@20"))
    assert merged["samples"]["dev_a_timing"] == 3 and merged["timing_run"]["cores"] == 2
    note = report.timing_note(merged)
    assert "over 3 dev-a questions" in note and "on 2 cores" in note and "0.4 before" in note
    assert rows["bm25"]["AR@4"] == res["systems_dev_a"]["bm25"]["AR@4"]  # quality untouched
    # withheld seconds (load 3.0 > max_load 1.0) change nothing
    assert report.merge_timing(res, _harness_timing(load=3.0)) == res
    with pytest.raises(ValueError, match="not an evaluation-harness report"):
        report.merge_timing(res, {"systems": {}})


def test_pareto_front_by_hand():
    # (cost, quality): b beats a on both; c is dearer but better; d ties c's quality at more cost
    pts = {"a": (10.0, 0.5), "b": (5.0, 0.6), "c": (30.0, 0.8), "d": (40.0, 0.8), "e": (5.0, 0.6)}
    assert report.pareto_front(pts) == ["b", "c", "e"]  # equal points do not dominate each other


def _whole_report(flat_ar1, fun_ar1, flat_pairs, fun_pairs, stages):
    n = len(flat_ar1)

    def recs(ar1):
        return [{"id": f"q{i}", "metrics": {"AR@1": float(v), "AR@4": 1.0}} for i, v in enumerate(ar1)]

    def summ(ar1):
        return {"AR@1": {"mean": sum(ar1) / n, "ci": [0.0, 1.0]}, "AR@4": {"mean": 1.0, "ci": [1.0, 1.0]}}

    return {"summary": {"flat": summ(flat_ar1), "fun": summ(fun_ar1)},
            "cost": {"flat": {"pairs_scored_per_query": flat_pairs}, "fun": {"pairs_scored_per_query": fun_pairs}},
            "per_question": {"flat": recs(flat_ar1), "fun": recs(fun_ar1)}, "stages": {"fun": stages}}


def test_whole_statement_says_the_difference_the_front_and_the_losing_stage():
    stages = [{"stage": "retrieval", "units_out_mean": 25.0, "answer_recall": 0.9},
              {"stage": "pre_ranking % 8", "units_out_mean": 8.0, "answer_recall": 0.6},
              {"stage": "later_chunking", "units_out_mean": 11.0, "answer_recall": 0.6},
              {"stage": "post_ranking % 4", "units_out_mean": 4.0, "answer_recall": 0.5}]
    # 40 questions: the flat system finds the answer at rank 1 for q0-q9, the funnel for q0-q29; the
    # paired differences are +1 on 20 questions and 0 on 20
    d = _whole_report([1] * 10 + [0] * 30, [1] * 30 + [0] * 10, 30.0, 40.0, stages)
    text = report.whole_statement(d, ["flat"], ["fun"])
    assert "minus the best flat system (`flat`, 0.250 at 30 pairs/query): +0.500 [" in text
    assert "the funnel is above the flat system" in text  # 20 of 40 paired +1: the interval excludes 0
    # equal cost: the flat system scores fewer pairs; equal quality at AR@1: none reaches the funnel
    assert "At equal cost (AR@1; flat systems scoring no more pairs per query than `fun`): the best is " \
           "`flat`; funnel minus it +0.500 [" in text
    assert "At equal quality (AR@1): no flat system reaches `fun`." in text
    # AR@4 ties at 1.0: the flat system is the cheapest at least as good
    assert "At equal quality (AR@4): the cheapest flat system at least as good as `fun` is `flat`, 1.000 at " \
           "30 pairs/query; the funnel scores 40 pairs per query." in text
    assert "front of AR@1 against pairs scored per query (cross-encoder pairs + FiD passages): `flat`, `fun`; " \
           "funnel configuration(s) on it: `fun`." in text
    # AR@4 ties at 1.0: the cheaper flat system dominates the funnel
    assert "front of AR@4 against pairs scored per query (cross-encoder pairs + FiD passages): `flat`; no funnel" in text
    assert "the largest loss is at pre_ranking % 8 (0.300)" in text
    # the same qualities with the flat system better: below, and off the front
    d = _whole_report([1] * 30 + [0] * 10, [1] * 10 + [0] * 30, 30.0, 40.0, stages)
    text = report.whole_statement(d, ["flat"], ["fun"])
    assert "-0.500 [" in text and "the funnel is below the flat system" in text
    assert "funnel configuration(s) on it" not in text


def test_readme_line_names_the_funnel_on_the_front_and_its_held_out_difference(monkeypatch):
    # main questions: the funnel answers 30 of 40 at rank 1, the best flat system 10: the funnel is on
    # the AR@1 front (dearer but better); held-out: the funnel 10, the flat system 30
    main = _whole_report([1] * 10 + [0] * 30, [1] * 30 + [0] * 10, 30.0, 40.0, [])
    held = _whole_report([1] * 30 + [0] * 10, [1] * 10 + [0] * 30, 30.0, 40.0, [])
    for d in (main, held):
        d["dataset"] = {"questions": 40, "corpus": 1234}
        for who in ("flat", "fun"):
            d["cost"][who]["seconds_p50"] = None
    monkeypatch.setattr(report, "WHOLE_FLAT", {"flat": "flat"})
    monkeypatch.setattr(report, "WHOLE_FUNNELS", {"fun": "funnel"})
    monkeypatch.setattr(report, "harness", lambda name: {"funnelrag_whole": main, "funnelrag_whole_heldout": held}[name])
    line = report.funnelrag_whole_readme()
    assert line.startswith("- **A funnel configuration is on the Pareto front here** (AR@1 or AR@4 against pairs "
                           "scored per query): `fun` at AR@1: 0.750 at 40 pairs/query, +0.500 [")
    assert "against the best flat system `flat` (0.250 at 30 pairs/query); on the held-out questions -0.500 [" in line
    assert "AR@4" not in line.split("): ", 1)[1].split(" (paired")[0]  # AR@4 ties: the cheaper flat system wins
    assert "40 SQuAD dev-a questions over 1,234 paragraphs" in line
    # no funnel on any front: the plain statement
    monkeypatch.setattr(report, "harness", lambda name: {"funnelrag_whole": held, "funnelrag_whole_heldout": main}[name])
    assert report.funnelrag_whole_readme().startswith(
        "- **The paper's funnel, measured whole, is not on the Pareto front here**")


# -- declared tables: templates over JSON -------------------------------------------------------------
DOC = {"runs": {"fast": {"qps": 1234.5, "ci": [0.1, 0.25]}, "slow": {"qps": 0.5}}, "n": 300, "flags": ["avx2", "fma"],
       "pairs": {"fast - slow": {"difference": 0.125, "ci": [0.01, 0.2]}}}


def test_template_reads_paths_root_key_and_named_formats():
    assert report.fill("{qps:,.1f} of {^n} ({key}: {label})", DOC["runs"]["fast"], DOC, "fast", "Fast") \
        == "1,234.5 of 300 (fast: Fast)"
    assert report.fill("{runs.*.qps:.2f}", DOC, DOC, "slow") == "0.50"              # * is the row's key
    assert report.fill("{pairs.* - slow:diff}", DOC, DOC, "fast") == "+0.125 [0.010, 0.200]"
    assert report.fill("{flags:join} / {flags:join+}", DOC, DOC) == "avx2, fma / avx2+fma"
    assert report.fill("{runs.fast.ci:ci} {runs.fast.ci:ci+.2f}", DOC, DOC) == "[0.100, 0.250] [+0.10, +0.25]"
    # a Wilson interval whose n is read from the file too (a nested field in the format spec)
    lo, hi = report.wilson(0.5, 300)
    assert report.fill("{x:wci{n}}", {"x": 0.5, "n": 300}) == f"[{lo:.3f}, {hi:.3f}] (Wilson)"


def test_template_shows_the_default_only_where_a_value_is_missing_and_raises_otherwise():
    """``{path|text}`` shows ``text`` unformatted where the value is missing or null; without ``|`` a missing
    field raises KeyError, so a renamed JSON field leaves its block out with a warning instead of a blank cell."""
    assert report.fill("{runs.slow.ci|—:ci}", DOC, DOC) == "—"
    assert report.fill("{runs.fast.ci|—:ci}", DOC, DOC) == "[0.100, 0.250]"
    assert report.fill("{runs.gone.qps|n/a:.1f}", DOC, DOC) == "n/a"
    with pytest.raises(KeyError):
        report.fill("{runs.slow.ci:ci}", DOC, DOC)


def test_table_rows_per_item_per_label_and_fixed(monkeypatch):
    monkeypatch.setattr(report, "load", lambda name: DOC)
    per_item = report.Table("x.json", ["run", "q/s (n = {n})"], [["`{key}`", "{qps:.1f}"]], each="runs",
                            note="{n} queries")()
    assert per_item == "300 queries\n\n| run | q/s (n = 300) |\n|---|---|\n| `fast` | 1234.5 |\n| `slow` | 0.5 |"
    picked = report.Table("x.json", ["run", "q/s"], [["{label}", "{qps:.0f}"]], each="runs", labels={"slow": "S"})()
    assert picked.splitlines()[2:] == ["| S | 0 |"]                    # labels pick and order the items
    over_file = report.Table("x.json", ["run", "q/s"], [["{label}", "{runs.*.qps:.0f}"]],
                             labels={"slow": "S", "fast": "F"}, after="\n\nend")()
    assert over_file.splitlines()[2:] == ["| S | 0 |", "| F | 1234 |", "", "end"]
    fixed = report.Table("x.json", ["what", "value"], [["n", "{n}"], ["flags", "{flags:join}"]])()
    assert fixed.splitlines()[2:] == ["| n | 300 |", "| flags | avx2, fma |"]


def test_template_chooses_counts_and_picks_list_items():
    doc = {"done": True, "none": None, "xs": [{"k": 1, "v": 0.5}, {"k": 5, "v": 0.25}], "loads": [0.5, 1.25]}
    assert report.fill("{done:if|yes|no} / {none:if|yes|no} / {none:na.2f} / {xs:len}", doc) == "yes / no / n/a / 2"
    assert report.fill("{xs.k=5.v:.2f} {loads:range.1f} {^done} {extra}", doc, doc, extra="x") == "0.25 0.5-1.2 True x"


def test_table_reads_a_part_and_leaves_out_a_table_without_rows(monkeypatch):
    monkeypatch.setattr(report, "load", lambda name: DOC)
    part = report.Table("x.json", ["q/s"], [["{qps:.1f}"]], at="runs", each=lambda runs: [runs["fast"]])()
    assert part.splitlines()[2:] == ["| 1234.5 |"]
    assert report.Table("x.json", ["q/s"], [["{qps}"]], at="no such part")() == ""
    assert report.Table("x.json", ["q/s"], [["{qps}"]], each=lambda d: [], note="a note")() == ""


def test_readme_rows_from_templates(monkeypatch):
    monkeypatch.setattr(report, "load", lambda name: DOC)
    rows = report.Table("x.json", (), [("fast run", "{runs.fast.qps:,.0f} q/s", "{n} queries", "not recorded",
                                        "`cmd`")]).rows()
    assert rows == [["fast run", "1,234 q/s", "300 queries", "not recorded", "`cmd`"]]
