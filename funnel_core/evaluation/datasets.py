"""Loaders for BEIR-format folders (corpus.jsonl, queries.jsonl, qrels/*.tsv) and SQuAD-format
JSON. They take a path; nothing is downloaded.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from funnel_core.units import Unit

__all__ = ["BeirDataset", "load_beir", "SquadQuestion", "SquadArticle", "load_squad", "squad_question_id"]


@dataclass
class BeirDataset:
    corpus: list[Unit]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]

    def split_queries(self) -> dict[str, str]:
        """The queries that have relevance judgements in this split."""
        return {q: self.queries[q] for q in self.qrels if q in self.queries}


def _need(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"{str(path)!r} does not exist; pass the folder of a BEIR "
                                "dataset (corpus.jsonl, queries.jsonl, qrels/<split>.tsv).")
    return path


def load_beir(path: str | os.PathLike, split: str = "test", title_in_text: bool = True) -> BeirDataset:
    """Load a BEIR dataset. Corpus units are documents with ``metadata["title"]``.

    ``title_in_text`` prepends the title to the text, as BEIR's BM25 baselines index it.
    """
    path = Path(path)
    corpus = []
    with open(_need(path / "corpus.jsonl"), encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            title = d.get("title") or ""
            text = f"{title}\n{d['text']}" if title and title_in_text else d["text"]
            corpus.append(Unit(id=str(d["_id"]), text=text, metadata={"title": title, "doc_id": str(d["_id"])},
                               level="document"))
    queries = {}
    with open(_need(path / "queries.jsonl"), encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            queries[str(d["_id"])] = d["text"]
    qrels: dict[str, dict[str, int]] = {}
    with open(_need(path / "qrels" / f"{split}.tsv"), encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t")
        for row in reader:
            if not row or row[0] == "query-id":
                continue
            qid, did, rel = row[0], row[1], int(row[2])
            if rel > 0:
                qrels.setdefault(qid, {})[did] = rel
    return BeirDataset(corpus=corpus, queries=queries, qrels=qrels)


@dataclass
class SquadQuestion:
    id: str
    question: str
    answers: list[str]
    article: str
    paragraph_index: int


@dataclass
class SquadArticle:
    title: str
    paragraphs: list[str]
    questions: list[SquadQuestion] = field(default_factory=list)


def squad_question_id(title: str, paragraph: int, question: int) -> str:
    """The synthetic id of a SQuAD question that has none: ``"<title>/<paragraph>/<question>"``
    (positions counted from 0 in the file). It depends only on the file, so it is stable across runs."""
    return f"{title}/{paragraph}/{question}"


def load_squad(path: str | os.PathLike) -> list[SquadArticle]:
    """Load SQuAD v1.1-format JSON into articles with their paragraphs and questions.

    A question without an ``id`` (the rebuilt SQuAD v1.1 train file has none) gets
    :func:`squad_question_id` of its position; a question with one keeps it.
    """
    path = Path(path)
    with open(_need(path), encoding="utf-8") as f:
        data = json.load(f)["data"]
    articles = []
    seen: dict[str, str] = {}
    for art in data:
        a = SquadArticle(title=art["title"], paragraphs=[])
        for pi, para in enumerate(art["paragraphs"]):
            a.paragraphs.append(para["context"])
            for qi, qa in enumerate(para["qas"]):
                answers = sorted({x["text"] for x in qa["answers"]})
                qid = str(qa.get("id") or squad_question_id(art["title"], pi, qi))
                if qid in seen:
                    raise ValueError(f"{path}: question id {qid!r} occurs twice (at {seen[qid]} and at "
                                     f"{art['title']!r} paragraph {pi} question {qi}); give the questions "
                                     "distinct ids or drop the duplicate article.")
                seen[qid] = f"{art['title']!r} paragraph {pi} question {qi}"
                a.questions.append(SquadQuestion(id=qid, question=qa["question"],
                                                 answers=answers, article=art["title"],
                                                 paragraph_index=pi))
        articles.append(a)
    return articles
