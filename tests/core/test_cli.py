"""The `funnel` command line: index a folder, query it, errors."""

import json

import pytest

from funnel_core.cli import load_folder, main

pytestmark = pytest.mark.models  # builds or loads a model in most tests


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "docs"
    (d / "sub").mkdir(parents=True)
    (d / "paris.md").write_text("# Paris\n\nParis is the capital of France. The Eiffel Tower stands in Paris.\n")
    (d / "sub" / "bm25.txt").write_text("BM25 is a ranking function. " * 80)  # long: cut into documents
    (d / "items.jsonl").write_text("\n".join(json.dumps(x) for x in [
        {"id": "h1", "title": "Hamlet", "text": "Hamlet is a tragedy by William Shakespeare."},
        {"text": "Berlin is the capital of Germany."}]) + "\n")
    (d / "image.png").write_bytes(b"\x89PNG")  # ignored
    return d


def test_load_folder(folder):
    units = load_folder(folder, words=100, show_progress=False)
    ids = {u.id for u in units}
    assert {"h1", "items.jsonl:1", "paris.md#0"} <= ids
    assert sum(u.metadata["source"] == "sub/bm25.txt" for u in units) >= 4  # 400 words -> ~100-word docs
    assert all(u.level == "document" for u in units)


def test_index_then_query(folder, tmp_path, capsys):
    out = tmp_path / "idx"
    assert main(["index", str(folder), "--out", str(out), "--words", "100"]) == 0
    assert "clusters" in capsys.readouterr().out
    assert main(["query", str(out), "Where is the Eiffel Tower?", "-k", "2"]) == 0
    printed = capsys.readouterr().out
    assert "1. [paris.md]" in printed and "clustered_bm25" in printed and "total" in printed


def test_errors(tmp_path, capsys):
    assert main(["index", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 1
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["index", str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == 1
    assert "no .txt" in capsys.readouterr().err
    assert main(["query", str(tmp_path / "nope"), "q"]) == 1
    assert "no clustered BM25 index at" in capsys.readouterr().err


def test_no_bench_command_in_the_installed_cli(capsys):
    """Benchmarks are repository scripts; the installed command does not reach for them."""
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "bm25"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'bench'" in capsys.readouterr().err
