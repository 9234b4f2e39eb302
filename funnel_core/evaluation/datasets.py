"""Loaders: BEIR folders (corpus.jsonl, queries.jsonl, qrels/*.tsv), SQuAD-format JSON, the JSON of
LlamaIndex's EmbeddingQAFinetuneDataset and a simple JSONL; :func:`load_dataset` recognises each and
returns one :class:`EvalDataset`. They take a path; nothing is downloaded.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from funnel_core.errors import FunnelError
from funnel_core.units import Unit

__all__ = ["BeirDataset", "load_beir", "SquadQuestion", "SquadArticle", "load_squad", "squad_question_id",
           "EvalDataset", "FORMATS", "DatasetError", "load_dataset", "squad_dataset", "beir_dataset", "llamaindex_qa_dataset",
           "jsonl_dataset", "with_distractors", "questions_over"]


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


class DatasetError(FunnelError, ValueError):
    """A dataset file that does not follow its format; the message names the file, line and field."""


def _jsonl_objects(path: Path, expected: str):  # type: ignore[no-untyped-def]
    """``(line number, dict)`` for every non-blank line of the JSONL file ``path``; a line that is
    not UTF-8, not JSON or not an object is refused with its file and line."""
    _check_file(path)
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetError(f"{path}:{n}: not UTF-8 text ({exc.reason} at byte {exc.start} of the line); "
                                   "save the file as UTF-8.") from exc
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{n} is not JSON ({exc.msg}); expected {expected}.") from exc
            if not isinstance(d, dict):
                raise DatasetError(f"{path}:{n} is JSON {type(d).__name__}, not an object; expected {expected}.")
            yield n, d


def _check_file(path: Path) -> None:
    """A dataset file must be a regular file (a FIFO would block the read)."""
    _need(path)
    if not path.is_file():
        raise DatasetError(f"{str(path)!r} is not a regular file (a folder, FIFO or device); pass a dataset file.")


def _read_json(path: Path) -> object:
    _check_file(path)
    raw = path.read_bytes()
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DatasetError(f"{path}:{line}: not UTF-8 text ({exc.reason}); save the file as UTF-8.") from exc
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}:{exc.lineno}:{exc.colno} is not JSON ({exc.msg}).") from exc


def _an_id(v: object, where: str, field: str) -> str:
    """An id is a non-empty string or an integer (never a boolean, float, list or null)."""
    if isinstance(v, str) and v.strip():
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    raise DatasetError(f"{where}: {field} must be a non-empty string or an integer id, got {v!r}.")


def _a_text(v: object, where: str, field: str) -> str:
    if not isinstance(v, str):
        raise DatasetError(f"{where}: {field} must be a string, got {v!r}.")
    return v


def _a_grade(v: object, where: str, field: str, negative_ok: bool = False) -> int:
    """A relevance grade is an integer >= 0 (never a float, boolean or string)."""
    if isinstance(v, int) and not isinstance(v, bool) and (negative_ok or v >= 0):
        return v
    raise DatasetError(f"{where}: {field} must be an integer grade >= 0, got {v!r} ({type(v).__name__}).")


def _first_occurrence(first_line: dict[str, int], key: str, n: int, where: str, what: str) -> None:
    """Record that ``key`` (a ``what``: "question id", "document _id", ...) is on line ``n``; a key seen
    before raises naming both lines."""
    if key in first_line:
        raise DatasetError(f"{where}: {what} {key!r} occurs twice (first at line {first_line[key]}); every "
                           f"{what} must be unique.")
    first_line[key] = n


def load_beir(path: str | os.PathLike, split: str = "test", title_in_text: bool = True) -> BeirDataset:
    """Load a BEIR dataset. Corpus units are documents with ``metadata["title"]``.

    ``title_in_text`` prepends the title to the text, as BEIR's BM25 baselines index it.
    """
    path = Path(path)
    corpus = []
    doc_line: dict[str, int] = {}
    f = path / "corpus.jsonl"
    for n, d in _jsonl_objects(f, 'one {"_id", "title", "text"} a line'):
        where = f"{f}:{n}"
        did = _an_id(d.get("_id"), where, "_id")
        _first_occurrence(doc_line, did, n, where, "document _id")
        body = _a_text(d.get("text"), where, "text")
        title = d.get("title")
        title = _a_text(title, where, "title") if title is not None else ""
        text = f"{title}\n{body}" if title and title_in_text else body
        corpus.append(Unit(id=did, text=text, metadata={"title": title, "doc_id": did}, level="document"))
    queries: dict[str, str] = {}
    query_line: dict[str, int] = {}
    f = path / "queries.jsonl"
    for n, d in _jsonl_objects(f, 'one {"_id", "text"} a line'):
        where = f"{f}:{n}"
        qid = _an_id(d.get("_id"), where, "_id")
        _first_occurrence(query_line, qid, n, where, "query _id")
        queries[qid] = _a_text(d.get("text"), where, "text")
    qrels: dict[str, dict[str, int]] = {}
    judged: dict[tuple[str, str], tuple[int, int]] = {}
    f = _need(path / "qrels" / f"{split}.tsv")
    _check_file(f)
    with open(f, "rb") as fh:
        for n, raw in enumerate(fh, 1):
            where = f"{f}:{n}"
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                raise DatasetError(f"{where}: not UTF-8 text ({exc.reason}).") from exc
            if not line.strip():
                continue
            row = line.split("\t")
            if n == 1 and row[0] == "query-id":
                continue
            if len(row) != 3:
                raise DatasetError(f"{where}: {len(row)} tab-separated field(s) where a qrels row has 3 "
                                   "(query-id, corpus-id, score).")
            qid, did = _an_id(row[0], where, "query-id"), _an_id(row[1], where, "corpus-id")
            try:
                rel = int(row[2])
            except ValueError:
                raise DatasetError(f"{where}: score {row[2]!r} is not an integer grade.") from None
            if (qid, did) in judged and judged[(qid, did)][0] != rel:
                raise DatasetError(f"{where}: ({qid!r}, {did!r}) is judged twice with different scores (also at "
                                   f"line {judged[(qid, did)][1]}).")
            judged[(qid, did)] = (rel, n)
            if rel > 0:  # 0 and, as in trec_eval, negative grades: judged not relevant
                if qid not in queries:
                    raise DatasetError(f"{where}: query-id {qid!r} is not in {path / 'queries.jsonl'}.")
                if did not in doc_line:
                    raise DatasetError(f"{where}: corpus-id {did!r} is not in {path / 'corpus.jsonl'}.")
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
    top = _read_json(path)
    data = top.get("data") if isinstance(top, dict) else None
    if not isinstance(data, list):
        raise DatasetError(f"{path}: no \"data\" list at the top level; expected SQuAD v1.1 JSON.")

    def need(obj: object, key: str, kind: type, where: str) -> Any:
        v = obj.get(key) if isinstance(obj, dict) else None
        if not isinstance(v, kind) or isinstance(v, bool):
            raise DatasetError(f"{path}: {where}.{key} must be a {kind.__name__}, got {v!r}.")
        return v

    articles = []
    seen: dict[str, str] = {}
    for ai, art in enumerate(data):
        aw = f"data[{ai}]"
        title = need(art, "title", str, aw)
        a = SquadArticle(title=title, paragraphs=[])
        for pi, para in enumerate(need(art, "paragraphs", list, aw)):
            pw = f"{aw}.paragraphs[{pi}]"
            a.paragraphs.append(need(para, "context", str, pw))
            for qi, qa in enumerate(need(para, "qas", list, pw)):
                qw = f"{pw}.qas[{qi}]"
                texts = []
                for j, x in enumerate(need(qa, "answers", list, qw)):
                    t = x.get("text") if isinstance(x, dict) else None
                    if not isinstance(t, str) or not t.strip():
                        raise DatasetError(f"{path}: {qw}.answers[{j}].text must be a non-empty string, got "
                                           f"{t if isinstance(x, dict) else x!r}.")
                    texts.append(t)
                answers = sorted(set(texts))
                question = need(qa, "question", str, qw)
                raw_id = qa.get("id")
                qid = _an_id(raw_id, f"{path}: {qw}", "id") if raw_id not in (None, "") else \
                    squad_question_id(title, pi, qi)  # type: ignore[arg-type]
                if qid in seen:
                    raise DatasetError(f"{path}: question id {qid!r} occurs twice (at {seen[qid]} and at "
                                       f"{title!r} paragraph {pi} question {qi}); give the questions "
                                       "distinct ids or drop the duplicate article.")
                seen[qid] = f"{title!r} paragraph {pi} question {qi}"
                a.questions.append(SquadQuestion(id=qid, question=question,  # type: ignore[arg-type]
                                                 answers=answers, article=title,  # type: ignore[arg-type]
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

    def subset(self, n: int | None = None, seed: int = 0, offset: int | None = None) -> "EvalDataset":
        """A seeded random sample of ``n`` labelled questions (all when ``n`` is ``None`` or
        larger), in file order; the corpus is shared. With ``offset``, the sample is positions
        ``offset .. offset + n - 1`` of one seeded shuffle of all the labelled questions, so the
        samples of one seed at offsets 0, n, 2n, ... are disjoint (a held-out set beside a
        reported one)."""
        import random

        ids = self.question_ids
        if offset is not None:
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ValueError(f"offset must be an integer >= 0, got {offset!r}.")
            order = random.Random(seed).sample(ids, len(ids))
            if offset >= len(order):
                raise ValueError(f"offset {offset} leaves no question: dataset {self.name!r} has {len(order)} "
                                 "labelled questions; use a smaller offset.")
            keep = set(order[offset:] if n is None else order[offset:offset + n])
            ids = [q for q in ids if q in keep]
        elif n is not None and n < len(ids):
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


def with_distractors(dataset: EvalDataset, paths: list[str | os.PathLike]) -> EvalDataset:
    """``dataset`` with the corpus units (SQuAD paragraphs, BEIR documents, ...) of every file in
    ``paths`` appended to its corpus, in order; their questions are not taken. A unit id that is
    already in the corpus (the same file given twice, or two files sharing an article title) is
    refused, since a question's gold document must name one unit."""
    corpus = list(dataset.corpus)
    where = {u.id: dataset.name for u in corpus}
    for path in paths:
        extra = load_dataset(path)
        if not extra.corpus:
            raise DatasetError(f"distractor file {str(path)!r} has no corpus (a JSONL question file carries "
                               "none); pass a SQuAD JSON or a BEIR folder, whose paragraphs/documents join the "
                               "corpus.")
        for u in extra.corpus:
            if u.id in where:
                raise DatasetError(f"distractor file {str(path)!r}: unit id {u.id!r} is already in the corpus "
                                   f"(from {where[u.id]!r}); give each file once, and files whose ids differ "
                                   "(SQuAD ids are '<article title>/<paragraph>').")
            where[u.id] = str(path)
            corpus.append(u)
    return EvalDataset(queries=dict(dataset.queries), answers=dict(dataset.answers), qrels=dict(dataset.qrels),
                       corpus=corpus, name=dataset.name, format=dataset.format)


