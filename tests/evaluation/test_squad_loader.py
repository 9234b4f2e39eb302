"""funnel_core.evaluation.load_squad on SQuAD-format files with and without question ids."""

from __future__ import annotations

import json

import pytest

from funnel_core.evaluation import load_squad, squad_question_id


def _write(path, data):
    path.write_text(json.dumps({"version": "1.1", "data": data}), encoding="utf-8")
    return path


def _article(title, paragraphs):
    return {"title": title, "paragraphs": [
        {"context": ctx, "qas": [dict(q) for q in qas]} for ctx, qas in paragraphs]}


def _q(text, answer, qid=None):
    q = {"question": text, "answers": [{"answer_start": 0, "text": answer}, {"answer_start": 0, "text": answer}]}
    if qid is not None:
        q["id"] = qid
    return q


def test_id_less_questions_get_stable_positional_ids(tmp_path):
    # the layout of the rebuilt SQuAD v1.1 train file: no "id" on any question
    data = [_article("Alpha", [("Alpha one.", [_q("a?", "one"), _q("b?", "Alpha")]), ("Alpha two.", [_q("c?", "two")])]),
            _article("Beta", [("Beta one.", [_q("d?", "Beta")])])]
    path = _write(tmp_path / "train.json", data)
    arts = load_squad(path)
    ids = [q.id for a in arts for q in a.questions]
    # "<title>/<paragraph>/<question>", written out by hand from the fixture's layout
    assert ids == ["Alpha/0/0", "Alpha/0/1", "Alpha/1/0", "Beta/0/0"]
    assert [q.id for a in load_squad(path) for q in a.questions] == ids        # stable across loads
    q = arts[0].questions[2]
    assert (q.question, q.answers, q.article, q.paragraph_index) == ("c?", ["two"], "Alpha", 1)
    assert squad_question_id("Alpha", 1, 0) == "Alpha/1/0"


def test_given_ids_are_kept_and_mixed_files_work(tmp_path):
    data = [_article("Alpha", [("Alpha one.", [_q("a?", "one", qid="5733be28"), _q("b?", "Alpha")])])]
    ids = [q.id for a in load_squad(_write(tmp_path / "mixed.json", data)) for q in a.questions]
    assert ids == ["5733be28", "Alpha/0/1"]


def test_duplicate_ids_are_an_error_naming_both_places(tmp_path):
    # two articles with one title and no ids would give the same synthetic ids
    data = [_article("Alpha", [("x", [_q("a?", "x")])]), _article("Alpha", [("y", [_q("b?", "y")])])]
    with pytest.raises(ValueError, match="'Alpha/0/0' occurs twice"):
        load_squad(_write(tmp_path / "dup.json", data))


@pytest.mark.slow  # parses the 30 MB SQuAD train file (2-4 s)
def test_the_real_train_file_loads_if_present():
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "shared" / "data" / "squad" / "squad-v1.1-train.json"
    if not path.is_file():
        pytest.skip(f"{path} not here")
    arts = load_squad(path)
    qs = [q for a in arts for q in a.questions]
    assert len(arts) == 442 and len(qs) == 87_599 and len({q.id for q in qs}) == len(qs)
