"""benchmarks/common.py: the helpers several benchmark scripts share."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from common import interleaved_seconds, merge_rows, qps, save_json, synthetic_search, timed, vocabulary  # noqa: E402


def test_interleaved_seconds_warms_up_then_takes_turns():
    calls: list[str] = []
    times = interleaved_seconds({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3)
    assert calls == ["a", "b"] + ["a", "b"] * 3          # one warm-up call each, not timed, then rounds
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3}
    assert all(s >= 0 for v in times.values() for s in v)


def test_save_json_replaces_the_file_whole(tmp_path):
    path = tmp_path / "sub" / "r.json"
    save_json(path, {"x": 1})
    save_json(path, {"x": 2})
    assert json.loads(path.read_text()) == {"x": 2}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]     # no temporary file left behind


def test_synthetic_search_is_seeded_and_draws_queries_from_its_documents():
    words = [a + b + c for a in "abcdefg" for b in "abcdefg" for c in "abcdefg"]  # 343 words, >= 150 per topic
    texts = [" ".join(words[i:i + 40]) + " 42 x1" for i in range(0, len(words), 40)]
    assert vocabulary(texts) == sorted(words)                             # alphabetic words only
    docs, queries = synthetic_search(texts, 50, 5)
    assert (docs, queries) == synthetic_search(texts, 50, 5) and len(docs) == 50 and len(queries) == 5
    assert all(len(d.split()) == 100 and set(d.split()) <= set(words) for d in docs)
    assert all(len(q.split()) == 8 and any(set(q.split()) <= set(d.split()) for d in docs) for q in queries)


def test_merge_rows_replaces_rows_of_the_same_key_and_keeps_the_others():
    old = [{"n": 1, "s": 1.0}, {"n": 2, "s": 2.0}]
    assert merge_rows(old, [{"n": 2, "s": 9.0}, {"n": 3, "s": 3.0}], lambda r: r["n"]) == [
        {"n": 1, "s": 1.0}, {"n": 2, "s": 9.0}, {"n": 3, "s": 3.0}]
    assert merge_rows([], [], lambda r: r["n"]) == [] and old == [{"n": 1, "s": 1.0}, {"n": 2, "s": 2.0}]


def test_timed_returns_the_result_and_stores_its_seconds():
    out: dict = {}
    assert timed(out, "build_seconds", lambda: "index") == "index"
    assert list(out) == ["build_seconds"] and out["build_seconds"] >= 0


def test_qps_calls_each_query_or_each_batch_once():
    seen: list = []
    assert qps(seen.append, ["a", "b", "c"]) > 0 and seen == ["a", "b", "c"]
    seen.clear()
    assert qps(seen.append, ["a", "b", "c"], batch=2) > 0 and seen == [["a", "b"], ["c"]]
