"""Index settings are :class:`funnel_core.settings.Settings`, like the stages': one parametrised
check over every index class.

For each class the build-time settings are listed here (the specification, not read back from the
class): each can be edited before the index is built, and the edit is what the index then builds
with; once built, an edit raises :class:`~funnel_core.settings.BuiltSettingError` naming the
setting and changes nothing; a run-time setting (BM25's scoring engine, HNSW's ``ef_search``)
stays editable; a save writes ``to_dict()`` and a load gives the same settings back.
"""

from __future__ import annotations

from typing import Any, Callable

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


class Spec:
    """One index class: how to make and build it, its build-time settings (with another valid
    value for each) and its run-time ones."""

    def __init__(self, name: str, make: Callable[[], Any], build: Callable[[Any], Any],
                 build_time: dict[str, Any], run_time: dict[str, Any],
                 load: Callable[[Any], Any]) -> None:
        self.name, self.make, self.build, self.load = name, make, build, load
        self.build_time, self.run_time = build_time, run_time


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
]


def _value(index: Any, name: str) -> Any:
    return index._setting(name)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_every_setting_is_editable_before_the_build(spec):
    for name, value in {**spec.build_time, **spec.run_time}.items():
        index = spec.make()
        setattr(index, index.setting_attrs.get(name, name), value)
        assert _value(index, name) == value, name
        if not isinstance(value, SentenceEmbedder):
            assert index.to_dict()[name] == value, name


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_a_build_time_setting_of_a_built_index_is_refused_naming_it(spec):
    index = spec.build(spec.make())
    before = index.to_dict()
    for name, value in spec.build_time.items():
        with pytest.raises(BuiltSettingError, match=rf"\b{name}\b.*already built"):
            setattr(index, index.setting_attrs.get(name, name), value)
    assert index.to_dict() == before


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_a_run_time_setting_of_a_built_index_stays_editable(spec):
    index = spec.build(spec.make())
    for name, value in spec.run_time.items():
        setattr(index, name, value)
        assert index.to_dict()[name] == value
    extra = {"query_embeddings": _embeddings(1)} if spec.name == "DenseIndex" else {}
    assert len(index.search_many(["paris tower"], k=3, **extra)[0]) > 0


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_an_invalid_edit_raises_naming_the_setting(spec):
    index = spec.make()
    name = next(iter(spec.build_time)) if spec.name != "DenseIndex" else "hnsw_m"
    with pytest.raises((TypeError, ValueError), match=name):
        setattr(index, name, -3 if name != "method" else "bm99")
    assert index.to_dict() == spec.make().to_dict()


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_save_writes_the_settings_and_load_reads_them_back(spec, tmp_path):
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
