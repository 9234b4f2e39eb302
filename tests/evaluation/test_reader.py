"""The reader column: SQuAD exact match and token F1 worked by hand, and evaluate(reader=...) asking
an LLM to answer from each system's top-k texts.

The reader here is a scripted provider (its answer is the first line of its context), so every
expected value is computed by hand; the real reader (the packaged SmolLM2, `[reader] model =
"smollm2"`) runs in benchmarks/configs/squad_reader.toml.
"""

from __future__ import annotations

import pytest

from funnel_core.evaluation import EvalDataset, evaluate, exact_match, token_f1
from funnel_core.evaluation.harness import READER_PROMPT
from funnel_core.llm import LLM
from funnel_core.units import Unit


def test_exact_match_by_hand():
    assert exact_match("The Eiffel Tower!", ["eiffel   tower"]) == 1.0      # case, article, punctuation
    assert exact_match("Eiffel", ["Eiffel Tower"]) == 0.0                    # a part is not a match
    assert exact_match("Paris", ["Lyon", "paris."]) == 1.0                   # any gold answer
    assert exact_match("", ["Paris"]) == 0.0


def test_token_f1_by_hand():
    # pred {big, red, dog} (article dropped) vs gold {red, dog, barked}: 2 shared, P = R = 2/3
    assert token_f1("the big red dog", ["red dog barked"]) == pytest.approx(2 / 3)
    # shared tokens are a multiset: x x y vs x y y share one x and one y (a set would give P = 1)
    assert token_f1("x x y", ["x y y"]) == pytest.approx(2 / 3)
    # P = 1/1, R = 1/4 -> F1 = 2 * 0.25 / 1.25 = 0.4; the best gold answer counts
    assert token_f1("Paris", ["Paris France capital city", "nothing"]) == pytest.approx(0.4)
    assert token_f1("Paris", ["London"]) == 0.0
    assert token_f1("", ["Paris"]) == 0.0 and token_f1("the", ["a"]) == 0.0    # empty after normalising


