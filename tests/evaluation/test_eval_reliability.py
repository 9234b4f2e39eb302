"""The evaluation cache is keyed by everything a result depends on and
never reports a damaged record; output stays in its folder and never follows a planted link;
datasets and configurations refuse what they do not understand, naming the file, line and field."""

from __future__ import annotations

import json
import math
import os
import signal
import warnings

import pytest

from funnel_core.evaluation import EvalDataset, evaluate, load_dataset
from funnel_core.evaluation.config import run_config
from funnel_core.units import Unit

pytestmark = pytest.mark.usefixtures("ranx_loaded")  # ranx loads once per process

DOCS = [{"id": "d1", "text": "Paris is the capital of France.", "title": "France"},
        {"id": "d2", "text": "Berlin is the capital of Germany.", "title": "Germany"},
        {"id": "d3", "text": "Rome is the capital of Italy.", "title": "Italy"}]
QUESTIONS = [{"id": "q1", "question": "capital of France", "answers": ["Paris"], "relevant": ["d1"]},
             {"id": "q2", "question": "capital of Germany", "answers": ["Berlin"], "relevant": ["d2"]}]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _config(folder, evaluate_extra="", dataset_extra="", output='output = "out"'):
    folder.mkdir(parents=True, exist_ok=True)
    _write_jsonl(folder / "docs.jsonl", DOCS)
    _write_jsonl(folder / "questions.jsonl", QUESTIONS)
    cfg = folder / "eval.toml"
    cfg.write_text(f'[dataset]\npath = "questions.jsonl"\ncorpus = "docs.jsonl"\n{dataset_extra}\n'
                   f'[evaluate]\nmetrics = ["AR@1"]\nn_timing = 0\n{output}\n{evaluate_extra}\n'
                   '[systems.bm25]\ncomponent = "bm25"\nk = 1\n')
    return cfg


@pytest.fixture
def no_hang():
    """Fail (not hang) when a FIFO blocks an open."""
    def _alarm(signum, frame):
        raise TimeoutError("blocked on a FIFO")

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


# -- the cache key covers the corpus; damaged records are never reported -------------------
def test_funnel_eval_recomputes_after_the_corpus_text_changes(tmp_path):
    cfg = _config(tmp_path)
    report, _ = run_config(cfg, progress=False)
    assert report.summary["bm25"]["AR@1"]["mean"] == 1.0
    docs = [dict(d) for d in DOCS]
    docs[0]["text"] = "Lyon is a city of France, not the capital."  # "Paris" is gone from the corpus
    _write_jsonl(tmp_path / "docs.jsonl", docs)
    with pytest.warns(UserWarning, match=r"'bm25'.*recomput"):
        report, _ = run_config(cfg, progress=False)
    assert report.summary["bm25"]["AR@1"]["mean"] == 0.5


def test_a_changed_system_setting_recomputes_with_a_warning(tmp_path):
    cfg = _config(tmp_path)
    run_config(cfg, progress=False)
    cfg.write_text(cfg.read_text().replace("k = 1", "k = 2"))
    with pytest.warns(UserWarning, match=r"'bm25'.*recomput"):
        report, _ = run_config(cfg, progress=False)
    assert report.summary["bm25"]["AR@1"]["mean"] == 1.0


def _qrels_ds():
    return EvalDataset(queries={f"q{i}": f"question {i}" for i in range(4)},
                       answers={f"q{i}": [f"answer{i}"] for i in range(4)},
                       qrels={f"q{i}": {f"d{i}": 1} for i in range(4)})


def _good(query):
    i = query.split()[-1]
    return [Unit(id=f"d{i}", text=f"the answer{i} is here", metadata={"title": "T"}),
            Unit(id="dx", text="nothing", metadata={"title": "U"})]


