"""Loading never follows a symbolic link, never reads past a file's declared size, never blocks
on a FIFO, and checks the loaded BM25 score matrix structurally before any query touches it.

Each probe runs the load in a subprocess with a timeout where the wrong implementation would
hang (``/dev/zero``, a FIFO) or crash the interpreter (numba over a damaged ``indptr``), so a
regression fails the test instead of killing pytest. Wrong implementations caught: a loader
that opens files by path with ``open()`` (follows links, blocks on FIFOs), one that compares the
size only after reading the whole file, and one that trusts ``indptr``/``indices``/vocabulary
ids because the checksums matched (or ``verify=False``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from funnel_core.bm25 import BM25Index
from funnel_core.errors import PersistError
from funnel_core.persist import snapshot_info
from funnel_core.units import Unit

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(os.name == "nt", reason="symlinks and FIFOs as on POSIX")


def _saved(path: Path, backend: str = "numpy") -> Path:
    units = [Unit(id=f"d{i}", text=t) for i, t in enumerate(
        ["paris capital france", "berlin capital germany", "hamlet tragedy shakespeare",
         "bm25 ranks documents", "dense vectors neural network"])]
    BM25Index(engine=backend).index(units).save(path)
    return path / snapshot_info(path)["snapshot"]


def _load_in_subprocess(path: Path, *, verify: bool, backend: str = "numpy", timeout: float = 60) -> str:
    """Load (and query) in a fresh interpreter; return its one-line verdict. A hang or a crash
    (SIGSEGV) fails the test with what the child printed."""
    code = textwrap.dedent(f"""
        from funnel_core.bm25 import BM25Index
        from funnel_core.errors import PersistError
        try:
            ix = BM25Index.load({str(path)!r}, engine={backend!r}, verify={verify!r})
        except PersistError as exc:
            print("REFUSED", exc)
        else:
            print("LOADED", [(u.id, u.score) for u in ix.search("capital tragedy documents", k=3)])
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_THREADING_LAYER": "workqueue"}
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading {path} did not finish in {timeout} s (it reads forever or blocks)")
    assert proc.returncode == 0, f"the load crashed the process (rc {proc.returncode}): {proc.stderr[-2000:]}"
    return proc.stdout.strip().splitlines()[-1]


def test_a_symlinked_snapshot_folder_is_refused(tmp_path):
    snap = _saved(tmp_path / "ix")
    outside = tmp_path / "elsewhere"
    shutil.move(snap, outside)
    os.symlink(outside, snap)
    with pytest.raises(PersistError, match="symbolic link.*never follows"):
        BM25Index.load(tmp_path / "ix")
    with pytest.raises(PersistError, match="symbolic link"):
        snapshot_info(tmp_path / "ix")


@pytest.mark.parametrize("verify", [True, False])
def test_a_symlinked_file_is_refused_even_with_equal_contents(tmp_path, verify):
    snap = _saved(tmp_path / "ix")
    for rel in ("units.jsonl", "bm25s/indptr.csc.index.npy"):
        target = tmp_path / ("copy-" + rel.replace("/", "-"))
        shutil.copy(snap / rel, target)  # same bytes: the checksum alone would pass
        os.unlink(snap / rel)
        os.symlink(target, snap / rel)
        with pytest.raises(PersistError, match="symbolic link"):
            BM25Index.load(tmp_path / "ix", verify=verify)
        os.unlink(snap / rel)
        shutil.copy(target, snap / rel)
    assert len(BM25Index.load(tmp_path / "ix", verify=verify)) == 5


@pytest.mark.parametrize("verify", [True, False])
def test_dev_zero_and_a_fifo_are_refused_without_reading(tmp_path, verify):
    snap = _saved(tmp_path / "zero")
    os.unlink(snap / "units.jsonl")
    os.symlink("/dev/zero", snap / "units.jsonl")
    assert _load_in_subprocess(tmp_path / "zero", verify=verify, timeout=30).startswith("REFUSED")
    snap = _saved(tmp_path / "fifo")
    os.unlink(snap / "units.jsonl")
    os.mkfifo(snap / "units.jsonl")
    verdict = _load_in_subprocess(tmp_path / "fifo", verify=verify, timeout=30)
    assert verdict.startswith("REFUSED") and "not a regular file" in verdict
    # the pointer file itself as a FIFO
    fifo_ptr = tmp_path / "ptr"
    _saved(fifo_ptr)
    os.unlink(fifo_ptr / "CURRENT")
    os.mkfifo(fifo_ptr / "CURRENT")
    assert _load_in_subprocess(fifo_ptr, verify=verify, timeout=30).startswith("REFUSED")


@pytest.mark.parametrize("verify", [True, False])
def test_a_file_longer_than_declared_is_refused(tmp_path, verify):
    snap = _saved(tmp_path / "ix")
    with open(snap / "units.jsonl", "ab") as f:
        f.write(b"x" * 10_000)
    with pytest.raises(PersistError, match=r"checksum mismatch.*units.jsonl.*bytes"):
        BM25Index.load(tmp_path / "ix", verify=verify)