class FirstLine(LLM):
    """Answers with the first line of the context in its prompt, and keeps every prompt."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts: list[str] = []

    def _generate(self, prompts, *, n, temperature, top_p, top_k, max_new_tokens):
        self.prompts += prompts
        return [[p.split("Context:\n", 1)[1].split("\n", 1)[0] + "  "] * n for p in prompts]


DS = EvalDataset(queries={"q1": "capital of France?", "q2": "who wrote Hamlet?"},
                 answers={"q1": ["Paris"], "q2": ["William Shakespeare"]})
GOOD = {"capital of France?": ["Paris", "Lyon"], "who wrote Hamlet?": ["Shakespeare", "Hamlet is a play"]}
BAD = {q: list(reversed(texts)) for q, texts in GOOD.items()}


def _system(table):
    return lambda query: [Unit(id=f"{query}{i}", text=t) for i, t in enumerate(table[query])]


def test_evaluate_scores_the_readers_answer_from_each_systems_top_k():
    reader = FirstLine()
    r = evaluate({"good": _system(GOOD), "bad": _system(BAD)}, DS, metrics=["EM@1", "F1@1", "EM@2"],
                 reader=reader, n_timing=0, progress=False)
    # good's top-1 answers "Paris" (EM 1) and "Shakespeare" (EM 0; F1 = 2 * 1 * 0.5 / 1.5 = 2/3)
    assert r.summary["good"]["EM@1"]["mean"] == pytest.approx(0.5)
    assert r.summary["good"]["F1@1"]["mean"] == pytest.approx((1 + 2 / 3) / 2)
    # bad's top-1 is "Lyon" / "Hamlet is a play": nothing shared
    assert r.summary["bad"]["F1@1"]["mean"] == 0.0
    # k = 2 puts both texts in the context, each on its own paragraph, in rank order
    expected = READER_PROMPT.format(context="Lyon\n\nParis", question="capital of France?")
    assert expected in reader.prompts
    rec = next(x for x in r.per_question["good"] if x["id"] == "q2")
    assert rec["reader"]["answers"] == {"1": "Shakespeare", "2": "Shakespeare"}   # stripped
    # two reads (k = 1 and k = 2) per question and system, counted apart from the system's cost
    assert r.cost["good"]["reader_llm_calls_per_query"] == 2.0
    assert r.cost["good"]["llm_calls_per_query"] == 0.0
    assert r.comparisons["bad"]["EM@1"]["difference"] == pytest.approx(-0.5)


def test_reader_metrics_and_reader_go_together():
    with pytest.raises(ValueError, match="pass reader="):
        evaluate({"good": _system(GOOD)}, DS, metrics=["EM@1"], n_timing=0, progress=False)
    with pytest.raises(ValueError, match="add 'EM@k'"):
        evaluate({"good": _system(GOOD)}, DS, metrics=["AR@1"], reader=FirstLine(), n_timing=0, progress=False)
    with pytest.raises(ValueError, match="question"):
        evaluate({"good": _system(GOOD)}, DS, metrics=["EM@1"], reader=FirstLine(),
                 reader_prompt="{context} only", n_timing=0, progress=False)
    with pytest.raises(ValueError, match="needs a cut-off"):
        evaluate({"good": _system(GOOD)}, DS, metrics=["EM"], reader=FirstLine(), n_timing=0, progress=False)


def test_the_cache_keeps_the_readers_answers_and_recomputes_for_another_reader(tmp_path):
    reader = FirstLine()
    kw = dict(metrics=["EM@1"], n_timing=0, progress=False, cache_dir=tmp_path)
    first = evaluate({"good": _system(GOOD)}, DS, reader=reader, **kw)
    again = evaluate({"good": _system(GOOD)}, DS, reader=reader, **kw)
    assert len(reader.prompts) == 2                      # the second run read nothing: resumed
    assert again.summary == first.summary
    with pytest.warns(UserWarning, match=r"'good'.*other inputs \(differs in: reader\).*recomputing"):
        evaluate({"good": _system(GOOD)}, DS, reader=reader, reader_prompt="Q: {question}\nContext:\n{context}", **kw)
    assert len(reader.prompts) == 4                      # another prompt: read again, not resumed


def test_funnel_eval_reads_with_the_reader_table(squad_file, tiny_llama_path, tmp_path):
    """`[reader]` builds a TransformersLLM (here a tiny random llama: its answers are noise, the
    wiring is what is checked); run_config(reader=...) replaces it with any LLM."""
    from funnel_core.evaluation.config import run_config

    cfg = tmp_path / "e.toml"
    cfg.write_text('[dataset]\npath = "squad.json"\n[evaluate]\nmetrics = ["AR@1", "EM@1", "F1@1"]\nn_timing = 0\n'
                   f'output = "out"\n[systems.bm25]\ncomponent = "bm25"\nk = 2\n[reader]\nmodel = "{tiny_llama_path}"\n'
                   'max_new_tokens = 4\n')
    report, _ = run_config(cfg, progress=False)
    recs = report.per_question["bm25"]
    assert all(set(r["metrics"]) == {"AR@1", "EM@1", "F1@1"} and "1" in r["reader"]["answers"] for r in recs)
    assert report.to_dict()["config"]["reader"].startswith("TransformersLLM(")
    assert report.cost["bm25"]["reader_llm_calls_per_query"] == 1.0
    # FirstLine answers with bm25's whole top paragraph: never an exact match (a paragraph is longer
    # than its answer), some token F1 where the paragraph holds the answer
    scripted, _ = run_config(cfg, progress=False, reader=FirstLine(), output=tmp_path / "out2")
    assert scripted.summary["bm25"]["EM@1"]["mean"] == 0.0
    assert 0 < scripted.summary["bm25"]["F1@1"]["mean"] < 1
    cfg.write_text(cfg.read_text().replace(f'model = "{tiny_llama_path}"', 'modell = "x"'))
    with pytest.raises(ValueError, match=r"\[reader\]: needs `model`"):
        run_config(cfg, progress=False)


def test_a_fid_reader_reads_each_top_k_unit_as_one_passage(tiny_t5_path, tmp_path):
    """FiDReader through the harness: the answer is what the reader generates from the top-k units as
    k passages (compared with the scorer run by hand on those units), its passages are counted as the
    reader's cost, never the system's, and `[reader] kind = "fid"` builds it."""
    from funnel_core import counters
    from funnel_core.rerank.fid import FiDAttentionScorer, FiDReader

    units = {"q1": [Unit(id="a", text="Paris is the capital of France.", metadata={"title": "Paris"}),
                    Unit(id="b", text="Lyon is a city.", metadata={"title": "Lyon"}),
                    Unit(id="c", text="Nice is by the sea.", metadata={"title": "Nice"})],
             "q2": [Unit(id="d", text="Hamlet was written by William Shakespeare.", metadata={"title": "Hamlet"})]}
    reader = FiDReader(tiny_t5_path, max_answer_tokens=4, max_length=32, device="cpu")
    rep = evaluate({"s": lambda q: units["q1" if "France" in q else "q2"]}, DS, metrics=["EM@2", "F1@2"],
                   n_timing=0, progress=False, reader=reader)
    by_hand = FiDAttentionScorer(model=tiny_t5_path, return_answer=True, max_answer_tokens=4, max_length=32,
                                 device="cpu")
    for rec in rep.per_question["s"]:
        top = units[rec["id"]][:2]
        by_hand.rank(DS.queries[rec["id"]], top)
        assert rec["reader"]["answers"] == {"2": by_hand.last_answer}
        assert rec["reader"]["counts"]["fid_passages"] == len(top)   # 2 passages for q1, 1 for q2
        assert rec["counts"]["fid_passages"] == 0                    # the system scored nothing
    assert rep.cost["s"]["reader_fid_passages_per_query"] == 1.5
    before = counters.snapshot()
    assert reader.answer("anything", []) == "" and counters.snapshot() == before
    with pytest.raises(ValueError, match="FiDReader sets return_answer itself"):
        FiDReader(tiny_t5_path, return_answer=False)
    # the TOML way
    import json

    from funnel_core.evaluation.config import run_config

    (tmp_path / "squad.json").write_text(json.dumps({"data": [{"title": "Paris", "paragraphs": [
        {"context": "Paris is the capital of France.", "qas": [
            {"id": "q1", "question": "What is the capital of France?", "answers": [{"text": "Paris"}]}]}]}]}))
    cfg = tmp_path / "e.toml"
    body = ('[dataset]\npath = "squad.json"\n[evaluate]\nmetrics = ["EM@1"]\nn_timing = 0\noutput = "out"\n'
            '[systems.b]\ncomponent = "bm25"\n[reader]\nkind = "fid"\nmodel = "{m}"\nmax_length = 32\n{extra}')
    cfg.write_text(body.format(m=tiny_t5_path, extra="max_answer_tokens = 3\n"))
    report, _ = run_config(cfg, progress=False)
    assert "FiDReader(" in report.to_dict()["config"]["reader"]
    assert report.per_question["b"][0]["reader"]["counts"]["fid_passages"] == 1
    cfg.write_text(body.format(m=tiny_t5_path, extra='prompt = "{context} {question}"\n'))
    with pytest.raises(ValueError, match="reads passages, not a prompt"):
        run_config(cfg, progress=False)
    cfg.write_text(body.format(m=tiny_t5_path, extra="").replace('kind = "fid"', 'kind = "t5"'))
    with pytest.raises(ValueError, match="kind must be \"llm\""):
        run_config(cfg, progress=False)


def test_the_reader_table_names_the_packaged_smollm2():
    """`[reader] model = "smollm2"` is the packaged SmolLM2-135M-Instruct (its folder and GGUF file), with
    the table's other TransformersLLM settings; nothing is loaded while building."""
    from funnel_core.evaluation.config import build_reader
    from funnel_core.models import SMOLLM2_GGUF, smollm2_path

    reader, reading = build_reader({"model": "smollm2", "use_chat_template": False, "dtype": "float32",
                                    "max_new_tokens": 12, "prompt": "{context} {question}"}, "e.toml [reader]")
    assert (reader.model_name_or_path, reader.gguf_file) == (str(smollm2_path()), SMOLLM2_GGUF)
    assert (reader.use_chat_template, reader.dtype, reader.active_dtype) == (False, "float32", None)
    assert reading == {"reader_prompt": "{context} {question}", "reader_max_new_tokens": 12}
    assert build_reader({}, "e.toml [reader]") == (None, {})
