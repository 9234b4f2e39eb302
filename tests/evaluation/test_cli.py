"""`funnel eval CONFIG.toml` end to end on a tiny SQuAD file, and its configuration errors."""

from __future__ import annotations

import json

import pytest

from funnel_core.cli import main
from funnel_core.evaluation import Report, load_dataset
from funnel_core.evaluation.config import load_config

pytestmark = pytest.mark.usefixtures("ranx_loaded")  # ranx loads once per process


def _toml(tmp_path, model: str, extra: str = "") -> str:
    path = tmp_path / "eval.toml"
    path.write_text(f"""
[dataset]
path = "squad.json"

[evaluate]
metrics = ["AR@1", "AR@2", "CI@2"]
baseline = "bm25"
n_timing = 2
max_load = 1000.0
output = "out"

[systems.bm25]
component = "bm25"
k = 2

[systems.clustered]
component = "clustered"
k = 2
max_tokens = 64

[systems.bm25_ce]
component = "bm25"
k = 4
rerank = {{ model = "{model}", top_n = 2, batch_size = 4 }}
{extra}
""")
    return str(path)


def test_funnel_eval_writes_json_markdown_and_png(squad_file, tiny_cross_encoder_path, tmp_path, capsys):
    config = _toml(tmp_path, tiny_cross_encoder_path)
    assert main(["eval", config, "--no-progress"]) == 0
    out = tmp_path / "out"
    assert {p.name for p in out.iterdir()} >= {"report.json", "report.md", "pareto.png", "cache"}
    report = Report.load(out)
    assert report.systems == ["bm25", "clustered", "bm25_ce"] and report.baseline == "bm25"
    d = report.to_dict()
    assert d["summary"]["bm25"]["AR@2"]["n"] == 6 and len(d["per_question"]["bm25_ce"]) == 6
    assert d["cost"]["bm25_ce"]["model_calls_per_query"] == 1.0 and d["cost"]["bm25"]["pairs_scored_per_query"] == 0
    assert d["cost"]["bm25"]["seconds_p50"] is not None  # max_load = 1000: never refused
    # the bm25 system's AR@2 is the AR@2 of a BM25 index built directly over the corpus
    from funnel_core.bm25 import BM25Index
    from funnel_core.evaluation import answer_recall

    ds = load_dataset(tmp_path / "squad.json")
    index = BM25Index().index(ds.corpus)
    expected = sum(answer_recall(index.search(q, k=2), ds.answers[i], 2) for i, q in ds.queries.items()) / 6
    assert d["summary"]["bm25"]["AR@2"]["mean"] == pytest.approx(expected)
    printed = capsys.readouterr().out
    assert "| bm25 |" in printed and "report.json" in printed
    # a second run resumes from the cache: same per-question results, nothing recomputed (the CE's
    # ONNX export written into its folder is not a change of model)
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert main(["eval", config, "--no-progress", "--n-timing", "0"]) == 0
    assert not [w for w in seen if "score cache" in str(w.message)]
    again = json.loads((out / "report.json").read_text())
    assert again["per_question"] == d["per_question"]


