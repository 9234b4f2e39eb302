"""evaluate(): metric values worked by hand and against ranx, paired tests, round-robin timing,
the load-average refusal, the quiet check and resuming from the score cache.

Systems here are plain callables with fixed rankings, so every expected number is computed by
hand from the metric's definition.
"""

from __future__ import annotations

import math

import pytest

from funnel_core.evaluation import EvalDataset, evaluate, wait_for_quiet
from funnel_core.evaluation.report import Report
from funnel_core.units import Unit

pytestmark = pytest.mark.usefixtures("ranx_loaded")  # ranx loads once per process


def _u(doc: str, text: str = "", title: str | None = None) -> Unit:
    return Unit(id=doc, text=text or doc, metadata={"title": title or doc})


ANSWER_DS = EvalDataset(
    queries={"q1": "capital of France?", "q2": "who wrote Hamlet?", "q3": "what is BM25?"},
    answers={"q1": ["Paris"], "q2": ["Shakespeare"], "q3": ["ranking function"]},
)

# system "good": answer at rank 1, 2, never; titles of the top 3: A A B | A B C | A A A
GOOD = {
    "capital of France?": [_u("a", "Paris is a city", "A"), _u("b", "x", "A"), _u("c", "y", "B")],
    "who wrote Hamlet?": [_u("d", "a play", "A"), _u("e", "by William Shakespeare.", "B"), _u("f", "z", "C")],
    "what is BM25?": [_u("g", "ranking", "A"), _u("h", "function", "A"), _u("i", "w", "A")],
}
# system "bad": answer nowhere in the top 3
BAD = {q: [_u(f"{u.id}x", "nothing here", u.metadata["title"]) for u in us] for q, us in GOOD.items()}


def _fixed(table, log=None, name=None):
    def system(query):
        if log is not None:
            log.append((name, query))
        return [u.copy() for u in table[query]]
    return system


def test_answer_recall_and_contextual_integrity_by_hand():
    r = evaluate({"good": _fixed(GOOD), "bad": _fixed(BAD)}, ANSWER_DS, metrics=["AR@1", "AR@2", "CI@3"],
                 n_timing=0, progress=False)
    s = r.summary
    # AR@1: q1 only -> 1/3; AR@2: q1 and q2 ("...by William Shakespeare." is rank 2) -> 2/3.
    # q3: "ranking" and "function" sit in two units; the concatenation "ranking function" of
    # the top 2 contains the answer, as FunnelRAG's AR@k (answer in the top-k context) defines it.
    assert s["good"]["AR@1"]["mean"] == pytest.approx(1 / 3)
    assert s["good"]["AR@2"]["mean"] == pytest.approx(1.0)
    assert s["bad"]["AR@2"]["mean"] == 0.0
    # CI@3 = entropy of titles: {A,A,B} -> H(2/3,1/3); {A,B,C} -> log2 3; {A,A,A} -> 0
    h = -(2 / 3 * math.log2(2 / 3) + 1 / 3 * math.log2(1 / 3))
    assert s["good"]["CI@3"]["mean"] == pytest.approx((h + math.log2(3) + 0) / 3)
    per_q = {rec["id"]: rec["metrics"] for rec in r.per_question["good"]}
    assert per_q["q2"] == pytest.approx({"AR@1": 0.0, "AR@2": 1.0, "CI@3": math.log2(3)})
    # words@2: whitespace words of the top 2 texts; q1 "Paris is a city" + "x" = 4 + 1
    w = evaluate({"good": _fixed(GOOD)}, ANSWER_DS, metrics=["words@2"], n_timing=0, progress=False)
    assert [x["metrics"]["words@2"] for x in w.per_question["good"]] == [4 + 1, 2 + 3, 1 + 1]
    # an interval brackets the mean, and a constant metric has a zero-width interval
    lo, hi = s["good"]["AR@1"]["ci"]
    assert lo <= 1 / 3 <= hi and s["bad"]["AR@1"]["ci"] == [0.0, 0.0]
    # paired comparison against the baseline (the first system): bad - good on AR@2 = -1 on all 3
    # questions; exact McNemar with 0 vs 3 discordant: p = 2 * (1/2)^3 = 0.25
    cmp = r.comparisons["bad"]["AR@2"]
    assert cmp["difference"] == pytest.approx(-1.0) and cmp["ci"] == [-1.0, -1.0]
    assert cmp["mcnemar"] == {"a_only": 0, "b_only": 3, "p_value": pytest.approx(0.25)}
    assert "mcnemar" not in r.comparisons["bad"]["CI@3"]  # not a 0/1 metric
    assert "good" not in r.comparisons