def test_nan_forged_or_damaged_cached_records_are_recomputed_never_reported(tmp_path):
    ds = _qrels_ds()
    metrics = ["AR@1", "ndcg@2"]
    fresh = evaluate({"s": _good}, ds, metrics=metrics, n_timing=0, progress=False)
    evaluate({"s": _good}, ds, metrics=metrics, n_timing=0, cache_dir=tmp_path, progress=False)
    (path,) = tmp_path.glob("*.jsonl")
    lines = path.read_text().splitlines()
    recs = [json.loads(x) for x in lines[1:]]
    recs[0]["metrics"]["AR@1"] = float("nan")                   # a non-finite metric
    recs[1]["ranked"] = ["dx", "d1", "d1", "d2", "d3"]          # forged: longer than the depth, repeated
    recs[2]["id"] = "q-unknown"                                 # a question this dataset does not have
    damaged = [lines[0], json.dumps(recs[0]), json.dumps(recs[1]), json.dumps(recs[2]), "{not json"]
    path.write_text("\n".join(damaged) + "\n")
    asked: list[str] = []
    with pytest.warns(UserWarning, match="'s'"):
        r = evaluate({"s": lambda q: asked.append(q) or _good(q)}, ds, metrics=metrics, n_timing=0,
                     cache_dir=tmp_path, progress=False)
    assert sorted(asked) == ["question 0", "question 1", "question 2", "question 3"]
    assert r.per_question == fresh.per_question
    assert not math.isnan(r.summary["s"]["AR@1"]["mean"]) and r.summary["s"]["AR@1"]["mean"] == 1.0
    # the file now holds only good records: a third run asks nothing and warns nothing
    asked.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = evaluate({"s": lambda q: asked.append(q) or _good(q)}, ds, metrics=metrics, n_timing=0,
                         cache_dir=tmp_path, progress=False)
    assert asked == [] and again.per_question == fresh.per_question


def _damages(lines):
    """(name, bytes) of cache files damaged in every way a crash, a disk or a hand can."""
    head, recs = lines[0], lines[1:]
    rec = json.loads(recs[0])
    yield "header nested deeper than the parser goes", ("[" * 100_000 + "\n" + "\n".join(recs)).encode()
    yield "record nested deeper than the parser goes", (head + "\n" + "[" * 100_000 + "\n").encode()
    yield "header is a list", (json.dumps([head]) + "\n" + "\n".join(recs)).encode()
    yield "header names a non-dict system", (head.replace('"system": {', '"system": "x", "was": {', 1) + "\n").encode()
    yield "not UTF-8", b"\xff\xfe\x00" + "\n".join(lines).encode()
    yield "truncated mid-record", "\n".join(lines).encode()[: len(head) + 20]
    yield "truncated mid-header", head.encode()[:15]
    yield "a record that is a list", (head + "\n" + json.dumps([rec]) + "\n").encode()
    yield "metrics a list", (head + "\n" + json.dumps({**rec, "metrics": [1]}) + "\n").encode()
    yield "NaN literal", (head + "\n" + json.dumps({**rec, "metrics": {"AR@1": float("nan")}}) + "\n").encode()
    yield "no id", (head + "\n" + json.dumps({k: v for k, v in rec.items() if k != "id"}) + "\n").encode()


def test_a_damaged_cache_file_is_discarded_with_a_warning_naming_it_never_a_raw_error(tmp_path):
    """Whatever the damage (JSON nested past the parser's recursion limit, a header of the wrong
    type, bytes that are not UTF-8, a file cut short, records of the wrong shape), the run
    warns naming the file, recomputes, and reports what a fresh run reports: no
    JSONDecodeError, RecursionError, AttributeError or KeyError."""
    ds = _qrels_ds()
    fresh = evaluate({"s": _good}, ds, metrics=["AR@1"], n_timing=0, progress=False)
    evaluate({"s": _good}, ds, metrics=["AR@1"], n_timing=0, cache_dir=tmp_path, progress=False)
    (path,) = tmp_path.glob("*.jsonl")
    lines = path.read_text().splitlines()
    for name, data in _damages(lines):
        path.write_bytes(data)
        with pytest.warns(UserWarning, match=rf"'s'.*{path.name}") as seen:
            r = evaluate({"s": _good}, ds, metrics=["AR@1"], n_timing=0, cache_dir=tmp_path, progress=False)
        assert r.per_question == fresh.per_question, name
        assert any("recomput" in str(w.message) for w in seen), name
        path.write_text("\n".join(lines) + "\n")


