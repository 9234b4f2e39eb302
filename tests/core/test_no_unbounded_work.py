"""No unbounded work: ``k`` is clamped to the index size before any
top-k buffer is allocated (``BM25Index.search(k=10**12)`` asked numpy for 7.28 TiB), and a dense
search never returns a non-finite similarity (finite float32 embeddings near 3e38 overflow the
inner product to inf - inf = NaN)."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest

from funnel_core.bm25 import BM25Index
from funnel_core.embeddings import DenseIndex, SentenceEmbedder
from funnel_core.units import Unit

UNITS = [Unit(id=f"d{i}", text=t) for i, t in enumerate(
    ["paris capital france", "berlin capital germany", "hamlet tragedy shakespeare"])]
ENGINES = ["numpy"] + (["numba"] if importlib.util.find_spec("numba") else [])


@pytest.mark.parametrize("engine", ENGINES)
def test_bm25_huge_k_is_clamped_to_the_index_size(engine):
    ix = BM25Index(engine=engine).index(UNITS)
    hits = ix.search("capital", k=10**12)
    assert sorted(u.id for u in hits) == ["d0", "d1"]
    many = ix.search_many(["capital", "tragedy"], k=10**12)
    assert [len(h) for h in many] == [2, 1]
    assert [u.id for u in ix.hits(ix.get_scores("tragedy"), k=10**12)] == ["d2"]


def test_dense_search_never_returns_a_nan_similarity():
    big = np.float32(3e38)
    emb = np.array([[big, -big], [1.0, 0.0], [0.0, 1.0]], dtype=np.float32)  # finite
    index = DenseIndex(SentenceEmbedder("unused-model"), index="exact").index(
        [Unit(id=f"u{i}", text=f"t{i}") for i in range(3)], embeddings=emb)
    q = np.array([[big, big]], dtype=np.float32)  # 9e76 - 9e76 in float32: inf - inf = NaN
    hits = index.search_many(["q"], k=3, query_embeddings=q)[0]
    assert hits and all(math.isfinite(u.score) for u in hits)
    assert "u0" not in [u.id for u in hits]
