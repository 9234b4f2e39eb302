"""Loaders: BEIR folders (corpus.jsonl, queries.jsonl, qrels/*.tsv), SQuAD-format JSON, the JSON of
LlamaIndex's EmbeddingQAFinetuneDataset and a simple JSONL; :func:`load_dataset` recognises each and
returns one :class:`EvalDataset`. They take a path; nothing is downloaded.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from funnel_core.units import Unit

__all__ = ["BeirDataset", "load_beir", "SquadQuestion", "SquadArticle", "load_squad", "squad_question_id",
           "EvalDataset", "FORMATS", "load_dataset", "squad_dataset", "beir_dataset", "llamaindex_qa_dataset",
           "jsonl_dataset"]


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


# -- one dataset shape for the evaluation harness ------------------------------------------------
FORMATS = (
    "a SQuAD-format JSON file ({\"data\": [{\"title\", \"paragraphs\": [{\"context\", \"qas\": "
    "[{\"id\", \"question\", \"answers\": [{\"text\"}]}]}]}]}: gold answer strings)",
    "a BEIR folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv: graded relevance)",
    "the JSON of LlamaIndex's EmbeddingQAFinetuneDataset / generate_question_context_pairs "
    "({\"queries\": {id: text}, \"corpus\": {node_id: text}, \"relevant_docs\": {id: [node_id]}})",
    "a JSONL file, one question a line: {\"id\", \"question\", \"answers\": [...] and/or "
    "\"relevant\": [doc ids] or {doc id: grade}}",
)


def _formats_help() -> str:
    return "; ".join(f"({i + 1}) {f}" for i, f in enumerate(FORMATS))


@dataclass
class EvalDataset:
    """Questions with their gold labels, and the corpus when the file carries one.

    ``answers`` (question id -> answer strings) is what answer recall (AR@k) reads; ``qrels``
    (question id -> {document id: grade > 0}) is what nDCG / Recall / MRR read. A dataset may
    have both. ``corpus`` units carry ``metadata["doc_id"]`` (the id the qrels name) and
    ``metadata["title"]``; build your index over them.
    """

    queries: dict[str, str]
    answers: dict[str, list[str]] = field(default_factory=dict)
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)
    corpus: list[Unit] = field(default_factory=list)
    name: str = "dataset"
    format: str = "custom"

    def __post_init__(self) -> None:
        if not self.queries:
            raise ValueError(f"dataset {self.name!r} has no questions.")
        if not self.answers and not self.qrels:
            raise ValueError(f"dataset {self.name!r} has neither gold answers nor relevance judgements; "
                             "give each question `answers` (strings) or `relevant` document ids.")
        for label, gold in (("answers", self.answers), ("qrels", self.qrels)):
            unknown = set(gold) - set(self.queries)
            if unknown:
                raise ValueError(f"dataset {self.name!r}: {label} name question ids that are not among the "
                                 f"questions, e.g. {sorted(unknown)[:3]}.")

    @property
    def question_ids(self) -> list[str]:
        """The ids of the questions that carry a label, in file order."""
        return [q for q in self.queries if q in self.answers or q in self.qrels]

    def subset(self, n: int | None = None, seed: int = 0) -> "EvalDataset":
        """A seeded random sample of ``n`` labelled questions (all when ``n`` is ``None`` or
        larger), in file order; the corpus is shared."""
        import random

        ids = self.question_ids
        if n is not None and n < len(ids):
            keep = set(random.Random(seed).sample(ids, n))
            ids = [q for q in ids if q in keep]
        return EvalDataset(queries={q: self.queries[q] for q in ids},
                           answers={q: self.answers[q] for q in ids if q in self.answers},
                           qrels={q: self.qrels[q] for q in ids if q in self.qrels},
                           corpus=self.corpus, name=self.name, format=self.format)

    def fingerprint(self) -> str:
        """A short digest of the questions and labels (the score cache checks it on resume)."""
        import hashlib

        h = hashlib.sha256()
        for q in self.question_ids:
            h.update(json.dumps([q, self.queries[q], self.answers.get(q), self.qrels.get(q)],
                                sort_keys=True).encode())
        return h.hexdigest()[:16]

    def corpus_digest(self) -> str:
        """A digest of the corpus content: every unit's id, text and metadata, in order (the score
        cache checks it on resume: results computed over other texts are not reused)."""
        import hashlib

        h = hashlib.sha256(str(len(self.corpus)).encode())
        for u in self.corpus:
            h.update(json.dumps([u.id, u.text, u.metadata], sort_keys=True, default=str).encode("utf-8"))
            h.update(b"\0")
        return h.hexdigest()


def squad_dataset(path: str | os.PathLike) -> EvalDataset:
    """A SQuAD-format file as an :class:`EvalDataset`: one corpus unit per paragraph (id
    ``"<title>/<paragraph>"``, ``metadata`` title and doc_id), gold answer strings per question."""
    articles = load_squad(path)
    corpus, queries, answers = [], {}, {}
    for a in articles:
        for pi, text in enumerate(a.paragraphs):
            pid = f"{a.title}/{pi}"
            corpus.append(Unit(id=pid, text=text, level="passage",
                               metadata={"title": a.title, "doc_id": pid}))
        for q in a.questions:
            queries[q.id] = q.question
            answers[q.id] = list(q.answers)
    return EvalDataset(queries=queries, answers=answers, corpus=corpus, name=Path(path).stem, format="squad")


def beir_dataset(path: str | os.PathLike, split: str = "test") -> EvalDataset:
    """A BEIR folder as an :class:`EvalDataset` (the questions of ``split`` that have judgements)."""
    b = load_beir(path, split=split)
    return EvalDataset(queries=b.split_queries(), qrels=b.qrels, corpus=b.corpus,
                       name=Path(path).name, format="beir")


def llamaindex_qa_dataset(path: str | os.PathLike) -> EvalDataset:
    """The JSON that LlamaIndex's ``EmbeddingQAFinetuneDataset.save_json`` writes (what
    ``generate_question_context_pairs`` returns): the corpus maps node ids to texts and every
    relevant node has grade 1."""
    with open(_need(Path(path)), encoding="utf-8") as f:
        data = json.load(f)
    return _llamaindex_qa(data, Path(path))


def _llamaindex_qa(data: dict, path: Path) -> EvalDataset:
    corpus = [Unit(id=str(nid), text=str(text), metadata={"doc_id": str(nid), "title": str(nid)})
              for nid, text in (data.get("corpus") or {}).items()]
    qrels = {str(q): {str(d): 1 for d in docs} for q, docs in data["relevant_docs"].items() if docs}
    return EvalDataset(queries={str(q): str(t) for q, t in data["queries"].items()}, qrels=qrels,
                       corpus=corpus, name=path.stem, format="llamaindex")


def jsonl_dataset(path: str | os.PathLike, corpus: str | os.PathLike | None = None) -> EvalDataset:
    """One question a line: ``{"id", "question", "answers": [...], "relevant": [...]}``.

    ``id`` defaults to the line number; ``query`` is accepted for ``question``; ``relevant`` is a
    list of document ids (grade 1) or a ``{doc id: grade}`` mapping; a line needs ``answers`` or
    ``relevant``. ``corpus`` optionally names a JSONL of documents ``{"id", "text", "title"}``.
    """
    path = Path(path)
    queries: dict[str, str] = {}
    answers: dict[str, list[str]] = {}
    qrels: dict[str, dict[str, int]] = {}
    with open(_need(path), encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n} is not JSON ({exc.msg}); expected {FORMATS[3]}.") from exc
            text = d.get("question", d.get("query")) if isinstance(d, dict) else None
            if not isinstance(text, str):
                raise ValueError(f"{path}:{n} has no \"question\" string; expected {FORMATS[3]}.")
            qid = str(d.get("id", d.get("_id", n)))
            if qid in queries:
                raise ValueError(f"{path}:{n}: question id {qid!r} occurs twice; give every line its own id.")
            queries[qid] = text
            if d.get("answers"):
                got = d["answers"]
                answers[qid] = [got] if isinstance(got, str) else [str(a) for a in got]
            rel = d.get("relevant", d.get("relevant_docs"))
            if rel:
                qrels[qid] = ({str(k): int(v) for k, v in rel.items() if int(v) > 0} if isinstance(rel, dict)
                              else {str(x): 1 for x in ([rel] if isinstance(rel, str) else rel)})
            if qid not in answers and qid not in qrels:
                raise ValueError(f"{path}:{n}: question {qid!r} has neither \"answers\" nor \"relevant\"; "
                                 "give it at least one.")
    units: list[Unit] = []
    if corpus is not None:
        with open(_need(Path(corpus)), encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    d = json.loads(line)
                    did = str(d.get("id", d.get("_id", n)))
                    units.append(Unit(id=did, text=d["text"], level="document",
                                      metadata={"title": d.get("title") or did, "doc_id": did}))
    return EvalDataset(queries=queries, answers=answers, qrels=qrels, corpus=units, name=path.stem, format="jsonl")


def load_dataset(path: str | os.PathLike, *, split: str = "test",
                 corpus: str | os.PathLike | None = None) -> EvalDataset:
    """Load an evaluation dataset, recognising its format from the path and content.

    Supported: (1) SQuAD-format JSON (gold answers), (2) a BEIR folder (qrels; ``split`` picks
    ``qrels/<split>.tsv``), (3) the JSON of LlamaIndex's ``EmbeddingQAFinetuneDataset`` /
    ``generate_question_context_pairs``, (4) JSONL, one question a line (``corpus``: an optional
    JSONL of documents). Raises a ``ValueError`` naming these formats for anything else.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{str(p)!r} does not exist; pass one of: {_formats_help()}.")
    if p.is_dir():
        if (p / "corpus.jsonl").exists() and (p / "queries.jsonl").exists():
            return beir_dataset(p, split=split)
        raise ValueError(f"{str(p)!r} is a folder without corpus.jsonl and queries.jsonl, so not a BEIR "
                         f"dataset; pass one of: {_formats_help()}.")
    if p.suffix == ".jsonl":
        return jsonl_dataset(p, corpus=corpus)
    try:
        with open(p, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{str(p)!r} is not JSON ({exc}); pass one of: {_formats_help()}.") from exc
    if isinstance(data, dict) and isinstance(data.get("data"), list) and \
            all(isinstance(a, dict) and "paragraphs" in a for a in data["data"]):
        return squad_dataset(p)
    if isinstance(data, dict) and {"queries", "relevant_docs"} <= set(data):
        return _llamaindex_qa(data, p)
    keys = sorted(data)[:8] if isinstance(data, dict) else type(data).__name__
    raise ValueError(f"{str(p)!r} is JSON in no known layout (top level: {keys}); pass one of: {_formats_help()}.")
