"""NaN is never ranked: scores and query embeddings are checked (finite, shape, dtype) with
errors that name the bad value and the fix.

Reference: a ranking is a total order on numbers; NaN compares false with everything, so a
sort that meets one leaves it wherever it was (``sorted([1, nan, 9, 3], key=neg)`` keeps the
NaN second). Wrong implementations caught: a reranker that sorts NaN into ``top_n`` (the issue's
``[nan, 1.0, nan]`` for 1, 3, 5, 7, 9 plus NaNs); a dense search that ranks NaN similarities
(exact) or returns ``[]`` for a NaN query (HNSW) instead of refusing; a wrong embedding size or
too few query rows reaching numpy/faiss as a raw broadcasting error or an ``IndexError``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from funnel_core.embeddings import DenseIndex, SentenceEmbedder
from funnel_core.rerank.base import Reranker
from funnel_core.scoring import check_finite_scores, rank_by_scores
from funnel_core.units import Unit

NAN = float("nan")


class _Given(Reranker):
    """A reranker whose model 'outputs' the scores it was given (one per text, in order)."""

    def __init__(self, scores, **kw):
        super().__init__(**kw)
        self.scores = list(scores)

    def score(self, query, texts):
        return self.scores[:len(texts)]


def _units(n):
    return [Unit(id=f"u{i}", text=f"text {i}") for i in range(n)]


def test_python_sort_really_misplaces_nan():
    """The failure mode the checks exist for (so this file tests something real)."""
    assert math.isnan(sorted([1.0, NAN, 9.0, 3.0], key=lambda s: -s)[1])


@pytest.mark.parametrize("normalize", [False, True])
def test_a_reranker_never_ranks_nan(normalize):
    scores = [1.0, NAN, 3.0, 5.0, NAN, 7.0, 9.0]
    r = _Given(scores, top_n=3, normalize=normalize)
    with pytest.raises(ValueError, match=r"2 non-finite score\(s\) of 7 \(ids 'u1', 'u4'.*float32"):
        r.rank("q", _units(len(scores)))
    with pytest.raises(ValueError, match="non-finite"):
        _Given([1.0, math.inf], top_n=1).rank("q", _units(2))
    # finite scores: ordinary ranking, best first
    ok = _Given([1.0, 3.0, 5.0, 7.0, 9.0], top_n=3).rank("q", _units(5))
    assert [u.id for u in ok] == ["u4", "u3", "u2"] and [u.score for u in ok] == [9.0, 7.0, 5.0]


def test_score_helpers_refuse_nan():
    with pytest.raises(ValueError, match=r"positions \[1\]"):
        rank_by_scores([1.0, NAN, 2.0], top_n=1)
    assert rank_by_scores([1.0, -math.inf, 2.0]) == [2, 0, 1]
    with pytest.raises(ValueError, match=r"ids 'b'"):
        check_finite_scores([0.5, NAN], "x", ["a", "b"])
    with pytest.raises(ValueError, match="NaN"):
        _Given([1.0], score_threshold=NAN)


@pytest.fixture(scope="module")
def vectors():
    rng = np.random.default_rng(0)
    v = rng.normal(size=(40, 8)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@pytest.mark.parametrize("kind", ["exact", "hnsw"])
def test_dense_search_refuses_nan_wrong_size_and_too_few_rows(kind, vectors):
    pytest.importorskip("faiss") if kind == "hnsw" else None
    index = DenseIndex(SentenceEmbedder("unused-model"), index=kind).index(_units(40), embeddings=vectors)
    assert index.backend == kind
    good = index.search_many(["a", "b"], k=3, query_embeddings=vectors[:2])
    assert [g[0].id for g in good] == ["u0", "u1"]  # each vector's nearest is itself
    bad = vectors[:2].copy()
    bad[1, 3] = NAN
    with pytest.raises(ValueError, match=r"NaN or infinite values \(rows \[1\]\)"):
        index.search_many(["a", "b"], k=3, query_embeddings=bad)
    with pytest.raises(ValueError, match=r"shape \(2, 5\).*8-d"):
        index.search_many(["a", "b"], k=3, query_embeddings=vectors[:2, :5])
    with pytest.raises(ValueError, match="1 rows for 3 queries"):
        index.search_many(["a", "b", "c"], k=3, query_embeddings=vectors[:1])
    with pytest.raises(TypeError, match="dtype"):
        index.search_many(["a"], k=3, query_embeddings=np.array([["x"] * 8]))


def test_dense_index_refuses_bad_corpus_embeddings(vectors):
    emb = SentenceEmbedder("unused-model")
    with pytest.raises(ValueError, match="shape.*one row per unit"):
        DenseIndex(emb).index(_units(3), embeddings=vectors[:2])
    bad = vectors[:3].copy()
    bad[0, 0] = NAN
    with pytest.raises(ValueError, match="NaN"):
        DenseIndex(emb).index(_units(3), embeddings=bad)