QRELS_DS = EvalDataset(queries={"q1": "one", "q2": "two"},
                       qrels={"q1": {"d1": 1, "d2": 2}, "q2": {"d3": 1}})
# q1 ranks d1 (grade 1), d9 (0), d2 (grade 2); q2 ranks d4 (0) only
RUN = {"one": [_u("d1"), _u("d9"), _u("d2")], "two": [_u("d4")]}


@pytest.mark.slow  # ranx JIT-compiles its metrics with numba on first use in a process (10-25 s)
def test_ir_metrics_by_hand_and_against_ranx():
    r = evaluate({"s": _fixed(RUN)}, QRELS_DS, metrics=["ndcg@3", "recall@2", "mrr"], n_timing=0,
                 progress=False)
    per_q = {rec["id"]: rec["metrics"] for rec in r.per_question["s"]}
    # nDCG@3 of q1 (linear gains): DCG = 1/log2(2) + 0 + 2/log2(4) = 2; ideal: 2/log2(2) + 1/log2(3)
    ndcg_q1 = 2 / (2 + 1 / math.log2(3))
    assert per_q["q1"]["ndcg@3"] == pytest.approx(ndcg_q1)
    assert per_q["q1"]["recall@2"] == pytest.approx(0.5)  # d1 of {d1, d2} in the top 2
    assert per_q["q1"]["mrr"] == 1.0 and per_q["q2"] == {"ndcg@3": 0.0, "recall@2": 0.0, "mrr": 0.0}
    assert r.summary["s"]["ndcg@3"]["mean"] == pytest.approx(ndcg_q1 / 2)

    from ranx import Qrels, Run
    from ranx import evaluate as ranx_evaluate

    ref = ranx_evaluate(Qrels({"q1": {"d1": 1, "d2": 2}, "q2": {"d3": 1}}),
                        Run({"q1": {"d1": 3.0, "d9": 2.0, "d2": 1.0}, "q2": {"d4": 1.0}}),
                        ["ndcg@3", "recall@2", "mrr"])
    for m, v in ref.items():
        assert r.summary["s"][m]["mean"] == pytest.approx(float(v))


@pytest.mark.slow  # ranx (numba JIT)
def test_passages_of_one_document_count_once_at_its_best_rank():
    # passages carry metadata doc_id; d1's second passage must not push d2 down or count twice
    run = {"one": [Unit(id="d1#0", text="x", metadata={"doc_id": "d1"}),
                   Unit(id="d1#1", text="y", metadata={"doc_id": "d1"}),
                   Unit(id="d2#0", text="z", metadata={"doc_id": "d2"})], "two": []}
    r = evaluate({"s": _fixed(run)}, QRELS_DS, metrics=["recall@2"], n_timing=0, progress=False)
    rec = {x["id"]: x for x in r.per_question["s"]}
    assert rec["q1"]["ranked"] == ["d1", "d2"] and rec["q1"]["metrics"]["recall@2"] == 1.0
    assert rec["q2"]["metrics"]["recall@2"] == 0.0  # an empty ranking scores zero, not an error


def _timed_systems(log, clock_box, durations):
    def make(name):
        def system(query):
            log.append((name, query))
            clock_box[0] += durations[name]  # the fake clock advances by this system's cost
            return [_u("d1")]
        return system
    return {n: make(n) for n in durations}


