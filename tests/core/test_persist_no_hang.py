"""Nothing hangs: a FIFO (or another special file) planted at one of the
persist folder's bookkeeping files (``.funnel-rag.readers``, ``.funnel-rag.journal``,
``CURRENT``, the marker) makes a save or a load fail fast with a clear error.

Each probe runs in a fresh interpreter with a timeout: a blocking ``open()`` of a FIFO would hang
the test process for ever instead of failing it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from funnel_core.bm25 import BM25Index
from funnel_core.units import Unit

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(os.name == "nt", reason="FIFOs as on POSIX")
UNITS = [Unit(id=f"d{i}", text=t) for i, t in enumerate(
    ["paris capital france", "berlin capital germany", "hamlet tragedy shakespeare"])]


def _run(path: Path, action: str, timeout: float = 20) -> str:
    """``save`` or ``load`` of a BM25 index at ``path`` in a child; its one-line verdict."""
    code = textwrap.dedent(f"""
        import time
        from funnel_core.bm25 import BM25Index
        from funnel_core.errors import PersistError
        from funnel_core.units import Unit
        ix = BM25Index().index([Unit(id="a", text="paris capital"), Unit(id="b", text="berlin")])
        t0 = time.perf_counter()
        try:
            if {action!r} == "save":
                ix.save({str(path)!r})
            else:
                BM25Index.load({str(path)!r})
        except PersistError as exc:
            print("REFUSED", round(time.perf_counter() - t0, 2), exc)
        else:
            print("DONE", round(time.perf_counter() - t0, 2))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{action} of {path} did not finish in {timeout} s: it blocks on a FIFO")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("name", [".funnel-rag.readers", ".funnel-rag.journal", "CURRENT"])
@pytest.mark.parametrize("action", ["save", "load"])
def test_a_fifo_bookkeeping_file_fails_fast(tmp_path, name, action):
    path = tmp_path / "ix"
    BM25Index().index(UNITS).save(path)
    BM25Index().index(UNITS).save(path)  # a second save: the journal and readers files exist
    f = path / name
    if os.path.lexists(f):
        os.unlink(f)
    os.mkfifo(f)
    verdict = _run(path, action)
    if action == "load" and name == ".funnel-rag.journal":  # a load reads it only to recover
        assert verdict.startswith(("DONE", "REFUSED")), verdict
        assert float(verdict.split()[1]) < 2.0, verdict
        return
    assert verdict.startswith("REFUSED"), verdict
    assert float(verdict.split()[1]) < 2.0, verdict
    assert name in verdict and ("FIFO" in verdict or "regular file" in verdict), verdict
    assert os.path.exists(f) and not f.is_file()  # left as it was: not ours to remove


def test_a_fifo_marker_fails_fast(tmp_path):
    path = tmp_path / "ix"
    BM25Index().index(UNITS).save(path)
    os.unlink(path / ".funnel-rag")
    os.mkfifo(path / ".funnel-rag")
    for action in ("save", "load"):
        verdict = _run(path, action)
        assert not verdict.startswith("DONE") or action == "load", verdict


def test_stale_journal_temp_files_of_a_killed_save_are_removed(tmp_path):
    """Kill -9 between writing the journal's temporary file and renaming it
    left a ``.funnel-rag.journal.tmp-<16 hex>`` that no later save removed. The next save
    removes ours (exact naming pattern, regular files only) and nothing else."""
    path = tmp_path / "ix"
    BM25Index().index(UNITS).save(path)
    stale = path / ".funnel-rag.journal.tmp-0123456789abcdef"
    stale.write_text("snapshot-00000001-deadbeef\n")
    foreign = [path / ".funnel-rag.journal.tmp-mine", path / ".funnel-rag.journal.tmp-0123456789ABCDEF"]
    for f in foreign:
        f.write_text("not ours")
    link = path / ".funnel-rag.journal.tmp-fedcba9876543210"
    os.symlink(tmp_path / "elsewhere", link)
    BM25Index().index(UNITS).save(path)
    assert not os.path.lexists(stale)
    assert all(f.read_text() == "not ours" for f in foreign)
    assert os.path.islink(link)  # not a regular file we wrote: left alone
    assert len(BM25Index.load(path).search("capital", k=5)) == 2
