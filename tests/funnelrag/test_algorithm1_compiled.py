"""The compiled Algorithm 1 merge gives the Python loop's clusters, member order included.

Random graphs with tied weights (so closeness ties and the lower-id rule matter), isolated
documents, documents larger than S and both ``grow_absorbed`` readings. A wrong tie-break, a
strength summed over the wrong neighbours, closeness not divided by the member count, a merge
that skips the size check or appends members in another order all change the lists.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from funnel_core.funnelrag import clustering
from funnel_core.funnelrag.clustering import _binary_symmetric, _merge, _merge_python

pytest.importorskip("numba")


@settings(max_examples=120, deadline=None)
@given(n=st.integers(1, 40), density=st.floats(0.0, 0.5), seed=st.integers(0, 2**31),
       max_tokens=st.integers(1, 60), grow=st.booleans())
def test_compiled_merge_equals_python(n, density, seed, max_tokens, grow):
    rng = np.random.default_rng(seed)
    adj = sp.random(n, n, density=density, random_state=rng, format="csr")
    adj.data = rng.choice([0.25, 0.5, 1.0], size=adj.nnz)  # few distinct weights: many ties
    a = _binary_symmetric(adj)
    order = rng.permutation(n)
    sizes = rng.integers(1, 25, size=n)
    assert _merge(a, order, sizes, max_tokens, grow) == _merge_python(a, order, sizes, max_tokens, grow)


def test_cluster_documents_uses_the_same_merge_without_numba(monkeypatch):
    """cluster_documents without numba (the Python loop) equals it with numba."""
    rng = np.random.default_rng(3)
    adj = sp.random(300, 300, density=0.03, random_state=rng, format="csr")
    sizes = rng.integers(10, 200, size=300)
    compiled = clustering.cluster_documents(adj, sizes, max_tokens=800)
    monkeypatch.setattr(clustering, "_merge", _merge_python)
    python = clustering.cluster_documents(adj, sizes, max_tokens=800)
    assert compiled.members == python.members and compiled.sizes == python.sizes
    assert sorted(m for c in compiled.members for m in c) == list(range(300))