def test_a_plausible_byte_change_in_a_cached_record_is_detected(tmp_path):
    """A byte that changed on disk and still parses (AR 1.0 -> 0.0, a ranked id d1 -> d3) passes
    every plausibility check; each record's SHA-256 catches it, so the question is recomputed
    rather than reported with the changed value."""
    ds = _qrels_ds()
    kw = dict(metrics=["AR@1", "ndcg@2"], n_timing=0, progress=False)
    fresh = evaluate({"s": _good}, ds, **kw)
    evaluate({"s": _good}, ds, cache_dir=tmp_path, **kw)
    (path,) = tmp_path.glob("*.jsonl")
    text = path.read_text()
    for old, new in (('"AR@1": 1.0', '"AR@1": 0.0'), ('"ranked": ["d1"', '"ranked": ["d3"')):
        assert old in text
        path.write_text(text.replace(old, new, 1))
        with pytest.warns(UserWarning, match="SHA-256 does not match"):
            r = evaluate({"s": _good}, ds, cache_dir=tmp_path, **kw)
        assert r.per_question == fresh.per_question, new


def test_a_cache_header_written_for_another_corpus_is_not_reused(tmp_path):
    ds = _qrels_ds()
    ds.corpus = [Unit(id=f"d{i}", text=f"the answer{i} is here") for i in range(4)]
    evaluate({"s": _good}, ds, metrics=["AR@1"], n_timing=0, cache_dir=tmp_path, progress=False)
    ds.corpus[0] = Unit(id="d0", text="changed")
    asked: list[str] = []
    with pytest.warns(UserWarning, match="'s'.*corpus"):
        evaluate({"s": lambda q: asked.append(q) or _good(q)}, ds, metrics=["AR@1"], n_timing=0,
                 cache_dir=tmp_path, progress=False)
    assert len(asked) == 4


# -- output stays in its folder, no link is followed, no FIFO blocks -----------------------
def test_a_symlink_planted_in_the_output_folder_is_not_followed(tmp_path):
    cfg = _config(tmp_path / "cfg")
    out = tmp_path / "cfg" / "out"
    out.mkdir()
    victims = {}
    for name in ("report.json", "report.md", "pareto.png", "report.json.gz"):
        victim = tmp_path / f"victim-{name}"
        victim.write_text("keep me")
        (out / name).symlink_to(victim)
        victims[name] = victim
    run_config(cfg, progress=False)
    for name, victim in victims.items():
        assert victim.read_text() == "keep me", name
    for name in ("report.json", "report.md", "pareto.png"):
        assert (out / name).is_file() and not (out / name).is_symlink()


def test_a_symlink_or_fifo_planted_as_a_cache_file_is_refused_untouched(tmp_path, no_hang):
    ds = _qrels_ds()
    evaluate({"s": _good}, ds, metrics=["AR@1"], n_timing=0, cache_dir=tmp_path, progress=False)
    (path,) = tmp_path.glob("*.jsonl")
    path.unlink()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    path.symlink_to(victim)
    with pytest.raises(ValueError, match="symbolic link"):
        evaluate({"s": _good}, ds, metrics=["AR@1"], n_timing=0, cache_dir=tmp_path, progress=False)
    assert victim.read_text() == "keep me"
    path.unlink()
    path.symlink_to("/dev/zero")
    with pytest.raises(ValueError, match="symbolic link"):
        evaluate({"s": _good}, ds, metrics=["AR@1"], n_timing=0, cache_dir=tmp_path, progress=False)
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(ValueError, match="FIFO"):
        evaluate({"s": _good}, ds, metrics=["AR@1"], n_timing=0, cache_dir=tmp_path, progress=False)


@pytest.mark.parametrize("line", ['output = "../elsewhere"', 'output = "ABS/elsewhere"',
                                  'output = "out"\ncache_dir = "../elsewhere"',
                                  'output = "out"\ncache_dir = "ABS/elsewhere"'])