def questions_over(source: EvalDataset, corpus_of: EvalDataset, *, name: str) -> EvalDataset:
    """The questions and labels of ``source`` over the corpus of ``corpus_of`` (tuning questions
    from another file, searched in the evaluated corpus). Refused when a unit of ``source``'s
    own corpus (where its answers are) is missing from that corpus, or when a question text is
    also among ``corpus_of``'s questions (tuning on what is reported)."""
    ids = {u.id for u in corpus_of.corpus}
    missing = [u.id for u in source.corpus if u.id not in ids]
    missing += sorted({d for rel in source.qrels.values() for d in rel if d not in ids} - set(missing))
    if missing:
        raise DatasetError(f"tuning questions {source.name!r}: {len(missing)} of their documents are not in the "
                           f"evaluated corpus (e.g. {missing[0]!r}); add their file to [dataset] distractors so "
                           "that tuning searches the corpus the evaluation searches.")
    reported = {" ".join(corpus_of.queries[q].lower().split()) for q in corpus_of.question_ids}
    shared = [q for q in source.question_ids if " ".join(source.queries[q].lower().split()) in reported]
    if shared:
        raise DatasetError(f"tuning questions {source.name!r}: {len(shared)} are among the evaluated questions "
                           f"(e.g. {source.queries[shared[0]]!r}); tune on questions the evaluation does not "
                           "report.")
    return EvalDataset(queries=dict(source.queries), answers=dict(source.answers), qrels=dict(source.qrels),
                       corpus=corpus_of.corpus, name=name, format=source.format)


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
    data = _read_json(Path(path))
    if not isinstance(data, dict):
        raise DatasetError(f"{path}: the top level is not an object; expected {FORMATS[2]}.")
    return _llamaindex_qa(data, Path(path))


