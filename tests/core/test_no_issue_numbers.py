"""Code, tests, docs and benchmarks say what they do, not which internal issue asked for it.

An internal tracker number (an issue's number and item, a defect's number) means nothing to a
reader of the repository. The check covers the tracked files of the paths below (the same set
as ``git grep -nE PATTERN -- PATHS``); recorded benchmark results (``benchmarks/results``) are
data and are left out, as is this file.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATTERN = re.compile(r"[Ii]ssues? ?#?[0-9]+|[Dd]efects? [0-9]+ of issue")
PATHS = ("funnel_core", "llama_index_funnel", "langchain_funnel", "tests", "docs", "README.md",
         "benchmarks/*.py", "benchmarks/configs", "benchmarks/train", "scripts", "examples", "Makefile")
SUFFIXES = (".py", ".md", ".toml", ".ipynb")


def _tracked_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    out = subprocess.run(["git", "ls-files", "-z", "--", *PATHS], cwd=ROOT, capture_output=True,
                         check=True).stdout.decode("utf-8")
    files = []
    for name in filter(None, out.split("\0")):
        path = ROOT / name
        if path.resolve() == Path(__file__).resolve() or name.startswith("benchmarks/results/"):
            continue
        if (path.suffix in SUFFIXES or path.name == "Makefile") and path.is_file():
            files.append(path)
    return files


def test_the_pattern_catches_the_spellings_used_before():
    # the spellings are built here (not written out) so that this file cites no number itself
    for text in ("Issue {} item 10", "issue {}", "(issue {})", "Defect 4 of issue {}",
                 "before issue {} moved", "issues {} and 18", "issue #{}"):
        assert PATTERN.search(text.format(28)), text
    for text in ("an issue with ids", "the issue tracker", "item 6", "the 2 defects of a run"):
        assert not PATTERN.search(text), text


def test_no_tracked_file_cites_an_issue_number():
    files = _tracked_files()
    assert any(p.name == "README.md" for p in files) and any(p.suffix == ".py" for p in files), \
        "no file listed: the paths no longer match the repository layout"
    hits = [f"{p.relative_to(ROOT).as_posix()}:{n}: {line.strip()}"
            for p in files
            for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if PATTERN.search(line)]
    assert hits == [], ("say what the code, test or benchmark does instead of citing an internal "
                        "issue number:\n" + "\n".join(hits))