def test_timing_is_round_robin_with_rotation_after_a_warm_up_per_system():
    ds = EvalDataset(queries={f"q{i}": f"question {i}" for i in range(6)},
                     answers={f"q{i}": ["d1"] for i in range(6)})
    log: list = []
    now = [0.0]
    durations = {"A": 1.0, "B": 2.0, "C": 4.0}
    r = evaluate(_timed_systems(log, now, durations), ds, metrics=["AR@1"], n_timing=3, timing_seed=1,
                 progress=False, load_reader=lambda: 0.1, cores=2, clock=lambda: now[0])
    quality, rest = log[:18], log[18:]
    assert sorted(quality) == sorted((n, f"question {i}") for n in "ABC" for i in range(6))
    warm, timed = rest[:3], rest[3:]
    sample = [q for q, _ in r.timing["order"][::3]]
    assert len(sample) == 3 and len(set(sample)) == 3
    warm_q = {q for _, q in warm}
    assert [n for n, _ in warm] == ["A", "B", "C"] and len(warm_q) == 1
    assert not warm_q & {ds.queries[q] for q in sample}  # the warm-up question is not timed
    # each question: every system once, back to back; the first system rotates A, B, C
    expected = [(n, ds.queries[q]) for q, order in zip(sample, ["ABC", "BCA", "CAB"]) for n in order]
    assert timed == expected
    assert [tuple(x) for x in r.timing["order"]] == [(q, n) for q, order in zip(sample, ["ABC", "BCA", "CAB"])
                                                      for n in order]
    for name, d in durations.items():
        assert r.cost[name]["seconds_p50"] == pytest.approx(d)
        assert r.cost[name]["seconds_p95"] == pytest.approx(d)
        assert r.cost[name]["timed_questions"] == 3
    assert r.timing["refused"] is None and r.timing["load1"]["max"] == 0.1


def test_timing_every_question_is_one_pass_that_also_gives_quality():
    log: list = []
    r = evaluate({"good": _fixed(GOOD, log, "good"), "bad": _fixed(BAD, log, "bad")}, ANSWER_DS,
                 metrics=["AR@2"], n_timing=3, progress=False, load_reader=lambda: 0.1, cores=2)
    # one warm-up each (on a timed question: there is no spare one), then 3 round-robin rounds
    assert len(log) == 2 + 6 and r.timing["one_pass"]
    assert log[2:] == [("good", "capital of France?"), ("bad", "capital of France?"),
                       ("bad", "who wrote Hamlet?"), ("good", "who wrote Hamlet?"),
                       ("good", "what is BM25?"), ("bad", "what is BM25?")]
    # the quality is what the two-phase run gives
    two = evaluate({"good": _fixed(GOOD), "bad": _fixed(BAD)}, ANSWER_DS, metrics=["AR@2"], n_timing=0,
                   progress=False)
    assert r.per_question == two.per_question and r.summary["good"]["AR@2"]["mean"] == 1.0


def test_timing_threads_hold_while_timing_and_are_restored_after():
    torch = pytest.importorskip("torch")
    ds = EvalDataset(queries={f"q{i}": f"question {i}" for i in range(4)},
                     answers={f"q{i}": ["d1"] for i in range(4)})
    seen: list[int] = []

    def system(query):
        seen.append(torch.get_num_threads())
        return [_u("d1")]

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        r = evaluate({"s": system}, ds, metrics=["AR@1"], n_timing=2, progress=False, load_reader=lambda: 0.1,
                     cores=2, timing_threads=1)
        # quality (4 questions) at the process's 2 threads; warm-up and the 2 timed questions at 1
        assert seen == [2, 2, 2, 2, 1, 1, 1] and torch.get_num_threads() == 2
        assert r.timing["threads"] == 1
        assert evaluate({"s": system}, ds, metrics=["AR@1"], n_timing=1, progress=False, load_reader=lambda: 0.1,
                        cores=2).timing["threads"] is None
    finally:
        torch.set_num_threads(before)
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="timing_threads must be an integer >= 1"):
            evaluate({"s": system}, ds, metrics=["AR@1"], n_timing=1, progress=False, timing_threads=bad)


def test_seconds_are_refused_when_the_load_average_exceeds_the_cores():
    ds = EvalDataset(queries={"q1": "one", "q2": "two"}, answers={"q1": ["d1"], "q2": ["d1"]})
    loads = iter([0.5, 0.5, 3.5, 0.5])  # before the run, before each timed query, after
    r = evaluate({"s": lambda q: [_u("d1")]}, ds, metrics=["AR@1"], n_timing=2, progress=False,
                 load_reader=lambda: next(loads, 0.5), cores=2)
    assert r.cost["s"]["seconds_p50"] is None and r.cost["s"]["seconds_p95"] is None
    assert "3.50" in r.timing["refused"] and "2" in r.timing["refused"]
    assert r.cost["s"]["timed_questions"] == 2  # the records are kept, only the seconds withheld
    assert r.summary["s"]["AR@1"]["mean"] == 1.0
    md = r.to_markdown()
    assert "seconds withheld" in md and "| — | — |" in md
    # the same run at a load within the cores gives seconds; a stricter max_load refuses again
    ok = evaluate({"s": lambda q: [_u("d1")]}, ds, metrics=["AR@1"], n_timing=2, progress=False,
                  load_reader=lambda: 1.5, cores=2)
    assert ok.cost["s"]["seconds_p50"] is not None and ok.timing["refused"] is None
    strict = evaluate({"s": lambda q: [_u("d1")]}, ds, metrics=["AR@1"], n_timing=2, progress=False,
                      load_reader=lambda: 1.5, cores=2, max_load=1.0)
    assert strict.cost["s"]["seconds_p50"] is None