def test_output_or_cache_dir_outside_the_config_folder_is_refused(tmp_path, line):
    cfg = _config(tmp_path / "cfg", output=line.replace("ABS", str(tmp_path)))
    key = line.splitlines()[-1].split(" =")[0]
    with pytest.raises(ValueError, match=rf"{key}.*outside.*--"):
        run_config(cfg, progress=False)
    assert not (tmp_path / "elsewhere").exists()


def test_an_output_given_on_the_command_line_is_trusted(tmp_path):
    cfg = _config(tmp_path / "cfg", output='output = "../elsewhere"')
    _, paths = run_config(cfg, output=tmp_path / "chosen", progress=False)
    assert paths["json"].parent == tmp_path / "chosen" and not (tmp_path / "elsewhere").exists()


def test_a_symlinked_output_folder_leaving_the_config_folder_is_refused(tmp_path):
    cfg = _config(tmp_path / "cfg")
    (tmp_path / "away").mkdir()
    (tmp_path / "cfg" / "out").symlink_to(tmp_path / "away")
    with pytest.raises(ValueError, match="outside"):
        run_config(cfg, progress=False)
    assert list((tmp_path / "away").iterdir()) == []


# -- datasets refuse what they do not understand, naming file, line and field -------------
def _jsonl_case(tmp_path, rows, docs=DOCS):
    q = tmp_path / "q.jsonl"
    _write_jsonl(q, rows)
    c = tmp_path / "c.jsonl"
    _write_jsonl(c, docs)
    return q, c


JSONL_CASES = {
    "answer dicts": ({"id": "a", "question": "x", "answers": [{"text": "Paris"}]}, r"q\.jsonl:2.*answers"),
    "a dict of answers": ({"id": "a", "question": "x", "answers": {"Paris": 1}}, r"q\.jsonl:2.*answers"),
    "a null answer": ({"id": "a", "question": "x", "answers": [None]}, r"q\.jsonl:2.*answers"),
    "an empty answer": ({"id": "a", "question": "x", "answers": [""]}, r"q\.jsonl:2.*answers"),
    "a fractional grade": ({"id": "a", "question": "x", "relevant": {"d1": 1.7}}, r"q\.jsonl:2.*relevant.*d1"),
    "a negative grade": ({"id": "a", "question": "x", "relevant": {"d1": -1}}, r"q\.jsonl:2.*relevant.*d1"),
    "a boolean grade": ({"id": "a", "question": "x", "relevant": {"d1": True}}, r"q\.jsonl:2.*relevant.*d1"),
    "a relevant id absent from the corpus": ({"id": "a", "question": "x", "relevant": ["d9"]},
                                             r"q\.jsonl:2.*relevant.*'d9'.*c\.jsonl"),
    "a non-string relevant id": ({"id": "a", "question": "x", "relevant": [None]}, r"q\.jsonl:2.*relevant"),
    "a list id": ({"id": ["a"], "question": "x", "answers": ["y"]}, r"q\.jsonl:2.*id"),
}


@pytest.mark.parametrize("case", sorted(JSONL_CASES))
def test_jsonl_questions_are_validated(tmp_path, case):
    row, pattern = JSONL_CASES[case]
    q, c = _jsonl_case(tmp_path, [QUESTIONS[0], row])
    with pytest.raises(ValueError, match=pattern):
        load_dataset(q, corpus=c)


def test_jsonl_corpus_lines_are_validated(tmp_path):
    q, c = _jsonl_case(tmp_path, QUESTIONS, docs=[DOCS[0], {"id": "d2", "body": "no text"}])
    with pytest.raises(ValueError, match=r"c\.jsonl:2.*text"):
        load_dataset(q, corpus=c)
    q, c = _jsonl_case(tmp_path, QUESTIONS, docs=[DOCS[0], DOCS[1], DOCS[0]])
    with pytest.raises(ValueError, match=r"c\.jsonl:3.*'d1'.*twice"):
        load_dataset(q, corpus=c)
    q, c = _jsonl_case(tmp_path, QUESTIONS)
    c.write_text(c.read_text() + "{broken\n")
    with pytest.raises(ValueError, match=r"c\.jsonl:4.*not JSON"):
        load_dataset(q, corpus=c)