def test_configuration_errors_name_the_fix(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[dataset]\npath = "x.json"\n[systems.a]\ncomponent = "bm26"\n')
    with pytest.raises(ValueError, match=r"component must be one of .*'bm25'.*got 'bm26'"):
        load_config(bad)
    bad.write_text('[dataset]\npath = "x.json"\nsplitt = "dev"\n[systems.a]\ncomponent = "bm25"\n')
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['splitt'\]"):
        load_config(bad)
    bad.write_text('[dataset]\n[systems.a]\ncomponent = "bm25"\n')
    assert main(["eval", str(bad)]) == 1
    assert "needs `path`" in capsys.readouterr().err


def test_an_unknown_component_setting_is_refused(squad_file, tmp_path, capsys):
    cfg = tmp_path / "e.toml"
    cfg.write_text('[dataset]\npath = "squad.json"\n[evaluate]\nn_timing = 0\n'
                   '[systems.a]\ncomponent = "bm25"\nkk = 3\n')
    assert main(["eval", str(cfg), "--no-progress"]) == 1
    assert "[systems.a]" in capsys.readouterr().err


def test_the_benchmark_configurations_load():
    from pathlib import Path

    configs = sorted((Path(__file__).resolve().parents[2] / "benchmarks" / "configs").glob("*.toml"))
    assert configs
    for path in configs:
        cfg = load_config(path)
        assert cfg["systems"] and Path(cfg["dataset"]["path"]).is_absolute()


def _beir_two_splits(folder):
    """One query text in both splits with opposite judgements: in train the long document (three
    "apple"s among ten words) is relevant, in test the one-word document. Lucene BM25, k1 = 1.5,
    avgdl = 5.5: with b = 0 the long one scores 3 * 2.5 / 4.5 = 1.67 against 2.5 / 2.5 = 1 (term
    frequency wins); with b = 1, 7.5 / (3 + 1.5 * 10 / 5.5) = 1.31 against 2.5 / (1 + 1.5 / 5.5) = 1.96."""
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in [
        {"_id": "short", "title": "", "text": "apple"},
        {"_id": "long", "title": "", "text": "apple apple apple banana cherry grape lemon mango peach plum"}]))
    (folder / "queries.jsonl").write_text("\n".join(json.dumps(d) for d in [
        {"_id": "t1", "text": "apple"}, {"_id": "s1", "text": "apple"}]))
    (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nt1\tlong\t1\n")
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\ns1\tshort\t1\n")


@pytest.mark.slow  # over the fast tier's 2 s on a quiet machine (load 0.5)
def test_tune_chooses_on_the_tuning_split_and_reports_the_other(tmp_path):
    _beir_two_splits(tmp_path / "beir")
    cfg = tmp_path / "e.toml"
    cfg.write_text('[dataset]\npath = "beir"\n[evaluate]\nmetrics = ["ndcg@1"]\nn_timing = 0\ntune_split = "train"\n'
                   'output = "out"\n[systems.fixed]\ncomponent = "bm25"\nk = 2\nindex = { b = 1.0 }\n'
                   '[systems.tuned]\ncomponent = "bm25"\nk = 2\ntune = { index = [{ b = 1.0 }, { b = 0.0 }] }\n')
    assert main(["eval", str(cfg), "--no-progress"]) == 0
    d = Report.load(tmp_path / "out").to_dict()
    t = d["tuning"]["tuned"]
    # train prefers b = 0 (the long document first); a tuner that looked at test would pick b = 1
    assert t["scores"] == [0.0, 1.0] and t["chosen"] == {"b": 0.0} and t["questions"] == 1
    assert d["config"]["systems"]["tuned"]["index"] == {"b": 0.0} and "tune" not in d["config"]["systems"]["tuned"]
    assert d["summary"]["tuned"]["ndcg@1"]["mean"] == 0.0 and d["summary"]["fixed"]["ndcg@1"]["mean"] == 1.0


def test_tune_needs_another_split_over_the_same_corpus(tmp_path):
    _beir_two_splits(tmp_path / "beir")
    cfg = tmp_path / "e.toml"
    base = ('[dataset]\npath = "beir"\n[evaluate]\nmetrics = ["ndcg@1"]\nn_timing = 0\n{extra}\n'
            '[systems.tuned]\ncomponent = "bm25"\ntune = {{ k = [1, 2] }}\n')
    for extra, message in (("", "neither tune_split nor tune_questions"), ('tune_split = "test"', "is the evaluated split")):
        cfg.write_text(base.format(extra=extra))
        with pytest.raises(ValueError, match=message):
            from funnel_core.evaluation.config import run_config

            run_config(cfg, progress=False)
    cfg.write_text(base.format(extra='tune_split = "train"').replace("[1, 2]", "3"))
    with pytest.raises(ValueError, match="one setting and a non-empty list"):
        run_config(cfg, progress=False)


def test_compress_appends_the_extractive_compressor(squad_file, tmp_path):
    cfg = tmp_path / "e.toml"
    cfg.write_text('[dataset]\npath = "squad.json"\n[evaluate]\nmetrics = ["AR@2", "words@2"]\nn_timing = 0\n'
                   'output = "out"\n[systems.bm25]\ncomponent = "bm25"\nk = 2\n'
                   '[systems.short]\ncomponent = "bm25"\nk = 2\ncompress = { method = "bm25", ratio = 0.3 }\n')
    assert main(["eval", str(cfg), "--no-progress"]) == 0
    d = Report.load(tmp_path / "out").to_dict()
    full = {r["id"]: r["metrics"]["words@2"] for r in d["per_question"]["bm25"]}
    short = {r["id"]: r["metrics"]["words@2"] for r in d["per_question"]["short"]}
    assert all(0 < short[q] <= full[q] for q in full)  # the same paragraphs, cut to their best sentences
    assert sum(short.values()) < 0.7 * sum(full.values())
    cfg.write_text(cfg.read_text().replace("ratio = 0.3", "ratios = 0.3"))
    assert main(["eval", str(cfg), "--no-progress"]) == 1


@pytest.mark.parametrize("component,line,bad,expected", [
    ("bm25", "kk = 3", "kk", ["k", "index", "rerank"]),
    ("hybrid", "alpah = 0.5", "alpah", ["alpha", "k_side", "embedder"]),
    ("clustered", "max_token = 64", "max_token", ["max_tokens", "max_documents"]),
    ("funnelrag", 'pre_ranker = "ce"\nk_passage = 4', "k_passage", ["k_passages", "pre_ranker"]),
    ("bm25", "index = { stemer = \"english\" }", "stemer", ["stemmer", "stopwords"]),
    ("bm25", "rerank = { model = \"ce\", topn = 2 }", "topn", ["top_n", "batch_size"]),
    ("bm25", "compress = { method = \"bm25\", ration = 0.5 }", "ration", ["ratio", "method"]),
    ("hybrid", "tune = { alfa = [0.1, 0.3] }", "alfa", ["alpha"]),
])
def test_a_misspelt_key_names_the_keys_the_table_takes(tmp_path, capsys, component, line, bad, expected):
    """A misspelt key of a [systems.NAME] table (or of its index / rerank / compress / tune
    tables) is refused when the file is read, naming the TOML keys that table takes; not a Python
    constructor and its parameters (the built index, the sides of a hybrid)."""
    cfg = tmp_path / "e.toml"
    cfg.write_text(f'[dataset]\npath = "squad.json"\n[systems.a]\ncomponent = "{component}"\n{line}\n')
    with pytest.raises(ValueError) as err:
        load_config(cfg)
    msg = str(err.value)
    assert f"unknown key(s) ['{bad}']" in msg and "[systems.a]" in msg and "allowed:" in msg
    allowed = msg.split("allowed:")[1]
    assert all(f"'{k}'" in allowed for k in expected), msg
    for python_only in ("Retrieve", "Scorer", "'sparse'", "'documents'", "'self'"):
        assert python_only not in msg, msg
    assert main(["eval", str(cfg), "--no-progress"]) == 1  # the command says the same
    assert f"unknown key(s) ['{bad}']" in capsys.readouterr().err


def _squad(path, articles):
    """A SQuAD v1.1 file from ``{title: [(paragraph, [(question, answer), ...]), ...]}``."""
    data = [{"title": title, "paragraphs": [
        {"context": ctx, "qas": [{"id": f"{title}-{pi}-{qi}", "question": q,
                                  "answers": [{"text": a, "answer_start": ctx.find(a)}]}
                                 for qi, (q, a) in enumerate(qas)]}
        for pi, (ctx, qas) in enumerate(paras)]} for title, paras in articles.items()]
    path.write_text(json.dumps({"version": "1.1", "data": data}))
    return path


def test_distractors_join_the_corpus_not_the_questions(tmp_path):
    _squad(tmp_path / "dev.json", {"Fruit": [("apple zest", [("apple apple", "zest")])]})
    # the train file's one paragraph repeats "apple" three times: with b = 0 (no length
    # normalisation) BM25 ranks it above the dev paragraph
    _squad(tmp_path / "train.json", {"Orchard": [(
        "apple apple apple banana cherry grape lemon mango peach plum", [("apple", "plum")])]})
    cfg = tmp_path / "e.toml"
    cfg.write_text('[dataset]\npath = "dev.json"\ndistractors = ["train.json"]\n[evaluate]\nmetrics = ["AR@1"]\n'
                   'n_timing = 0\noutput = "out"\n[systems.flat]\ncomponent = "bm25"\nk = 1\nindex = { b = 0.0 }\n')
    assert main(["eval", str(cfg), "--no-progress", "--cache-dir", str(tmp_path / "cache")]) == 0
    d = Report.load(tmp_path / "out").to_dict()
    assert d["dataset"]["corpus"] == 2 and d["dataset"]["questions"] == 1  # the train question is not asked
    assert d["config"]["dataset"]["distractors"] == [str((tmp_path / "train.json").resolve())]
    assert d["summary"]["flat"]["AR@1"]["mean"] == 0.0  # the distractor took rank 1
    # the score cache's corpus digest covers the distractors: a changed distractor file recomputes
    _squad(tmp_path / "train.json", {"Orchard": [("banana cherry", [("banana?", "cherry")])]})
    with pytest.warns(UserWarning, match="differs in: corpus"):
        assert main(["eval", str(cfg), "--no-progress", "--cache-dir", str(tmp_path / "cache")]) == 0
    assert Report.load(tmp_path / "out").to_dict()["summary"]["flat"]["AR@1"]["mean"] == 1.0


def test_distractors_are_checked(tmp_path):
    _squad(tmp_path / "dev.json", {"Fruit": [("apple zest", [("apple apple", "zest")])]})
    cfg = tmp_path / "e.toml"
    body = '[evaluate]\nmetrics = ["AR@1"]\nn_timing = 0\noutput = "out"\n[systems.b]\ncomponent = "bm25"\n'
    cfg.write_text('[dataset]\npath = "dev.json"\ndistractors = "dev.json"\n' + body)
    with pytest.raises(ValueError, match="distractors must be a list of strings, got 'dev.json'"):
        load_config(cfg)
    from funnel_core.evaluation.config import run_config

    cfg.write_text('[dataset]\npath = "dev.json"\ndistractors = ["dev.json"]\n' + body)
    with pytest.raises(ValueError, match="unit id 'Fruit/0' is already in the corpus"):
        run_config(cfg, progress=False)


def test_tune_questions_tune_on_another_file_over_the_evaluated_corpus(tmp_path):
    _squad(tmp_path / "dev.json", {"Fruit": [("apple zest", [("apple apple", "zest")])]})
    _squad(tmp_path / "train.json", {"Orchard": [(
        "apple apple apple banana cherry grape lemon mango peach plum", [("apple", "plum")])]})
    cfg = tmp_path / "e.toml"
    head = '[dataset]\npath = "dev.json"\n{ds}[evaluate]\nmetrics = ["AR@1"]\nn_timing = 0\noutput = "out"\n{tq}\n'
    systems = ('[systems.fixed]\ncomponent = "bm25"\nk = 1\nindex = { b = 1.0 }\n'
               '[systems.tuned]\ncomponent = "bm25"\nk = 1\ntune = { index = [{ b = 1.0 }, { b = 0.0 }] }\n')
    tq = 'tune_questions = { path = "train.json", limit = 1, seed = 3 }'
    cfg.write_text(head.format(ds='distractors = ["train.json"]\n', tq=tq) + systems)
    assert main(["eval", str(cfg), "--no-progress"]) == 0
    d = Report.load(tmp_path / "out").to_dict()
    t = d["tuning"]["tuned"]
    # the train question's answer is in the long paragraph: b = 0 finds it at rank 1, b = 1 does
    # not; a tuner that read the dev question would choose b = 1
    assert t["scores"] == [0.0, 1.0] and t["chosen"] == {"b": 0.0} and t["questions"] == 1
    assert t["split"] == "train (tune_questions)"
    assert d["summary"]["tuned"]["AR@1"]["mean"] == 0.0 and d["summary"]["fixed"]["AR@1"]["mean"] == 1.0
    from funnel_core.evaluation.config import run_config

    # tuning questions whose paragraphs are not searched are refused, naming the fix
    cfg.write_text(head.format(ds="", tq=tq) + systems)
    with pytest.raises(ValueError, match=r"not in the evaluated corpus .*'Orchard/0'.*\[dataset\] distractors"):
        run_config(cfg, progress=False)
    # so are tuning questions that the evaluation reports
    _squad(tmp_path / "train.json", {"Orchard": [("apple plum", [("Apple  apple", "plum")])]})
    cfg.write_text(head.format(ds='distractors = ["train.json"]\n', tq=tq) + systems)
    with pytest.raises(ValueError, match="1 are among the evaluated questions"):
        run_config(cfg, progress=False)
    for bad, message in (('tune_questions = { limit = 1 }', "needs `path`"),
                         ('tune_questions = { path = "train.json", limit = 0 }', "limit must be an integer >= 1"),
                         ('tune_questions = { path = "train.json", lmit = 1 }', r"unknown key\(s\) \['lmit'\]"),
                         ('tune_questions = "train.json"', "tune_questions must be a table"),
                         (tq + '\ntune_split = "train"', "keep one")):
        cfg.write_text(head.format(ds='distractors = ["train.json"]\n', tq=bad) + systems)
        with pytest.raises(ValueError, match=message):
            load_config(cfg)


def test_tuning_results_are_cached_and_read_back_on_a_rerun(tmp_path):
    """Each tuned value's per-question results are kept in the score cache's ``tuning/`` folder:
    a rerun reads them (the files stay byte-identical, the choice is the same), and a changed
    tuning grid writes the new value's file beside them."""
    _squad(tmp_path / "dev.json", {"Fruit": [("apple zest", [("apple apple", "zest")])]})
    _squad(tmp_path / "train.json", {"Orchard": [(
        "apple apple apple banana cherry grape lemon mango peach plum", [("apple", "plum")])]})
    cfg = tmp_path / "e.toml"
    body = ('[dataset]\npath = "dev.json"\ndistractors = ["train.json"]\n[evaluate]\nmetrics = ["AR@1"]\n'
            'n_timing = 0\noutput = "out"\ncache_dir = "cache"\n'
            'tune_questions = { path = "train.json", limit = 1, seed = 3 }\n'
            '[systems.tuned]\ncomponent = "bm25"\nk = 1\ntune = { index = [{ b = 1.0 }, { b = 0.0 }] }\n')
    cfg.write_text(body)
    assert main(["eval", str(cfg), "--no-progress"]) == 0
    files = sorted((tmp_path / "cache" / "tuning").glob("*.jsonl"))
    assert len(files) == 2  # one per tuned value
    records = [f.read_text().splitlines() for f in files]
    assert all(len(lines) == 2 for lines in records)  # a header and the one tuning question
    before = {f: f.read_bytes() for f in files}
    assert main(["eval", str(cfg), "--no-progress"]) == 0
    assert {f: f.read_bytes() for f in files} == before
    assert Report.load(tmp_path / "out").to_dict()["tuning"]["tuned"]["chosen"] == {"b": 0.0}
    # the cached value is read, not recomputed: a record changed on disk (its digest redone, so it
    # is not discarded as damaged) decides the next choice
    import hashlib

    for f in files:
        head, line = f.read_text().splitlines()
        rec = json.loads(line)
        if rec["metrics"]["AR@1"] == 1.0:
            rec["metrics"]["AR@1"] = 0.0
            body_rec = {k: v for k, v in rec.items() if k != "sha256"}
            rec["sha256"] = hashlib.sha256(json.dumps(body_rec, sort_keys=True, separators=(",", ":"))
                                           .encode("utf-8")).hexdigest()
            f.write_text(head + "\n" + json.dumps(rec) + "\n")
    assert main(["eval", str(cfg), "--no-progress"]) == 0
    assert Report.load(tmp_path / "out").to_dict()["tuning"]["tuned"]["scores"] == [0.0, 0.0]
    cfg.write_text(body.replace("{ b = 0.0 }]", "{ b = 0.0 }, { b = 0.5 }]"))
    assert main(["eval", str(cfg), "--no-progress"]) == 0
    assert len(list((tmp_path / "cache" / "tuning").glob("*.jsonl"))) == 3


def test_offset_samples_of_one_seed_are_disjoint_and_cover_the_shuffle(squad_file, tmp_path):
    from funnel_core.evaluation.config import run_config

    ds = load_dataset(squad_file)
    parts = [ds.subset(2, seed=5, offset=o).question_ids for o in (0, 2, 4)]
    assert [len(p) for p in parts] == [2, 2, 2]
    assert sorted(sum(parts, [])) == sorted(ds.question_ids)  # disjoint, and together every question
    assert ds.subset(None, seed=5, offset=4).question_ids == parts[2]  # no limit: the rest of the shuffle
    with pytest.raises(ValueError, match="offset 6 leaves no question"):
        ds.subset(2, seed=5, offset=6)
    cfg = tmp_path / "e.toml"
    body = '[evaluate]\nmetrics = ["AR@1"]\nn_timing = 0\noutput = "out"\n[systems.b]\ncomponent = "bm25"\n'
    cfg.write_text('[dataset]\npath = "squad.json"\nlimit = 2\nseed = 5\noffset = 2\n' + body)
    report, _ = run_config(cfg, progress=False)
    assert [r["id"] for r in report.per_question["b"]] == parts[1]
    cfg.write_text('[dataset]\npath = "squad.json"\nlimit = 2\noffset = -1\n' + body)
    with pytest.raises(ValueError, match="offset must be an integer >= 0, got -1"):
        load_config(cfg)


def test_funnel_eval_runs_the_funnel_with_a_fid_post_ranker_against_a_cross_encoder(
        squad_file, tiny_cross_encoder_path, tiny_t5_path, tmp_path):
    """What benchmarks/configs/funnelrag_whole.toml does at full size (it replaced
    `bench_squad_large.py --postrank fid`): one funnel configuration twice on the same questions, the
    cross-encoder as pre-ranker in both and as post-ranker once the cross-encoder, once a FiD reader's
    cross-attention, real pipelines through `funnel eval`. Tiny random models: the code path, not the quality."""
    funnel = f"""component = "funnelrag"
max_tokens = 64
k_clusters = 2
k_documents = 2
k_passages = 2
pre_ranker = "{tiny_cross_encoder_path}"
batch_size = 4"""
    config = _toml(tmp_path, tiny_cross_encoder_path, f"""
[systems.funnel_ce]
{funnel}

[systems.funnel_fid]
{funnel}
preset = "paper"
post_ranker = "{tiny_t5_path}"
fid_kwargs = {{ dtype = "float32" }}
""")
    assert main(["eval", config, "--no-progress", "--n-timing", "0"]) == 0
    d = json.loads((tmp_path / "out" / "report.json").read_text())
    for name in ("funnel_ce", "funnel_fid"):
        ar1, ar2 = (d["summary"][name][m]["mean"] for m in ("AR@1", "AR@2"))
        assert 0.0 <= ar1 <= ar2 <= 1.0                                  # AR@k cannot fall with k
        per_q = d["per_question"][name]
        assert len(per_q) == 6 and ar2 == pytest.approx(sum(r["metrics"]["AR@2"] for r in per_q) / 6)
        assert all(r["n_results"] <= 2 for r in per_q)                   # k_passages cuts both
    # the FiD system's post-ranker is the reader (its passages are counted), the other's the cross-encoder
    assert d["cost"]["funnel_fid"]["fid_passages_per_query"] > 0
    assert not d["cost"]["funnel_ce"].get("fid_passages_per_query")
    assert "AR@1" in d["comparisons"]["funnel_fid"]                      # paired against the baseline