def test_quiet_check_waits_for_the_load_to_fall_and_gives_up_after_its_timeout():
    slept: list[float] = []
    loads = iter([4.0, 3.0, 0.8])
    res = wait_for_quiet(1.0, timeout=100, poll=10, load_reader=lambda: next(loads), sleep=slept.append)
    assert res["quiet"] and res["load1"] == 0.8 and slept == [10, 10] and res["waited_s"] == 20
    slept.clear()
    res = wait_for_quiet(1.0, timeout=25, poll=10, load_reader=lambda: 5.0, sleep=slept.append)
    assert not res["quiet"] and slept == [10, 10, 5] and res["waited_s"] == 25


def test_the_quiet_start_and_the_refusal_limit_are_separate():
    # a run's own threads raise the load average: start only below 0.5, refuse only above the 2 cores
    r = evaluate({"s": lambda q: [_u("d1")]}, ANSWER_DS, metrics=["AR@1"], n_timing=2, progress=False,
                 load_reader=lambda: 1.5, cores=2, quiet_check=True, quiet_load=0.5, quiet_timeout=0.02,
                 quiet_poll=0.01)
    qc = r.timing["quiet_check"]
    assert qc["quiet"] is False and qc["max_load"] == 0.5 and qc["waited_s"] == pytest.approx(0.02)
    assert r.timing["refused"] is None and r.cost["s"]["seconds_p50"] is not None


def test_an_interrupted_run_resumes_from_the_score_cache(tmp_path):
    ds = EvalDataset(queries={f"q{i}": f"question {i}" for i in range(5)},
                     answers={f"q{i}": [f"answer{i}"] for i in range(5)})

    def good(query):
        i = query.split()[-1]
        return [_u(f"d{i}", f"the answer{i} is here")]

    calls: list[str] = []

    def crashing(query):
        calls.append(query)
        if len(calls) == 4:
            raise KeyboardInterrupt  # the user presses Ctrl-C during question 4
        return good(query)

    with pytest.raises(KeyboardInterrupt):
        evaluate({"s": crashing}, ds, metrics=["AR@1"], n_timing=0, cache_dir=tmp_path, progress=False)
    files = list(tmp_path.glob("*.jsonl"))
    assert len(files) == 1 and len(files[0].read_text().splitlines()) == 1 + 3  # header + 3 questions

    resumed: list[str] = []
    r = evaluate({"s": lambda q: resumed.append(q) or good(q)}, ds, metrics=["AR@1"], n_timing=0,
                 cache_dir=tmp_path, progress=False)
    assert resumed == ["question 3", "question 4"]  # only the unfinished questions run again
    fresh = evaluate({"s": good}, ds, metrics=["AR@1"], n_timing=0, progress=False)
    assert r.per_question == fresh.per_question and r.summary["s"]["AR@1"]["mean"] == 1.0
    # a cache written for other settings is not reused (recomputed, with a warning), never mixed in
    again: list[str] = []
    with pytest.warns(UserWarning, match=r"'s'.*other inputs \(differs in: depth, metrics\).*recomputing"):
        evaluate({"s": lambda q: again.append(q) or good(q)}, ds, metrics=["AR@2"], n_timing=0,
                 cache_dir=tmp_path, progress=False)
    assert len(again) == 5