def test_undecodable_bytes_name_the_file_and_line(tmp_path):
    q, c = _jsonl_case(tmp_path, QUESTIONS)
    q.write_bytes(q.read_bytes() + b'{"id": "z", "question": "\xff\xfe", "answers": ["a"]}\n')
    with pytest.raises(ValueError, match=r"q\.jsonl:3.*UTF-8"):
        load_dataset(q, corpus=c)


def _beir(folder, corpus=None, queries=None, qrels=None):
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    _write_jsonl(folder / "corpus.jsonl", corpus or [{"_id": "d1", "title": "", "text": "one"},
                                                     {"_id": "d2", "title": "", "text": "two"}])
    _write_jsonl(folder / "queries.jsonl", queries or [{"_id": "q1", "text": "first"},
                                                       {"_id": "q2", "text": "second"}])
    (folder / "qrels" / "test.tsv").write_text(qrels or "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n")
    return folder


BEIR_CASES = {
    "duplicate query ids": (dict(queries=[{"_id": "q1", "text": "first"}, {"_id": "q1", "text": "again"}]),
                            r"queries\.jsonl:2.*_id.*'q1'"),
    "a query without text": (dict(queries=[{"_id": "q1", "text": "first"}, {"_id": "q2"}]),
                             r"queries\.jsonl:2.*text"),
    "duplicate document ids": (dict(corpus=[{"_id": "d1", "text": "one"}, {"_id": "d1", "text": "again"}]),
                               r"corpus\.jsonl:2.*_id.*'d1'"),
    "a document without text": (dict(corpus=[{"_id": "d1", "text": "one"}, {"_id": "d2", "title": "t"}]),
                                r"corpus\.jsonl:2.*text"),
    "a fractional grade": (dict(qrels="query-id\tcorpus-id\tscore\nq1\td1\t1.7\n"), r"test\.tsv:2.*score"),
    "a short row": (dict(qrels="query-id\tcorpus-id\tscore\nq1\td1\n"), r"test\.tsv:2"),
    "a judged document absent from the corpus": (dict(qrels="query-id\tcorpus-id\tscore\nq1\td9\t1\n"),
                                                 r"test\.tsv:2.*'d9'"),
    "a judged query absent from the queries": (dict(qrels="query-id\tcorpus-id\tscore\nq9\td1\t1\n"),
                                               r"test\.tsv:2.*'q9'"),
}


@pytest.mark.parametrize("case", sorted(BEIR_CASES))
def test_beir_folders_are_validated(tmp_path, case):
    kwargs, pattern = BEIR_CASES[case]
    with pytest.raises(ValueError, match=pattern):
        load_dataset(_beir(tmp_path / "beir", **kwargs))


def test_squad_and_llamaindex_files_are_validated(tmp_path):
    p = tmp_path / "s.json"
    p.write_text(json.dumps({"data": [{"title": "T", "paragraphs": [{"context": "c", "qas": [
        {"id": "a", "question": "q?", "answers": [{"txt": "x"}]}]}]}]}))
    with pytest.raises(ValueError, match=r"s\.json.*answers\[0\].*text"):
        load_dataset(p)
    p.write_text(json.dumps({"data": [{"title": "T", "paragraphs": [{"context": "c", "qas": [
        {"id": "a", "question": "q?", "answers": [{"text": None}]}]}]}]}))
    with pytest.raises(ValueError, match=r"s\.json.*answers\[0\].*text"):
        load_dataset(p)
    p = tmp_path / "qa.json"
    p.write_text(json.dumps({"queries": {"q1": "x"}, "corpus": {"n1": "t"}, "relevant_docs": {"q1": ["n9"]}}))
    with pytest.raises(ValueError, match=r"qa\.json.*relevant_docs.*'n9'"):
        load_dataset(p)


