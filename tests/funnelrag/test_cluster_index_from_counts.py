"""The cluster BM25 index built from summed member counts equals one built from the cluster texts.

A wrong grouping (a cluster summed over the wrong members), a count dropped at the join, or a
cluster index weighted with document-level statistics fails the comparison; a custom token
pattern (which could span the join) must take the text path.
"""

from __future__ import annotations

import pytest

from funnel_core.bm25 import BM25Index
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
from funnel_core.units import Unit

TEXTS = ["DNA repair proteins fix strand breaks", "Protein folding and misfolding diseases",
         "Apples and bananas are fruits", "Banana bread with ripe bananas", "DNA polymerase copies DNA",
         "Fruit flies eat ripe fruit", "Misfolded proteins aggregate in neurons", "Strand breaks and repair"]


def weights(index: BM25Index) -> dict[str, dict[int, float]]:
    s = index._retriever.scores
    out = {}
    for term, col in index._retriever.vocab_dict.items():
        if col < len(s["indptr"]) - 1:
            lo, hi = s["indptr"][col], s["indptr"][col + 1]
            out[term] = dict(zip(s["indices"][lo:hi].tolist(), s["data"][lo:hi].tolist()))
    return out


def check(index: ClusteredBM25Index) -> None:
    clusters = index.clusters
    assert len(clusters) > 1
    reference = BM25Index(**index.bm25_config).index(clusters)
    assert weights(index.cluster_index) == weights(reference)


@pytest.mark.parametrize("config", [{}, {"method": "atire", "stemmer": None}, {"method": "bm25+"},
                                    {"token_pattern": r"[^ ]+"}])
def test_cluster_index_equals_index_of_cluster_texts(config):
    docs = [Unit(id=f"d{i}", text=t) for i, t in enumerate(TEXTS)]
    index = ClusteredBM25Index(max_tokens=12, **config).index(docs[:6])
    check(index)
    index.add(docs[6:])
    check(index)
    index.delete(["d1", "d4"])
    check(index)
    assert BM25Index(**config).splits_at("\n\n") is (not config.get("token_pattern"))
