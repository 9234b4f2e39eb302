"""Fixtures of the evaluation tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def _machine_description_loaded():
    """Every report records ``funnel_core.hardware.describe()``, which imports torch (about 2 s,
    once per process); pay it at session setup rather than inside the first fast test."""
    from funnel_core.hardware import describe

    describe()


def squad_config(folder: Path, name: str, systems: str) -> Path:
    """``folder/name``: a ``funnel eval`` TOML over the :func:`squad_file` there (AR@1 and AR@2, no
    timing, the report in ``folder/out``) with the ``[systems.NAME]`` tables of ``systems``."""
    path = folder / name
    path.write_text('[dataset]\npath = "squad.json"\n[evaluate]\nmetrics = ["AR@1", "AR@2"]\nn_timing = 0\n'
                    'output = "out"\n' + systems)
    return path


ARTICLES = {
    "Paris": ["Paris is the capital of France and sits on the Seine.",
              "The Eiffel Tower in Paris was finished in 1889."],
    "Hamlet": ["Hamlet is a tragedy written by William Shakespeare.",
               "The play is set in Denmark at the castle of Elsinore."],
    "BM25": ["BM25 is a ranking function used by search engines.",
             "Okapi BM25 was developed at City University London."],
}
QUESTIONS = [("Paris", 0, "What is the capital of France?", "Paris"),
             ("Paris", 1, "When was the Eiffel Tower finished?", "1889"),
             ("Hamlet", 0, "Who wrote the tragedy Hamlet?", "William Shakespeare"),
             ("Hamlet", 1, "Where is the play Hamlet set?", "Denmark"),
             ("BM25", 0, "What do search engines use BM25 for?", "ranking function"),
             ("BM25", 1, "Where was Okapi BM25 developed?", "City University London")]


@pytest.fixture
def squad_file(tmp_path):
    """Three articles, six paragraphs, one question per paragraph, as a SQuAD v1.1 file."""
    data = []
    for title, paras in ARTICLES.items():
        data.append({"title": title, "paragraphs": [
            {"context": ctx, "qas": [{"id": f"{title}-{p}-{i}", "question": q,
                                      "answers": [{"text": a, "answer_start": ctx.find(a)}]}
                                     for i, (t, p, q, a) in enumerate(QUESTIONS) if t == title and p == pi]}
            for pi, ctx in enumerate(paras)]})
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"version": "1.1", "data": data}))
    return path