def _damage(snap: Path, how: str) -> None:
    d = snap / "bm25s"
    indptr = np.load(d / "indptr.csc.index.npy")
    indices = np.load(d / "indices.csc.index.npy")
    data = np.load(d / "data.csc.index.npy")
    if how == "indptr_huge":
        indptr[len(indptr) // 2] = 1 << 40
    elif how == "indptr_decreasing":
        indptr[1], indptr[2] = indptr[2], indptr[1] - 1
    elif how == "indptr_short_end":
        indptr[-1] = len(data) - 2
    elif how == "indices_negative":
        indices[0] = -7
    elif how == "indices_out_of_range":
        indices[-1] = 10**6
    elif how == "data_nan":
        data[0] = np.nan
    elif how == "vocab_id_out_of_range":
        vocab = json.loads((d / "vocab.index.json").read_text())
        vocab[next(t for t in vocab if t)] = len(indptr) + 5
        (d / "vocab.index.json").write_text(json.dumps(vocab))
    np.save(d / "indptr.csc.index.npy", indptr, allow_pickle=False)
    np.save(d / "indices.csc.index.npy", indices, allow_pickle=False)
    np.save(d / "data.csc.index.npy", data, allow_pickle=False)


DAMAGES = ["indptr_huge", "indptr_decreasing", "indptr_short_end", "indices_negative",
           "indices_out_of_range", "data_nan", "vocab_id_out_of_range"]


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_score_matrix_is_refused_with_numpy(tmp_path, how):
    """verify=False stands for a tampered folder whose checksums were recomputed."""
    snap = _saved(tmp_path / "ix")
    _damage(snap, how)
    with pytest.raises(PersistError, match="damaged"):
        BM25Index.load(tmp_path / "ix", verify=False)


@pytest.mark.slow  # numba compiles for ~10 s in a fresh process
def test_a_damaged_score_matrix_never_crashes_numba(tmp_path):
    pytest.importorskip("numba")
    for how in ("indptr_huge", "indices_negative", "vocab_id_out_of_range"):
        snap = _saved(tmp_path / how, backend="numba")
        _damage(snap, how)
        verdict = _load_in_subprocess(tmp_path / how, verify=False, backend="numba", timeout=240)
        assert verdict.startswith("REFUSED") and "damaged" in verdict, (how, verdict)


def _forge(path: Path, rel: str, array: np.ndarray) -> None:
    """What a tamperer can do: replace one file of the committed snapshot and re-hash it in the
    manifest and the pointer (so checksums and sizes all verify)."""
    import hashlib

    from funnel_core.persist import commit as persist_commit

    ptr = persist_commit._read_pointer(path, "x")
    snap = path / ptr["snapshot"]
    np.save(snap / rel, array, allow_pickle=False)
    manifest = json.loads((snap / "manifest.json").read_text())
    raw = (snap / rel).read_bytes()
    manifest["files"][rel] = {"sha256": hashlib.sha256(raw).hexdigest(), "size": len(raw)}
    data = json.dumps(manifest).encode()
    (snap / "manifest.json").write_bytes(data)
    ptr["manifest_sha256"] = hashlib.sha256(data).hexdigest()
    (path / "CURRENT").write_bytes(persist_commit._pointer_bytes(ptr))


_NONOCC = "bm25s/nonoccurrence_array.index.npy"


@pytest.mark.parametrize("method", ["bm25l", "bm25+"])
@pytest.mark.parametrize("how", ["truncated", "two_d", "nan", "ints"])
def test_a_damaged_non_occurrence_array_is_refused_at_load_naming_the_file(tmp_path, method, how):
    """A bm25l / bm25+ index adds one non-occurrence score per query token: a truncated or
    reshaped array used to load and then fail at query time with an IndexError (or add the wrong
    scores); it is refused at load, naming the file."""
    units = [Unit(id=f"d{i}", text=t) for i, t in enumerate(
        ["paris capital france", "berlin capital germany", "hamlet tragedy shakespeare"])]
    BM25Index(method=method).index(units).save(tmp_path / "ix")
    arr = np.load(tmp_path / "ix" / snapshot_info(tmp_path / "ix")["snapshot"] / _NONOCC)
    forged = {"truncated": arr[:2], "two_d": np.stack([arr, arr]), "nan": np.where(arr == arr, np.nan, arr),
              "ints": arr.astype(np.int64)}[how]
    _forge(tmp_path / "ix", _NONOCC, forged)
    with pytest.raises(PersistError, match=r"non-occurrence scores .*nonoccurrence_array\.index\.npy.* damaged"):
        BM25Index.load(tmp_path / "ix").search("capital tragedy", k=2)


@pytest.mark.slow  # numba compiles its kernels on first use in a process
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_scores_stored_as_float16_or_float64_load_for_the_numba_engine(tmp_path, dtype):
    """bm25s writes float16 scores when asked (dtype=); numba has no float16 kernels and raised
    NotImplementedError at the first query. A loaded folder's scores are read as float32 for
    both engines, which then agree."""
    pytest.importorskip("numba")
    snap = _saved(tmp_path / "ix")
    rel = "bm25s/data.csc.index.npy"
    _forge(tmp_path / "ix", rel, np.load(snap / rel).astype(dtype))
    q = "capital tragedy documents"
    want = [(u.id, u.score) for u in BM25Index.load(tmp_path / "ix", engine="numpy").search(q, k=3)]
    got = [(u.id, u.score) for u in BM25Index.load(tmp_path / "ix", engine="numba").search(q, k=3)]
    assert want and got == want
