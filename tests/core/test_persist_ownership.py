"""Ownership is recorded, not guessed: a save removes only what its own records (the journal,
the previous pointer) say it wrote; one folder holds one object; a lost ``CURRENT`` is
recovered, never deleted; a commit whose final folder fsync fails still reports success.

Wrong implementations caught: a clean-up that deletes every entry *named* like ours (the
issue's ``snapshot-00000099-deadbeef/`` and ``.tmp-<16 hex>``, contents and all); a save that
replaces a different kind of index; two LlamaIndex retrievers silently sharing one sub-folder;
a loader that says "nothing was ever committed" next to a verified snapshot, and a save that
then deletes it; an ``OSError`` raised after the pointer swap although the save committed.
"""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest

from funnel_core.bm25 import BM25Index
from funnel_core.embeddings import DenseIndex, SentenceEmbedder
from funnel_core.errors import PersistError
from funnel_core.persist import commit as persist_commit
from funnel_core.units import Unit


def _units(n=4):
    return [Unit(id=f"d{i}", text=t) for i, t in enumerate(
        ["paris capital france", "berlin capital germany", "hamlet tragedy", "bm25 ranking",
         "dense vectors", "cross encoder"][:n])]


def _ids(ix):
    return sorted(u.id for u in ix.units)


def test_a_save_never_removes_user_entries_that_look_like_ours(tmp_path):
    path = tmp_path / "ix"
    BM25Index().index(_units(3)).save(path)
    lookalikes = ["snapshot-00000099-deadbeef", ".tmp-0123456789abcdef"]
    for name in lookalikes:
        (path / name).mkdir()
        (path / name / "mine.txt").write_text("user data")
    (path / ".CURRENT.tmp-0123456789abcdef").write_text("user data")
    BM25Index().index(_units(4)).save(path)
    for name in lookalikes:
        assert (path / name / "mine.txt").read_text() == "user data"
    assert (path / ".CURRENT.tmp-0123456789abcdef").read_text() == "user data"
    # the user's snapshot-00000099 is numbered above ours: our next one is 100, and loads
    # still read what CURRENT names
    assert _ids(BM25Index.load(path)) == ["d0", "d1", "d2", "d3"]


def test_what_a_killed_save_left_behind_is_removed_by_the_next(tmp_path, monkeypatch):
    path = tmp_path / "ix"
    BM25Index().index(_units(2)).save(path)

    def die(step):
        if step == "snapshot_renamed":
            raise KeyboardInterrupt  # killed between the rename and the pointer swap

    monkeypatch.setattr(persist_commit, "_step_hook", die)
    with pytest.raises(KeyboardInterrupt):
        BM25Index().index(_units(3)).save(path)
    monkeypatch.setattr(persist_commit, "_step_hook", None)
    orphans = [e for e in os.listdir(path) if e.startswith("snapshot-")]
    assert len(orphans) == 2  # the committed one and the orphan
    assert _ids(BM25Index.load(path)) == ["d0", "d1"]
    BM25Index().index(_units(4)).save(path)
    assert [e for e in os.listdir(path) if e.startswith("snapshot-")] == [persist_commit.snapshot_info(path)["snapshot"]]


def test_a_save_over_another_kind_of_index_is_refused(tmp_path):
    path = tmp_path / "ix"
    BM25Index().index(_units(3)).save(path)
    rng = np.random.default_rng(0)
    dense = DenseIndex(SentenceEmbedder("unused-model")).index(
        _units(3), embeddings=rng.normal(size=(3, 4)).astype(np.float32))
    with pytest.raises(PersistError, match=r"refusing to save a 'funnel-rag.dense'.*holds a 'funnel-rag.bm25'.*another folder"):
        dense.save(path)
    assert _ids(BM25Index.load(path)) == ["d0", "d1", "d2"]


def test_a_lost_current_is_recovered_from_the_newest_verified_snapshot_and_never_deleted(tmp_path):
    path = tmp_path / "ix"
    BM25Index().index(_units(2)).save(path)
    readers = persist_commit._readers_lock(path, blocking=True, shared=True)  # a reader holds snapshot 1
    try:
        BM25Index().index(_units(3)).save(path)
    finally:
        persist_commit._unlock(readers)
    snaps = sorted(e for e in os.listdir(path) if e.startswith("snapshot-"))
    assert len(snaps) == 2  # the clean-up skipped while the reader held the lock
    os.unlink(path / "CURRENT")
    with pytest.warns(RuntimeWarning, match=r"no CURRENT pointer.*newest complete, verified.*snapshot-00000002"):
        assert _ids(BM25Index.load(path)) == ["d0", "d1", "d2"]
    # the newest damaged: the one before it, verified, is loaded
    units_file = path / snaps[1] / "units.jsonl"
    units_file.write_bytes(units_file.read_bytes().replace(b"hamlet", b"HAMLET"))
    with pytest.warns(RuntimeWarning, match=snaps[0]):
        assert _ids(BM25Index.load(path)) == ["d0", "d1"]
    # the next save deletes no snapshot a lost pointer could have named
    BM25Index().index(_units(4)).save(path)
    assert all((path / s).is_dir() for s in snaps)
    assert _ids(BM25Index.load(path)) == ["d0", "d1", "d2", "d3"]
    # nothing verifies: the error says how to get out
    os.unlink(path / "CURRENT")
    for s in os.listdir(path):
        if s.startswith("snapshot-"):
            for f in (path / s).rglob("units.jsonl"):
                f.write_text("{}")
    with pytest.raises(PersistError, match="pointer is missing and no snapshot.*backup"):
        BM25Index.load(path)