# -- configuration values are type-checked ------------------------------------------------
TOML_CASES = {
    "limit = 0": ("dataset", "limit = 0", "limit"),
    "limit = -3": ("dataset", "limit = -3", "limit"),
    "limit = true": ("dataset", "limit = true", "limit"),
    "gzip = \"false\"": ("evaluate", 'gzip = "false"', "gzip"),
    "max_load = nan": ("evaluate", "max_load = nan", "max_load"),
    "max_load = 0": ("evaluate", "max_load = 0", "max_load"),
    "depth = 0": ("evaluate", "depth = 0", "depth"),
    "n_boot = 0": ("evaluate", "n_boot = 0", "n_boot"),
    "n_timing = -1": ("evaluate", "n_timing = -1", "n_timing"),
    "quiet_check = \"yes\"": ("evaluate", 'quiet_check = "yes"', "quiet_check"),
    "metrics = \"AR@1\"": ("evaluate", 'metrics = "AR@1"', "metrics"),
}


@pytest.mark.parametrize("case", sorted(TOML_CASES))
def test_configuration_values_are_type_checked(tmp_path, case):
    table, line, key = TOML_CASES[case]
    if table == "dataset":
        cfg = _config(tmp_path, dataset_extra=line)
    else:
        cfg = _config(tmp_path, evaluate_extra=line)
        default = {"metrics": 'metrics = ["AR@1"]\n', "n_timing": "n_timing = 0\n"}.get(key)
        if default:  # the value replaces the default one
            cfg.write_text(cfg.read_text().replace(default, "", 1))
    with pytest.raises(ValueError, match=rf"\[{table}\].*{key}"):
        run_config(cfg, progress=False)
    assert not (tmp_path / "out").exists()


def test_evaluate_checks_its_numbers():
    ds = _qrels_ds()
    for kwargs, key in (({"n_boot": 0}, "n_boot.*0"), ({"n_boot": -5}, "n_boot.*-5"), ({"depth": 0}, "depth"),
                        ({"max_load": float("nan")}, "max_load")):
        with pytest.raises(ValueError, match=key):
            evaluate({"s": _good}, ds, metrics=["AR@1"], n_timing=0, progress=False, **kwargs)


@pytest.mark.parametrize("manifest", [True, False])
def test_changed_weights_in_a_model_folder_recompute(tmp_path, manifest):
    """system_keys naming a model folder: a new MANIFEST.sha256 (or, without one, a changed file)
    is another model, and its cached results are not reused."""
    ds = _qrels_ds()
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"1234")
    if manifest:
        (model / "MANIFEST.sha256").write_text("aaaa  weights.bin\n")
    keys = {"s": {"component": "bm25", "rerank": {"model": str(model)}}}
    kw = dict(metrics=["AR@1"], n_timing=0, cache_dir=tmp_path / "cache", progress=False, system_keys=keys)
    evaluate({"s": _good}, ds, **kw)
    asked: list[str] = []
    evaluate({"s": lambda q: asked.append(q) or _good(q)}, ds, **kw)
    assert asked == []  # same model: resumed
    if manifest:
        (model / "MANIFEST.sha256").write_text("bbbb  weights.bin\n")
    else:
        (model / "weights.bin").write_bytes(b"123456")
    with pytest.warns(UserWarning, match=r"'s'.*system models.*recomputing"):
        evaluate({"s": lambda q: asked.append(q) or _good(q)}, ds, **kw)
    assert len(asked) == 4


def _save_tiny_cross_encoder(source: str, folder, shift: float) -> None:
    """The tiny cross-encoder of ``source`` with its classifier shifted by ``shift``, saved by
    ``save_pretrained`` into ``folder`` (replacing what is there)."""
    import shutil

    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(source)
    with torch.no_grad():
        model.classifier.bias += shift
        model.classifier.weight *= 1000  # scores that differ between passages
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)


