"""load_dataset: each supported format, and errors that name the formats."""

from __future__ import annotations

import json

import pytest

from funnel_core.evaluation import EvalDataset, load_dataset

pytestmark = pytest.mark.usefixtures("ranx_loaded")  # ranx loads once per process


def test_squad_json(tmp_path):
    data = {"version": "1.1", "data": [{"title": "T", "paragraphs": [
        {"context": "Paris is in France.", "qas": [
            {"id": "a", "question": "Where is Paris?", "answers": [{"text": "France", "answer_start": 12},
                                                                    {"text": "France", "answer_start": 12}]}]},
        {"context": "Rome is in Italy.", "qas": [
            {"id": "b", "question": "Where is Rome?", "answers": [{"text": "Italy", "answer_start": 11}]}]}]}]}
    p = tmp_path / "dev.json"
    p.write_text(json.dumps(data))
    ds = load_dataset(p)
    assert ds.format == "squad" and ds.queries == {"a": "Where is Paris?", "b": "Where is Rome?"}
    assert ds.answers == {"a": ["France"], "b": ["Italy"]} and not ds.qrels  # duplicates merged
    assert [(u.id, u.metadata["title"], u.metadata["doc_id"]) for u in ds.corpus] == [("T/0", "T", "T/0"),
                                                                                       ("T/1", "T", "T/1")]


def test_beir_folder(tmp_path):
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in [
        {"_id": "d1", "title": "One", "text": "first"}, {"_id": "d2", "title": "", "text": "second"}]))
    (tmp_path / "queries.jsonl").write_text("\n".join(json.dumps(d) for d in [
        {"_id": "q1", "text": "find one"}, {"_id": "q2", "text": "unjudged"}]))
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\td2\t0\n")
    ds = load_dataset(tmp_path)
    assert ds.format == "beir" and ds.queries == {"q1": "find one"}  # only judged questions
    assert ds.qrels == {"q1": {"d1": 2}}  # grade 0 is not relevant
    assert [u.text for u in ds.corpus] == ["One\nfirst", "second"]
    with pytest.raises(FileNotFoundError, match="qrels"):
        load_dataset(tmp_path, split="dev")


def test_llamaindex_qa_json(tmp_path):
    # the layout EmbeddingQAFinetuneDataset.save_json writes (generate_question_context_pairs)
    data = {"queries": {"q1": "what is bm25?", "q2": "what is a reranker?"},
            "corpus": {"node-1": "BM25 ranks documents.", "node-2": "A reranker rescoring candidates."},
            "relevant_docs": {"q1": ["node-1"], "q2": ["node-2"]}, "mode": "text"}
    p = tmp_path / "qa.json"
    p.write_text(json.dumps(data))
    ds = load_dataset(p)
    assert ds.format == "llamaindex" and ds.qrels == {"q1": {"node-1": 1}, "q2": {"node-2": 1}}
    assert {u.id: u.text for u in ds.corpus} == data["corpus"]


def test_jsonl_with_answers_relevance_and_a_corpus(tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text("\n".join(json.dumps(d) for d in [
        {"id": "1", "question": "capital of France?", "answers": ["Paris"]},
        {"query": "who wrote Hamlet?", "relevant": ["d2"]},
        {"id": "3", "question": "graded", "relevant": {"d1": 2, "d2": 0}, "answers": "x"}]) + "\n\n")
    c = tmp_path / "c.jsonl"
    c.write_text(json.dumps({"id": "d1", "text": "Paris", "title": "P"}) + "\n" + json.dumps({"id": "d2", "text": "H"}))
    ds = load_dataset(q, corpus=c)
    assert ds.format == "jsonl" and list(ds.queries) == ["1", "2", "3"]  # line number as default id
    assert ds.answers == {"1": ["Paris"], "3": ["x"]} and ds.qrels == {"2": {"d2": 1}, "3": {"d1": 2}}
    assert [(u.id, u.metadata["title"]) for u in ds.corpus] == [("d1", "P"), ("d2", "d2")]


def test_errors_name_the_expected_formats(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="no known layout.*SQuAD.*BEIR.*LlamaIndex.*JSONL"):
        load_dataset(p)
    with pytest.raises(ValueError, match="not a BEIR dataset"):
        load_dataset(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist; pass one of"):
        load_dataset(tmp_path / "missing.json")
    bad = tmp_path / "b.jsonl"
    bad.write_text(json.dumps({"id": "1", "question": "no labels"}) + "\n")
    with pytest.raises(ValueError, match="b.jsonl:1: question '1' has neither"):
        load_dataset(bad)
    bad.write_text(json.dumps({"id": "1", "text": "wrong key", "answers": ["a"]}) + "\n")
    with pytest.raises(ValueError, match="no \"question\" string"):
        load_dataset(bad)
    with pytest.raises(ValueError, match="neither gold answers nor relevance"):
        EvalDataset(queries={"q": "x"})


def test_subset_is_seeded_and_keeps_file_order():
    ds = EvalDataset(queries={f"q{i}": str(i) for i in range(20)}, answers={f"q{i}": ["a"] for i in range(20)})
    a, b = ds.subset(5, seed=3), ds.subset(5, seed=3)
    assert a.question_ids == b.question_ids and len(a.question_ids) == 5
    assert a.question_ids == sorted(a.question_ids, key=lambda q: int(q[1:]))
    assert ds.subset(5, seed=4).question_ids != a.question_ids
    assert ds.subset(100).question_ids == ds.question_ids
