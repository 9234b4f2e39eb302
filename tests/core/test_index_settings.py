"""Index settings are :class:`funnel_core.settings.Settings`, like the stages': one parametrised
check over every index class.

For each class the build-time settings are listed here (the specification, not read back from the
class): each can be edited before the index is built, and the edit is what the index then builds
with; once built, an edit raises :class:`~funnel_core.settings.BuiltSettingError` naming the
setting and changes nothing; a run-time setting (BM25's scoring engine, HNSW's ``ef_search``)
stays editable; a save writes ``to_dict()`` and a load gives the same settings back. The Milvus
indexes (Milvus Lite, ``slow`` tier) count as built while their collection is open.
"""

from __future__ import annotations

import importlib.util
import uuid
from typing import Any, Callable, Optional

import numpy as np
import pytest

from funnel_core.bm25 import BM25Index
from funnel_core.embeddings import DenseIndex, SentenceEmbedder
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
from funnel_core.settings import BuiltSettingError
from funnel_core.units import Unit

TOPICS = ["paris tower river city capital", "ranking retrieval index query score",
          "poem novel author tragedy verse"]
UNITS = [Unit(id=f"d{i}", text=f"Document {i}: " + " ".join(TOPICS[i % 3].split()[: 2 + i % 4]) + ".",
              level="document") for i in range(18)]


def _embeddings(n: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(n, 8)).astype(np.float32)
    return emb / np.linalg.norm(emb, axis=1, keepdims=True)


HAVE_MILVUS = all(importlib.util.find_spec(m) is not None for m in ("pymilvus", "milvus_lite"))


class Spec:
    """One index class: how to make and build it, its build-time settings (with another valid
    value for each) and its run-time ones; ``load`` reads back what ``save`` wrote (in-memory
    indexes: the settings are the snapshot's ``to_dict()``)."""

    def __init__(self, name: str, make: Callable[[], Any], build: Callable[[Any], Any],
                 build_time: dict[str, Any], run_time: dict[str, Any],
                 load: Optional[Callable[[Any], Any]] = None, milvus: bool = False) -> None:
        self.name, self.make, self.build, self.load = name, make, build, load
        self.build_time, self.run_time, self.milvus = build_time, run_time, milvus


def _db() -> str:
    return str(_MILVUS_DIR[0] / "settings.db")


_MILVUS_DIR: list[Any] = []


def _collection() -> str:
    return f"c_{uuid.uuid4().hex[:10]}"


def _milvus(kind: str, **settings: Any) -> Any:
    from funnel_core.backends.milvus import MilvusBM25Index, MilvusClusteredBM25Index, MilvusDenseIndex

    cls = {"bm25": MilvusBM25Index, "clustered": MilvusClusteredBM25Index, "dense": MilvusDenseIndex}[kind]
    return cls(_db(), _collection(), **settings)


BM25_BUILD = {"method": "robertson", "k1": 0.9, "b": 0.4, "delta": 1.0, "stemmer": None,
              "stopwords": None, "token_pattern": r"\w+", "lower": False, "cjk": "bigram"}

SPECS = [
    Spec("BM25Index", lambda: BM25Index(k1=1.2, engine="numpy"), lambda ix: ix.index(UNITS),
         BM25_BUILD, {"engine": "auto", "show_progress": True}, BM25Index.load),
    Spec("ClusteredBM25Index",
         lambda: ClusteredBM25Index(max_tokens=30, adjacency="bm25", knn_k=3, knn_threshold=0.05,
                                    engine="numpy"),
         lambda ix: ix.index(UNITS),
         {"max_tokens": 50, "adjacency": "links", "knn_k": 5, "knn_threshold": 0.2, **BM25_BUILD},
         {"engine": "auto"}, ClusteredBM25Index.load),
    Spec("DenseIndex", lambda: DenseIndex(SentenceEmbedder("some/embedder"), index="exact"),
         lambda ix: ix.index(UNITS, embeddings=_embeddings(len(UNITS))),
         {"embedder": SentenceEmbedder("other/embedder"), "index": "auto", "ann_threshold": 10,
          "hnsw_m": 16, "ef_construction": 40},
         {"ef_search": 100}, lambda path: DenseIndex.load(path, SentenceEmbedder("some/embedder"))),
    Spec("MilvusBM25Index", lambda: _milvus("bm25", k1=1.2), lambda ix: ix.index(UNITS),
         {n: v for n, v in BM25_BUILD.items() if n != "method"},  # Milvus runs lucene only
         {"show_progress": True, "timeout": 30.0}, milvus=True),
    Spec("MilvusClusteredBM25Index",
         lambda: _milvus("clustered", max_tokens=30, adjacency="bm25", knn_k=3, knn_threshold=0.05),
         lambda ix: ix.index(UNITS),
         {"max_tokens": 50, "adjacency": "links", "knn_k": 5, "knn_threshold": 0.2,
          **{n: v for n, v in BM25_BUILD.items() if n != "method"}},
         {"show_progress": True, "timeout": 30.0}, milvus=True),
    Spec("MilvusDenseIndex", lambda: _milvus("dense", embedder=SentenceEmbedder("some/embedder"), index_type="FLAT"),
         lambda ix: ix.index(UNITS, embeddings=_embeddings(len(UNITS))),
         {"embedder": SentenceEmbedder("other/embedder"), "index_type": "HNSW", "metric": "COSINE",
          "hnsw_m": 8, "ef_construction": 40, "nlist": 16},
         {"ef": 32, "nprobe": 4, "batch_size": 10}, milvus=True),
]