def test_counts_come_from_the_stages_not_from_an_estimate():
    from funnel_core.bm25 import BM25Index, BM25Retrieve
    from funnel_core.funnel import Funnel
    from funnel_core.rerank.bm25 import BM25Scorer

    corpus = [Unit(id=f"d{i}", text=t, metadata={"title": f"T{i}"}) for i, t in enumerate(
        ["paris is in france", "berlin is in germany", "rome is in italy", "madrid is in spain",
         "paris has the eiffel tower"])]
    ds = EvalDataset(queries={"q1": "where is paris", "q2": "where is rome"},
                     answers={"q1": ["france"], "q2": ["italy"]})
    index = BM25Index().index(corpus)
    funnel = Funnel([BM25Retrieve(index, k=3), BM25Scorer() % 2])
    r = evaluate({"bm25": BM25Retrieve(index, k=3), "funnel": funnel}, ds, metrics=["AR@1"], n_timing=0,
                 progress=False)
    # BM25Retrieve returns only the documents matching a query term; the scorer sees all of them
    hits = {q: len(index.search(text, k=3)) for q, text in ds.queries.items()}
    assert r.cost["funnel"]["pairs_scored_per_query"] == pytest.approx(sum(hits.values()) / 2)
    assert r.cost["funnel"]["model_calls_per_query"] == 1.0
    assert r.cost["bm25"]["pairs_scored_per_query"] == 0.0
    assert [x["counts"]["pairs_scored"] for x in r.per_question["funnel"]] == [hits["q1"], hits["q2"]]


def test_report_round_trips_and_renders(tmp_path):
    r = evaluate({"good": _fixed(GOOD), "bad": _fixed(BAD)}, ANSWER_DS, metrics=["AR@1", "CI@3"],
                 n_timing=2, progress=False, load_reader=lambda: 0.2, cores=4)
    paths = r.save(tmp_path, plot=False)
    back = Report.load(tmp_path)
    assert back.to_dict() == r.to_dict()
    d = r.to_dict()
    for key in ("machine", "versions", "load_average_before", "load_average_after", "cores_available"):
        assert key in d
    assert d["cores_available"] == 4 and d["versions"]["python"]
    md = paths["markdown"].read_text()
    assert md.splitlines()[0].startswith("| system | AR@1 | CI@3 |") and "| good | 0.333 [" in md
    with pytest.raises(ValueError, match="not an evaluation report"):
        Report({"summary": {}})
    # to_dict copies (a caller's edit leaves the report as it was); copy=False hands out the data itself
    d["summary"]["good"]["AR@1"]["mean"] = -1.0
    assert back.to_dict() == r.to_dict() and r.to_dict()["summary"]["good"]["AR@1"]["mean"] != -1.0
    own = back.to_dict(copy=False)
    assert own is back.to_dict(copy=False) and own == r.to_dict()
    lean = back.to_dict(per_question=False, copy=False)
    assert "per_question" not in lean and "per_question" in back.to_dict(copy=False)


@pytest.mark.slow  # matplotlib import and rendering (2-4 s)
def test_pareto_plot_is_written_with_both_cost_axes(tmp_path):
    r = evaluate({"good": _fixed(GOOD), "bad": _fixed(BAD)}, ANSWER_DS, metrics=["AR@2"], n_timing=2,
                 progress=False, load_reader=lambda: 0.2, cores=4)
    from matplotlib import image

    png = image.imread(r.plot(tmp_path / "p.png"))
    assert png.shape[1] > 1.8 * png.shape[0]  # two panels side by side: seconds and pairs
    refused = evaluate({"good": _fixed(GOOD)}, ANSWER_DS, metrics=["AR@2"], n_timing=2, progress=False,
                       load_reader=lambda: 9.0, cores=4)
    png = image.imread(refused.plot(tmp_path / "q.png"))
    assert png.shape[1] < 1.5 * png.shape[0]  # no seconds to plot: the pairs panel only


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="needs relevance judgements"):
        evaluate({"s": _fixed(GOOD)}, ANSWER_DS, metrics=["ndcg@10"], n_timing=0, progress=False)
    with pytest.raises(ValueError, match="needs gold answer strings"):
        evaluate({"s": _fixed(RUN)}, QRELS_DS, metrics=["AR@5"], n_timing=0, progress=False)
    with pytest.raises(ValueError, match="needs a cut-off"):
        evaluate({"s": _fixed(GOOD)}, ANSWER_DS, metrics=["AR"], n_timing=0, progress=False)
    with pytest.raises(ValueError, match="baseline 'x' is not among"):
        evaluate({"s": _fixed(GOOD)}, ANSWER_DS, baseline="x", n_timing=0, progress=False)
    with pytest.raises(TypeError, match="LlamaIndex retriever"):
        evaluate({"s": 42}, ANSWER_DS, n_timing=0, progress=False)
    with pytest.raises(TypeError, match="at rank 1"):
        evaluate({"s": lambda q: [3.5]}, ANSWER_DS, n_timing=0, progress=False)