def _llamaindex_qa(data: dict, path: Path) -> EvalDataset:
    def mapping(key: str, required: bool) -> dict:
        v = data.get(key)
        if v is None and not required:
            return {}
        if not isinstance(v, dict):
            raise DatasetError(f"{path}: {key} must be an object, got {type(v).__name__}; expected {FORMATS[2]}.")
        return v

    texts = mapping("corpus", False)
    corpus = [Unit(id=str(nid), text=_a_text(text, f"{path}", f"corpus[{nid!r}]"),
                   metadata={"doc_id": str(nid), "title": str(nid)}) for nid, text in texts.items()]
    queries = {str(q): _a_text(t, f"{path}", f"queries[{q!r}]") for q, t in mapping("queries", True).items()}
    qrels: dict[str, dict[str, int]] = {}
    for q, docs in mapping("relevant_docs", True).items():
        where = f"relevant_docs[{q!r}]"
        if isinstance(docs, str):
            docs = [docs]
        if not isinstance(docs, list):
            raise DatasetError(f"{path}: {where} must be a list of node ids, got {docs!r}.")
        if q not in queries:
            raise DatasetError(f"{path}: {where} names a question that is not in queries.")
        for d in docs:
            did = _an_id(d, str(path), where)
            if texts and did not in texts:
                raise DatasetError(f"{path}: {where} names node {did!r}, which is not in corpus.")
            qrels.setdefault(str(q), {})[did] = 1
    return EvalDataset(queries=queries, qrels=qrels, corpus=corpus, name=path.stem, format="llamaindex")


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
    line_of: dict[str, int] = {}
    for n, d in _jsonl_objects(path, FORMATS[3]):
        where = f"{path}:{n}"
        text = d.get("question", d.get("query"))
        if not isinstance(text, str):
            raise DatasetError(f"{where} has no \"question\" string; expected {FORMATS[3]}.")
        raw_id = d.get("id", d.get("_id"))
        qid = str(n) if raw_id is None else _an_id(raw_id, where, "id")
        _first_occurrence(line_of, qid, n, where, "question id")
        queries[qid] = text
        got = d.get("answers")
        if got is not None and got != []:
            items = [got] if isinstance(got, str) else got
            if not isinstance(items, list) or not all(isinstance(a, str) and a.strip() for a in items):
                raise DatasetError(f"{where}: answers must be a non-empty string or a list of them, got {got!r}; "
                                   "e.g. \"answers\": [\"Paris\"].")
            answers[qid] = list(items)
        rel = d.get("relevant", d.get("relevant_docs"))
        if rel is not None and rel != [] and rel != {}:
            field_name = "relevant" if "relevant" in d else "relevant_docs"
            if isinstance(rel, dict):
                graded = {_an_id(k, where, f"{field_name} key"):
                          _a_grade(v, where, f"{field_name}[{k!r}]") for k, v in rel.items()}
            elif isinstance(rel, (str, list)):
                graded = {_an_id(x, where, f"{field_name} entry"): 1 for x in ([rel] if isinstance(rel, str) else rel)}
            else:
                raise DatasetError(f"{where}: {field_name} must be a list of document ids or a {{doc id: grade}} "
                                   f"object, got {rel!r}.")
            graded = {k: v for k, v in graded.items() if v > 0}
            if graded:
                qrels[qid] = graded
        if qid not in answers and qid not in qrels:
            raise DatasetError(f"{where}: question {qid!r} has neither \"answers\" nor \"relevant\"; "
                               "give it at least one.")
    units: list[Unit] = []
    if corpus is not None:
        corpus = Path(corpus)
        doc_line: dict[str, int] = {}
        for n, d in _jsonl_objects(corpus, 'one {"id", "text", "title"} a line'):
            where = f"{corpus}:{n}"
            raw_id = d.get("id", d.get("_id"))
            did = str(n) if raw_id is None else _an_id(raw_id, where, "id")
            _first_occurrence(doc_line, did, n, where, "document id")
            body = _a_text(d.get("text"), where, "text")
            title = d.get("title")
            if title is not None:
                _a_text(title, where, "title")
            units.append(Unit(id=did, text=body, level="document", metadata={"title": title or did, "doc_id": did}))
        for qid, docs in qrels.items():
            for did in docs:
                if did not in doc_line:
                    raise DatasetError(f"{path}:{line_of[qid]}: relevant document {did!r} of question {qid!r} is "
                                       f"not in the corpus {str(corpus)!r}.")
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
        data = _read_json(p)
    except DatasetError as exc:
        raise DatasetError(f"{exc} Pass one of: {_formats_help()}.") from exc
    if isinstance(data, dict) and isinstance(data.get("data"), list) and \
            all(isinstance(a, dict) and "paragraphs" in a for a in data["data"]):
        return squad_dataset(p)
    if isinstance(data, dict) and {"queries", "relevant_docs"} <= set(data):
        return _llamaindex_qa(data, p)
    keys = sorted(data)[:8] if isinstance(data, dict) else type(data).__name__
    raise ValueError(f"{str(p)!r} is JSON in no known layout (top level: {keys}); pass one of: {_formats_help()}.")
