"""Commit semantics of funnel_core.persist: ownership, snapshots, pointer,
checksums, versions, untrusted manifests, shared LlamaIndex ./storage."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from funnel_core.bm25 import BM25Index
from funnel_core.embeddings import DenseIndex
from funnel_core.errors import PersistError
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
from funnel_core.persist import commit as persist_commit

QUERIES = ["Paris France", "Shakespeare", "dense vectors", "capital of Germany", "ranking"]


def signature(index, queries=QUERIES):
    return [[(u.id, u.score, u.text, u.metadata) for u in index.search(q, k=5)] for q in queries]


def listing(path: Path) -> list[str]:
    return sorted(os.listdir(path))


def rewrite_manifest(path: Path, change) -> None:
    """What an attacker can do: edit the manifest and re-hash it in the pointer."""
    ptr = persist_commit._read_pointer(path, "x")
    mfile = path / ptr["snapshot"] / "manifest.json"
    manifest = json.loads(mfile.read_text())
    change(manifest)
    data = json.dumps(manifest).encode()
    mfile.write_bytes(data)
    ptr["manifest_sha256"] = hashlib.sha256(data).hexdigest()
    (path / "CURRENT").write_bytes(persist_commit._pointer_bytes(ptr))


# -- layout and commit ---------------------------------------------------------------------------
def test_layout_one_snapshot_and_old_ones_removed(tmp_path, corpus_units):
    path = tmp_path / "ix"
    a = BM25Index().index(corpus_units[:4])
    a.save(path)
    first = listing(path)
    assert first[:4] == [".funnel-rag", ".funnel-rag.journal", ".funnel-rag.readers", "CURRENT"]
    assert len(first) == 5 and first[4].startswith("snapshot-00000001-")
    # the journal records exactly what our saves wrote and still own: the committed snapshot
    assert (path / ".funnel-rag.journal").read_text().splitlines() == [f"committed {first[4]}"]
    (path / "NOTES.txt").write_text("mine")  # a user's file inside our folder is never touched
    b = BM25Index().index(corpus_units)
    b.save(path)
    second = listing(path)
    assert len(second) == 6 and "NOTES.txt" in second and second[-1].startswith("snapshot-00000002-")
    assert first[4] not in second  # the previous snapshot is gone after the commit
    assert signature(BM25Index.load(path)) == signature(b)
    assert (path / "NOTES.txt").read_text() == "mine"
    info = persist_commit.snapshot_info(path)
    assert info["format"] == "funnel-rag.bm25" and "units.jsonl" in info["files"]
    assert all(len(f["sha256"]) == 64 for f in info["files"].values())


def test_refuses_foreign_folder_and_file(tmp_path, corpus_units):
    idx = BM25Index().index(corpus_units)
    proj = tmp_path / "p"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "a.py").write_text("print('keep me')")
    with pytest.raises(PersistError, match=r"refusing to save into .*/p'.*not empty \(src\).*new folder"):
        idx.save(proj)
    assert listing(proj) == ["src"] and (proj / "src" / "a.py").read_text() == "print('keep me')"
    f = tmp_path / "file.txt"
    f.write_text("data")
    with pytest.raises(PersistError, match="is a file, not a folder"):
        idx.save(f)
    assert f.read_text() == "data"
    with pytest.raises(PersistError, match="is a file"):
        BM25Index.load(f)
    empty = tmp_path / "empty"
    empty.mkdir()
    idx.save(empty)  # an empty folder is fine
    assert BM25Index.load(empty).units == idx.units


def test_failure_at_every_step_keeps_previous_and_next_save_cleans(tmp_path, corpus_units, monkeypatch):
    """An exception at any step boundary leaves the old (or the new) index loadable; the next
    save leaves exactly one snapshot and no temp files."""
    path = tmp_path / "ix"
    old, new = BM25Index().index(corpus_units[:3]), BM25Index().index(corpus_units)
    old.save(path)
    steps = ["tmp_created", "files_written", "files_synced", "manifest_written", "snapshot_renamed",
             "pointer_written", "pointer_replaced", "committed", "cleanup", "done"]
    for step in steps:
        def hook(name, step=step):
            if name == step:
                raise KeyboardInterrupt(step)
        monkeypatch.setattr(persist_commit, "_step_hook", hook)
        with pytest.raises(KeyboardInterrupt):
            new.save(path)
        monkeypatch.setattr(persist_commit, "_step_hook", None)
        got = signature(BM25Index.load(path))
        assert got in (signature(old), signature(new)), step
        old.save(path)
        assert len([e for e in listing(path) if e.startswith(("snapshot-", ".tmp-", ".CURRENT"))]) == 1, step
        assert signature(BM25Index.load(path)) == signature(old)


def test_shared_llama_index_storage_stays_loadable(tmp_path, source_linked_nodes):
    from llama_index.core import MockEmbedding, StorageContext, VectorStoreIndex, load_index_from_storage

    from llama_index_funnel.retrievers import BM25Retriever, ClusteredBM25Retriever

    storage = tmp_path / "storage"
    embed = MockEmbedding(embed_dim=8)
    vindex = VectorStoreIndex(source_linked_nodes, embed_model=embed)
    vindex.storage_context.persist(str(storage))
    before = {p.name: p.read_bytes() for p in storage.iterdir()}
    bm25 = BM25Retriever.from_defaults(nodes=source_linked_nodes, similarity_top_k=3)
    bm25.persist(str(storage))
    clustered = ClusteredBM25Retriever.from_defaults(nodes=source_linked_nodes, max_tokens=40, knn_k=3,
                                                     knn_threshold=0.05)
    clustered.persist(str(storage))
    bm25.persist(str(storage))  # a second commit
    for name, data in before.items():  # LlamaIndex's stores: byte for byte the same
        assert (storage / name).read_bytes() == data, name
    assert set(os.listdir(storage)) == set(before) | {"funnel_rag_bm25", "funnel_rag_clustered_bm25"}
    again = load_index_from_storage(StorageContext.from_defaults(persist_dir=str(storage)), embed_model=embed)
    assert len(again.docstore.docs) == len(source_linked_nodes)
    assert again.as_retriever(similarity_top_k=2).retrieve("Paris")
    loaded = BM25Retriever.from_persist_dir(str(storage), similarity_top_k=3)
    q = "capital of Germany"
    assert [(n.node.node_id, n.score) for n in loaded.retrieve(q)] == [(n.node.node_id, n.score) for n in bm25.retrieve(q)]
    assert ClusteredBM25Retriever.from_persist_dir(str(storage)).retrieve(q)
    # and the other order: our retriever first, then LlamaIndex persists into the same folder
    storage2 = tmp_path / "storage2"
    bm25.persist(str(storage2))
    vindex.storage_context.persist(str(storage2))
    assert BM25Retriever.from_persist_dir(str(storage2)).retrieve(q)
    assert load_index_from_storage(StorageContext.from_defaults(persist_dir=str(storage2)), embed_model=embed)


# -- integrity and versions ----------------------------------------------------------------------
def test_every_single_bit_flip_of_small_files_is_detected_or_harmless(tmp_path, corpus_units):
    path = tmp_path / "ix"
    idx = BM25Index().index(corpus_units[:3])
    idx.save(path)
    want = signature(idx)
    rng = np.random.default_rng(0)
    files = [p for p in path.rglob("*") if p.is_file() and p.stat().st_size]
    silent = detected = harmless = 0
    for f in files:
        data = f.read_bytes()
        for _ in range(12):
            pos = int(rng.integers(len(data)))
            bit = 1 << int(rng.integers(8))
            f.write_bytes(data[:pos] + bytes([data[pos] ^ bit]) + data[pos + 1:])
            try:
                got = signature(BM25Index.load(path))
            except PersistError:
                detected += 1
            else:
                if got == want:
                    harmless += 1  # only the marker and the save journal are not read by a load
                    assert f.name in (".funnel-rag", ".funnel-rag.journal")
                else:
                    silent += 1
            f.write_bytes(data)
    assert silent == 0 and detected >= 12 * (len(files) - 2)


def test_verify_false_skips_hashes_but_checks_structure(tmp_path, corpus_units):
    path = tmp_path / "ix"
    BM25Index().index(corpus_units).save(path)
    f = next(path.glob("snapshot-*/units.jsonl"))
    f.write_text(f.read_text().replace("Paris", "Pxris"))
    with pytest.raises(PersistError, match="checksum mismatch for .*units.jsonl"):
        BM25Index.load(path)
    assert "Pxris" in BM25Index.load(path, verify=False).units[0].text  # documented trade-off
    next(path.glob("snapshot-*/units.jsonl")).unlink()
    with pytest.raises(PersistError, match="missing"):
        BM25Index.load(path, verify=False)


@pytest.mark.parametrize("version,match", [(999, "newer funnel-rag"), ("x", "invalid version"),
                                           (None, "invalid version"), (True, "invalid version"),
                                           (0, "invalid version")])
def test_manifest_version_is_checked(tmp_path, corpus_units, version, match):
    path = tmp_path / "ix"
    BM25Index().index(corpus_units).save(path)
    rewrite_manifest(path, lambda m: m.update(version=version) if version is not None else m.pop("version"))
    with pytest.raises(PersistError, match=match):
        BM25Index.load(path)


def test_newer_layout_is_refused(tmp_path, corpus_units):
    path = tmp_path / "ix"
    BM25Index().index(corpus_units).save(path)
    rewrite_manifest(path, lambda m: m.update(layout=2))
    with pytest.raises(PersistError, match=r"newer funnel-rag \(layout 2"):
        BM25Index.load(path)


@pytest.mark.parametrize("key,value,match", [
    ("token_pattern", r"(?:\w+)+!", "catastrophic backtracking"),
    ("token_pattern", "(", "not a valid regular expression"),
    ("b", 5.0, r"b must be in \[0.0, 1.0\]"),
    ("k1", -1, "k1 must be in"),
    ("k1", "1.5", "k1 must be a number"),
    ("method", "evil", "unknown BM25 method"),
    ("stopwords", {"a": 1}, "stopwords must be"),
    ("lower", "yes", "lower must be True or False"),
    ("cjk", "emoji", "cjk must be one of"),
])
def test_tampered_settings_are_rejected(tmp_path, corpus_units, key, value, match):
    path = tmp_path / "ix"
    BM25Index().index(corpus_units).save(path)
    rewrite_manifest(path, lambda m: m["meta"]["settings"].update({key: value}))
    t0 = time.perf_counter()
    with pytest.raises(PersistError, match=match):
        BM25Index.load(path)
    assert time.perf_counter() - t0 < 5


def test_nan_in_manifest_and_unsafe_file_names_are_rejected(tmp_path, corpus_units):
    path = tmp_path / "ix"
    BM25Index().index(corpus_units).save(path)
    ptr = persist_commit._read_pointer(path, "x")
    mfile = path / ptr["snapshot"] / "manifest.json"
    text = mfile.read_text().replace('"b": 0.75', '"b": NaN')
    mfile.write_text(text)
    ptr["manifest_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    (path / "CURRENT").write_bytes(persist_commit._pointer_bytes(ptr))
    with pytest.raises(PersistError, match="NaN is not allowed"):
        BM25Index.load(path)
    BM25Index().index(corpus_units).save(path)
    rewrite_manifest(path, lambda m: m["files"].update({"../../etc/passwd": {"sha256": "0" * 64, "size": 1}}))
    with pytest.raises(PersistError, match="unsafe file name"):
        BM25Index.load(path)


def test_pointer_naming_a_missing_snapshot(tmp_path, corpus_units):
    path = tmp_path / "ix"
    BM25Index().index(corpus_units).save(path)
    import shutil

    shutil.rmtree(next(path.glob("snapshot-*")))
    with pytest.raises(PersistError, match="committed snapshot .* is missing"):
        BM25Index.load(path)
    with pytest.raises(PersistError, match=r"missing CURRENT|nothing was ever committed"):
        (path / "CURRENT").unlink()
        BM25Index.load(path)


def test_old_layout_gets_a_clear_message(tmp_path, corpus_units):
    old = tmp_path / "old"
    old.mkdir()
    (old / "manifest.json").write_text(json.dumps({"format": "funnel-rag.bm25", "version": 1}))
    with pytest.raises(PersistError, match="old \\(pre-snapshot\\) layout"):
        BM25Index.load(old)
    with pytest.raises(PersistError, match="old \\(pre-snapshot\\) layout"):
        BM25Index().index(corpus_units).save(old)


# -- every persisted object goes through it ------------------------------------------------------
def test_clustered_and_dense_round_trip_and_detect_flips(tmp_path, corpus_units):
    c = ClusteredBM25Index(max_tokens=40, knn_k=3, knn_threshold=0.05).index(corpus_units)
    c.save(tmp_path / "c")
    c2 = ClusteredBM25Index.load(tmp_path / "c")
    assert [(u.id, u.score) for u in c2.search("Paris", k=2)] == [(u.id, u.score) for u in c.search("Paris", k=2)]
    assert [x.metadata for x in c2.clusters] == [x.metadata for x in c.clusters]
    emb = np.random.default_rng(0).normal(size=(len(corpus_units), 4)).astype(np.float32)
    d = DenseIndex().index(corpus_units, embeddings=emb)
    d.save(tmp_path / "d")
    d2 = DenseIndex.load(tmp_path / "d", embedder=d.embedder)
    np.testing.assert_array_equal(d2.embeddings, emb)
    q = emb[:1]
    assert [u.id for u in d2.search_many(["x"], k=3, query_embeddings=q)[0]] == \
        [u.id for u in d.search_many(["x"], k=3, query_embeddings=q)[0]]
    for folder, loader in ((tmp_path / "c", ClusteredBM25Index.load), (tmp_path / "d", DenseIndex.load)):
        f = max((p for p in folder.glob("snapshot-*/**/*") if p.is_file() and p.name != "manifest.json"),
                key=lambda p: p.stat().st_size)
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0x10
        f.write_bytes(bytes(data))
        with pytest.raises(PersistError, match="checksum mismatch"):
            loader(folder)


def test_classifier_round_trip_and_validation(tmp_path):
    from funnel_core.best_practices.classify import QueryClassifier

    clf = QueryClassifier(C=2.0, threshold=0.4)
    clf.coef_, clf.intercept_ = np.linspace(-1, 1, 5), 0.25
    clf.save(tmp_path / "clf")
    again = QueryClassifier.load(tmp_path / "clf", embedder=clf.embedder)
    np.testing.assert_array_equal(again.coef_, clf.coef_)
    assert (again.intercept_, again.C, again.threshold) == (0.25, 2.0, 0.4)
    rewrite_manifest(tmp_path / "clf", lambda m: m["meta"].update(threshold=7))
    with pytest.raises(PersistError, match="threshold must be in"):
        QueryClassifier.load(tmp_path / "clf")


def test_router_uses_safetensors_never_torch_load(tmp_path, monkeypatch):
    import torch

    from funnel_core.granularity.router import GranularityRouter

    router = GranularityRouter(3, hidden=4)
    router._mlp = router._build(6).eval()
    router.save(tmp_path / "r")
    assert {p.name for p in next((tmp_path / "r").glob("snapshot-*")).iterdir()} == {"manifest.json", "router.safetensors"}

    def no_pickle(*a, **k):
        raise AssertionError("torch.load must not be used")

    monkeypatch.setattr(torch, "load", no_pickle)
    again = GranularityRouter.load(tmp_path / "r", embedder=router.embedder)
    x = torch.randn(2, 6)
    torch.testing.assert_close(again._mlp(x), router._mlp(x))
    rewrite_manifest(tmp_path / "r", lambda m: m["meta"].update(hidden=10 ** 9))
    with pytest.raises(PersistError, match="hidden must be in"):
        GranularityRouter.load(tmp_path / "r")


def test_torch_lower_bound_defaults_to_weights_only():
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"torch>=2.6"' in text  # torch 2.6 made weights_only=True the default of torch.load
    src = "\n".join(p.read_text() for p in (Path(__file__).resolve().parents[2] / "funnel_core").rglob("*.py"))
    import re

    for call in re.findall(r"torch\.load\([^)]*\)", src):
        assert "weights_only=True" in call, call
