"""scripts/mutate.py: which mutants a re-run names, and what --record keeps."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest


@pytest.fixture()
def mutate():
    path = Path(__file__).resolve().parents[2] / "scripts" / "mutate.py"
    spec = importlib.util.spec_from_file_location("mutate_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CODES = {"m.x_f__mutmut_1": 1, "m.x_f__mutmut_2": 0, "m.x_f__mutmut_3": None,
         "m.x_f__mutmut_4": -11, "m.x_f__mutmut_5": 33, "m.x_f__mutmut_6": -24,
         "other.x_g__mutmut_1": None, "other.x_g__mutmut_2": 0}


def test_survivors_are_run_reached_and_not_killed_unchecked_have_no_verdict(mutate):
    globs = ["m.x_f__mutmut_*"]
    assert mutate.select(CODES, globs, "survivors") == ["m.x_f__mutmut_2"]
    # a run cut short resumes with the mutants never run and those whose test process crashed
    assert mutate.select(CODES, globs, "unchecked") == ["m.x_f__mutmut_3", "m.x_f__mutmut_4"]
    assert mutate.select(CODES, ["m.*", "other.*"], "unchecked") == [
        "m.x_f__mutmut_3", "m.x_f__mutmut_4", "other.x_g__mutmut_1"]


def test_record_rewrites_the_counts_and_keeps_the_notes(mutate, tmp_path, monkeypatch):
    record = tmp_path / "mutation.json"
    monkeypatch.setattr(mutate, "RECORD", record)
    monkeypatch.setattr(mutate, "ROOT", tmp_path)
    row = {"mutants": 4, "checked": 3, "killed": 2, "survived": 1, "not_reached": 0,
           "not_checked": 1, "crashed": 0, "score": 0.667, "survivors": ["s"]}
    mutate.record({"mod": row})
    saved = json.loads(record.read_text())["modules"]["mod"]
    assert saved["complete"] is False and saved["killed"] == 2
    saved.update(runs=["cut by timeout"], equivalent_or_not_paper="s: a dtype only")
    record.write_text(json.dumps({"modules": {"mod": saved}}))
    mutate.record({"mod": {**row, "checked": 4, "killed": 3, "not_checked": 0, "score": 0.75}})
    again = json.loads(record.read_text())["modules"]["mod"]
    assert (again["killed"], again["complete"], again["score"]) == (3, True, 0.75)
    assert again["runs"] == ["cut by timeout"] and again["equivalent_or_not_paper"] == "s: a dtype only"


def test_record_scores_without_the_survivors_listed_as_equivalent(mutate, tmp_path, monkeypatch):
    record = tmp_path / "mutation.json"
    monkeypatch.setattr(mutate, "RECORD", record)
    monkeypatch.setattr(mutate, "ROOT", tmp_path)
    row = {"mutants": 10, "checked": 10, "killed": 7, "survived": 3, "not_reached": 0,
           "not_checked": 0, "crashed": 0, "score": 0.7, "survivors": ["a", "b", "c"]}
    mutate.record({"mod": row})
    assert "score_without_equivalent" not in json.loads(record.read_text())["modules"]["mod"]
    saved = json.loads(record.read_text())
    saved["modules"]["mod"]["equivalent"] = ["a", "b", "z"]      # z: killed since, not counted
    record.write_text(json.dumps(saved))
    mutate.record({"mod": row})
    again = json.loads(record.read_text())["modules"]["mod"]
    assert again["equivalent"] == ["a", "b", "z"] and again["equivalent_count"] == 2
    assert again["score_without_equivalent"] == 0.875                # 7 / (10 - 2)