def test_a_compressed_report_loads_back_equal(tmp_path):
    from funnel_core.evaluation import EvalDataset, Report, evaluate
    from funnel_core.units import Unit

    ds = EvalDataset(queries={"q1": "a", "q2": "b"}, answers={"q1": ["x"], "q2": ["y"]})
    rep = evaluate({"s": lambda q: [Unit(id=q, text="x")]}, ds, metrics=["AR@1"], n_timing=0, progress=False)
    rep.save(tmp_path, plot=False)
    paths = rep.save(tmp_path, plot=False, compress=True)
    assert paths["json"].name == "report.json.gz" and not (tmp_path / "report.json").exists()  # no stale twin
    assert Report.load(tmp_path).to_dict() == rep.to_dict() == Report.load(paths["json"]).to_dict()
    assert Report.load(tmp_path).summary["s"]["AR@1"]["mean"] == 0.5


def test_quiet_check_each_waits_before_every_timed_query():
    """quiet_check='each': the load is read until quiet before every query, so every recorded
    load is within quiet_load although the run's own queries push it up."""
    state = {"load": 0.5}

    def load():
        value = state["load"]
        state["load"] = 0.5 if value > 1.0 else value  # one poll after a query: quiet again
        return value

    def busy(query):  # every query raises the load average above the limit
        state["load"] = 1.8
        return [_u("d1")]

    r = evaluate({"a": busy, "b": busy}, ANSWER_DS, metrics=["AR@1"], n_timing=3, progress=False,
                 load_reader=load, cores=2, max_load=1.0, quiet_check="each", quiet_load=1.0,
                 quiet_poll=0.001)
    records = r.timing["records"]
    assert len(records) == 6 and all(rec["load1"] <= 1.0 for rec in records)
    assert all(rec["waited_s"] > 0 for rec in records[1:])  # after the warm-up and each query
    assert r.timing["refused"] is None and r.cost["a"]["seconds_p50"] is not None
    # without it the same run records the raised load and refuses the seconds
    state["load"] = 0.5
    plain = evaluate({"a": busy, "b": busy}, ANSWER_DS, metrics=["AR@1"], n_timing=3, progress=False,
                     load_reader=lambda: state["load"], cores=2, max_load=1.0)
    assert plain.timing["refused"] and plain.cost["a"]["seconds_p50"] is None
    with pytest.raises(ValueError, match="'each'"):
        evaluate({"a": busy}, ANSWER_DS, metrics=["AR@1"], n_timing=1, progress=False, quiet_check="every")


def test_a_funnel_records_what_each_stage_kept_and_whether_the_answer_survived():
    from funnel_core.bm25 import BM25Index, BM25Retrieve
    from funnel_core.funnel import Funnel
    from funnel_core.rerank.bm25 import BM25Scorer

    corpus = [Unit(id=f"d{i}", text=t, metadata={"title": f"T{i}"}) for i, t in enumerate(
        ["paris is in france", "paris paris paris is a city", "rome is in italy", "berlin is in germany"])]
    # q1: BM25 retrieval finds both paris documents; the cut % 1 keeps the one that repeats "paris",
    # which lacks the answer: retrieval has it, the reranking stage loses it
    ds = EvalDataset(queries={"q1": "paris", "q2": "rome italy"}, answers={"q1": ["france"], "q2": ["italy"]})
    index = BM25Index().index(corpus)
    funnel = Funnel([BM25Retrieve(index, k=3), BM25Scorer() % 1])
    r = evaluate({"bm25": BM25Retrieve(index, k=1), "funnel": funnel}, ds, metrics=["AR@1"], n_timing=0,
                 progress=False)
    per_q = {x["id"]: x["stages"] for x in r.per_question["funnel"]}
    assert [s["answer_recall"] for s in per_q["q1"]] == [1.0, 0.0]
    assert [s["answer_recall"] for s in per_q["q2"]] == [1.0, 1.0]
    assert [s["units_out"] for s in per_q["q1"]] == [2, 1]
    trace = r.stages["funnel"]
    assert [x["answer_recall"] for x in trace] == [1.0, 0.5] and [x["units_out_mean"] for x in trace] == [1.5, 1.0]
    assert "bm25" not in r.stages and "stages" not in r.per_question["bm25"][0]  # one stage: no trace
    assert "funnel per stage" in r.to_markdown() and "(answer in 0.500)" in r.to_markdown()