def _param(spec: Spec) -> Any:
    marks = [pytest.mark.slow, pytest.mark.skipif(not HAVE_MILVUS, reason="pymilvus / milvus-lite not "
                                                  "installed")] if spec.milvus else []
    return pytest.param(spec, id=spec.name, marks=marks)


PARAMS = [_param(s) for s in SPECS]


@pytest.fixture(autouse=True, scope="module")
def _milvus_dir(tmp_path_factory):
    _MILVUS_DIR[:] = [tmp_path_factory.mktemp("milvus")]
    yield


def _value(index: Any, name: str) -> Any:
    return index._setting(name)


@pytest.mark.parametrize("spec", PARAMS)
def test_every_setting_is_editable_before_the_build(spec):
    for name, value in {**spec.build_time, **spec.run_time}.items():
        index = spec.make()
        setattr(index, index.setting_attrs.get(name, name), value)
        assert _value(index, name) == value, name
        if not isinstance(value, SentenceEmbedder):
            assert index.to_dict()[name] == value, name


@pytest.mark.parametrize("spec", PARAMS)
def test_a_build_time_setting_of_a_built_index_is_refused_naming_it(spec):
    index = spec.build(spec.make())
    before = index.to_dict()
    for name, value in spec.build_time.items():
        with pytest.raises(BuiltSettingError, match=rf"\b{name}\b.*already built"):
            setattr(index, index.setting_attrs.get(name, name), value)
    assert index.to_dict() == before


@pytest.mark.parametrize("spec", PARAMS)
def test_a_run_time_setting_of_a_built_index_stays_editable(spec):
    index = spec.build(spec.make())
    for name, value in spec.run_time.items():
        setattr(index, name, value)
        assert index.to_dict()[name] == value
    extra = {"query_embeddings": _embeddings(1)} if "Dense" in spec.name else {}
    assert len(index.search_many(["paris tower"], k=3, **extra)[0]) > 0


@pytest.mark.parametrize("spec", PARAMS)
def test_an_invalid_edit_raises_naming_the_setting(spec):
    index = spec.make()
    before = index.to_dict()
    name = "hnsw_m" if "Dense" in spec.name else next(iter(spec.build_time))
    with pytest.raises((TypeError, ValueError), match=name):
        setattr(index, name, -3 if name != "method" else "bm99")
    assert index.to_dict() == before


@pytest.mark.parametrize("spec", PARAMS)
def test_save_writes_the_settings_and_load_reads_them_back(spec, tmp_path):
    if spec.load is None:
        pytest.skip("a Milvus index saves a manifest of its collection, not its settings dict")
    index = spec.build(spec.make())
    for name, value in spec.run_time.items():  # an edit is saved too
        if name != "engine":  # the engine is the loader's choice
            setattr(index, name, value)
    index.save(tmp_path / "ix")
    loaded = spec.load(tmp_path / "ix")
    want = index.to_dict()
    assert loaded.to_dict() == want
    assert want["type"] == spec.name


def test_an_edit_before_the_build_is_what_the_index_builds_with():
    """k1 and the stopwords edited on an empty index: the same scores as an index constructed
    with them (a stale tokenizer plan or a copy of the old settings would differ)."""
    edited = BM25Index(engine="numpy")
    edited.tokenize(["warm the token plan"])  # the plan is cached before the edit
    edited.k1, edited.stopwords = 0.7, ["paris"]
    fresh = BM25Index(engine="numpy", k1=0.7, stopwords=["paris"])
    assert edited.tokenize(["paris tower"]) == fresh.tokenize(["paris tower"]) == [["tower"]]
    edited.index(UNITS), fresh.index(UNITS)
    got = [(u.id, u.score) for u in edited.search("tower river", k=5)]
    assert got == [(u.id, u.score) for u in fresh.search("tower river", k=5)]


def test_an_edited_stemmer_is_used_before_the_build():
    index = BM25Index(engine="numpy")
    assert index.tokenize(["running"]) == [["run"]]
    index.stemmer = None
    assert index.tokenize(["running"]) == [["running"]]


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_MILVUS, reason="pymilvus / milvus-lite not installed")
def test_a_connection_edit_of_an_open_milvus_index_reopens_it():
    """``collection`` is no build-time setting: an edit closes the index (it is no longer built)
    and the next search opens the other collection (a kept opened state would still answer from
    the first)."""
    first = _milvus("bm25").index(UNITS[:6])
    second = _milvus("bm25").index(UNITS[6:])
    assert first.built() and {u.id for u in first.search("document", k=20)} == {u.id for u in UNITS[:6]}
    first.collection = second.collection
    assert not first.built()
    assert {u.id for u in first.search("document", k=20)} == {u.id for u in UNITS[6:]}
    assert first.built()
