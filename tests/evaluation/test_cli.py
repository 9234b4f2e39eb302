"""`funnel eval CONFIG.toml` end to end on a tiny SQuAD file, and its configuration errors."""

from __future__ import annotations

import json

import pytest

from funnel_core.cli import main
from funnel_core.evaluation import Report, load_dataset
from funnel_core.evaluation.config import load_config


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
    # a second run resumes from the cache: same per-question results
    assert main(["eval", config, "--no-progress", "--n-timing", "0"]) == 0
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