def test_two_models_saved_under_the_same_folder_are_two_systems(tiny_cross_encoder_path, tmp_path):
    """Model B saved over model A in the same folder, every file the same size and given back
    A's modification time (as a copy that keeps times does): the cached results of A are not
    reused for B, and the report is B's."""
    from funnel_core.rerank.cross_encoder import CrossEncoderScorer

    ds = _qrels_ds()
    folder = tmp_path / "reranker"
    docs = [Unit(id=f"d{i}", text=f"the answer{i} is here", metadata={"title": "T"}) for i in range(4)]

    def system(query: str) -> list[Unit]:
        scores = CrossEncoderScorer(str(folder), library="transformers", runtime="torch", dtype="float32",
                                    max_length=32).score(query, [u.text for u in docs])
        return [u for _, u in sorted(zip(scores, docs), key=lambda p: -p[0])]

    keys = {"s": {"component": "rerank", "model": str(folder)}}
    kw = dict(metrics=["AR@1", "ndcg@2"], n_timing=0, progress=False, system_keys=keys)
    _save_tiny_cross_encoder(tiny_cross_encoder_path, folder, 0.0)
    evaluate({"s": system}, ds, cache_dir=tmp_path / "cache", **kw)
    stats = {f.name: f.stat() for f in folder.iterdir()}
    _save_tiny_cross_encoder(tiny_cross_encoder_path, folder, 5.0)  # model B, same path
    for f in folder.iterdir():
        assert f.stat().st_size == stats[f.name].st_size
        os.utime(f, ns=(stats[f.name].st_atime_ns, stats[f.name].st_mtime_ns))
    fresh = evaluate({"s": system}, ds, cache_dir=tmp_path / "fresh-cache", **kw)
    asked: list[str] = []
    with pytest.warns(UserWarning, match=r"'s'.*system models.*recomputing"):
        again = evaluate({"s": lambda q: asked.append(q) or system(q)}, ds, cache_dir=tmp_path / "cache", **kw)
    assert len(asked) == 4 and again.per_question == fresh.per_question


def test_a_hub_model_name_is_identified_by_its_cached_snapshot(tmp_path, monkeypatch):
    """A hub name in a system's settings: the commit of its locally cached snapshot (what
    from_pretrained loads offline) is part of the cache key, so a new snapshot of the same name
    (another commit under refs/main) recomputes."""
    import huggingface_hub.constants

    hub = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    repo = hub / "models--org--tiny-reranker"

    def snapshot(commit: str) -> None:
        (repo / "snapshots" / commit).mkdir(parents=True)
        (repo / "snapshots" / commit / "config.json").write_text("{}")
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(commit)

    snapshot("a" * 40)
    ds = _qrels_ds()
    kw = dict(metrics=["AR@1"], n_timing=0, cache_dir=tmp_path / "cache", progress=False,
              system_keys={"s": {"component": "rerank", "model": "org/tiny-reranker"}})
    evaluate({"s": _good}, ds, **kw)
    asked: list[str] = []
    evaluate({"s": lambda q: asked.append(q) or _good(q)}, ds, **kw)
    assert asked == []  # the same snapshot: resumed
    snapshot("b" * 40)
    with pytest.warns(UserWarning, match=r"'s'.*system models.*recomputing"):
        evaluate({"s": lambda q: asked.append(q) or _good(q)}, ds, **kw)
    assert len(asked) == 4


def test_a_model_folder_identity_is_its_model_files_content(tmp_path):
    """What the folder identity covers: the model files' content (same size, same mtime or not),
    including sub-folders (sentence-transformers' ``1_Pooling``), not our ONNX export, hidden
    files or a trainer's ``checkpoint-*`` folders (loading the folder reads none of them)."""
    from funnel_core.evaluation.harness import _model_identity

    model = tmp_path / "m"
    (model / "1_Pooling").mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"weights-A")
    (model / "1_Pooling" / "config.json").write_text('{"mean": true}')
    ident = _model_identity({"model": str(model)})
    for extra in ("funnel_onnx/model.onnx", ".cache/x.json", "checkpoint-500/optimizer.pt", "README.md"):
        (model / extra).parent.mkdir(parents=True, exist_ok=True)
        (model / extra).write_bytes(b"other")
    assert _model_identity({"model": str(model)}) == ident
    st = (model / "model.safetensors").stat()
    (model / "model.safetensors").write_bytes(b"weights-B")  # same size
    os.utime(model / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _model_identity({"model": str(model)}) != ident
    (model / "model.safetensors").write_bytes(b"weights-A")
    assert _model_identity({"model": str(model)}) == ident
    (model / "1_Pooling" / "config.json").write_text('{"mean": false}')
    assert _model_identity({"model": str(model)}) != ident