def test_a_failed_fsync_after_the_commit_warns_and_reports_success(tmp_path, monkeypatch):
    path = tmp_path / "ix"
    BM25Index().index(_units(2)).save(path)
    committed = []
    real = persist_commit._fsync_dir

    def flaky(p):
        if committed:
            raise OSError(5, "Input/output error")
        real(p)

    monkeypatch.setattr(persist_commit, "_fsync_dir", flaky)
    monkeypatch.setattr(persist_commit, "_step_hook", lambda step: committed.append(1) if step == "pointer_replaced" else None)
    with pytest.warns(RuntimeWarning, match="committed.*syncing the folder afterwards failed"):
        BM25Index().index(_units(3)).save(path)
    monkeypatch.setattr(persist_commit, "_step_hook", None)
    monkeypatch.setattr(persist_commit, "_fsync_dir", real)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _ids(BM25Index.load(path)) == ["d0", "d1", "d2"]


def test_two_llamaindex_retrievers_in_one_storage_are_refused(tmp_path):
    from llama_index.core.schema import TextNode

    from llama_index_funnel.retrievers import BM25Retriever

    first = BM25Retriever.from_defaults(nodes=[TextNode(id_="a", text="alpha beta")])
    second = BM25Retriever.from_defaults(nodes=[TextNode(id_="b", text="gamma delta")])
    storage = str(tmp_path / "storage")
    first.persist(storage)
    first.persist(storage)  # the same object again: fine
    with pytest.raises(PersistError, match="persisted by another object.*overwrite=True"):
        second.persist(storage)
    assert [n.node.node_id for n in BM25Retriever.from_persist_dir(storage).retrieve("alpha")] == ["a"]
    loaded = BM25Retriever.from_persist_dir(storage)
    loaded.persist(storage)  # loaded from there: may persist back
    second.persist(storage, overwrite=True)
    assert [n.node.node_id for n in BM25Retriever.from_persist_dir(storage).retrieve("gamma")] == ["b"]


def test_a_snapshot_never_committed_is_not_recovered(tmp_path, monkeypatch):
    """A first save killed between the rename and the pointer: nothing was committed, so the
    load says so (it does not present the uncommitted snapshot), and the next save removes it."""
    path = tmp_path / "ix"

    def die(step):
        if step == "pointer_written":
            raise KeyboardInterrupt

    monkeypatch.setattr(persist_commit, "_step_hook", die)
    with pytest.raises(KeyboardInterrupt):
        BM25Index().index(_units(3)).save(path)
    monkeypatch.setattr(persist_commit, "_step_hook", None)
    assert [e for e in os.listdir(path) if e.startswith("snapshot-")]
    with pytest.raises(PersistError, match="nothing was ever committed"):
        BM25Index.load(path)
    BM25Index().index(_units(2)).save(path)
    assert len([e for e in os.listdir(path) if e.startswith("snapshot-")]) == 1
    assert _ids(BM25Index.load(path)) == ["d0", "d1"]


@pytest.mark.parametrize("pointer", ["deleted", "damaged"])
def test_the_kind_check_runs_when_current_is_lost_or_damaged(tmp_path, pointer):
    """Without a readable CURRENT the save used to skip the "one folder holds one object" check
    and committed a dense index over a BM25 index. The committed snapshots (the journal's) are
    checked instead: another kind is refused, and the BM25 index is still recovered."""
    path = tmp_path / "ix"
    BM25Index().index(_units(3)).save(path)
    if pointer == "deleted":
        os.unlink(path / "CURRENT")
    else:
        (path / "CURRENT").write_bytes(b"not a pointer\n")
    rng = np.random.default_rng(0)
    dense = DenseIndex(SentenceEmbedder("unused-model")).index(
        _units(3), embeddings=rng.normal(size=(3, 4)).astype(np.float32))
    with pytest.raises(PersistError, match=r"refusing to save a 'funnel-rag.dense'.*holds a 'funnel-rag.bm25'.*"
                                           r"CURRENT.*missing or damaged.*another folder"):
        dense.save(path)
    formats = {json.loads((path / e / "manifest.json").read_text())["format"]
               for e in os.listdir(path) if e.startswith("snapshot-")}
    assert formats == {"funnel-rag.bm25"}  # nothing of the dense index was committed
    if pointer == "deleted":
        with pytest.warns(RuntimeWarning, match="no CURRENT pointer"):
            assert _ids(BM25Index.load(path)) == ["d0", "d1", "d2"]
    BM25Index().index(_units(4)).save(path)  # the same kind may save (and writes a new pointer)
    assert _ids(BM25Index.load(path)) == ["d0", "d1", "d2", "d3"]


def test_the_owner_check_runs_when_current_is_lost(tmp_path):
    from llama_index.core.schema import TextNode

    from llama_index_funnel.retrievers import BM25Retriever

    first = BM25Retriever.from_defaults(nodes=[TextNode(id_="a", text="alpha beta")])
    second = BM25Retriever.from_defaults(nodes=[TextNode(id_="b", text="gamma delta")])
    storage = tmp_path / "storage"
    first.persist(str(storage))
    (pointers,) = [p for p in storage.rglob("CURRENT")]
    os.unlink(pointers)
    with pytest.raises(PersistError, match="persisted by another object.*overwrite=True"):
        second.persist(str(storage))
    first.persist(str(storage))  # its own folder: fine
    second.persist(str(storage), overwrite=True)
    assert [n.node.node_id for n in BM25Retriever.from_persist_dir(str(storage)).retrieve("gamma")] == ["b"]
