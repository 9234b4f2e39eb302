"""FunnelRAG Algorithm 1 on small graphs worked out by hand.

Each test spells out, in comments, the arithmetic of the algorithm as the paper describes it:
visit the documents by local clustering coefficient (high to low, ties by index); a visited
document that is still a singleton starts a new cluster and merges its neighbours' clusters in
order of closeness (high to low; our closeness is the average edge weight between the document
and the cluster's members), skipping any merge that would exceed ``max_tokens``. The member lists
are compared exactly: they record the merge order, so a wrong visiting order or a missing
closeness sort changes them even where the clusters' sets happen to agree.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from funnel_core.funnelrag.clustering import cluster_documents, local_clustering_coefficient


def graph(n, edges):
    """Symmetric adjacency from ``{(i, j): weight}``."""
    rows, cols, vals = [], [], []
    for (i, j), w in edges.items():
        rows += [i, j]
        cols += [j, i]
        vals += [w, w]
    return sp.csr_matrix((vals, (rows, cols)), shape=(n, n))


# Triangle {1, 2, 3}, plus the path 4 - 0 - 1.
#
#   4 --- 0 --- 1
#              / \
#             2 - 3
TRIANGLE_AND_PATH = graph(5, {(0, 1): 1.0, (0, 4): 1.0, (1, 2): 1.0, (1, 3): 1.0, (2, 3): 1.0})


def test_local_clustering_coefficient_by_hand():
    # C(v) = 2 T(v) / (deg(v) (deg(v) - 1))
    # 0: neighbours {1, 4}, 1-4 not linked: T = 0            -> 0
    # 1: neighbours {0, 2, 3}, only 2-3 linked: T = 1        -> 2 * 1 / (3 * 2) = 1/3
    # 2: neighbours {1, 3}, 1-3 linked: T = 1                -> 2 * 1 / (2 * 1) = 1
    # 3: neighbours {1, 2}, 1-2 linked                       -> 1
    # 4: one neighbour                                       -> 0
    cc = local_clustering_coefficient(TRIANGLE_AND_PATH)
    assert cc.tolist() == pytest.approx([0.0, 1 / 3, 1.0, 1.0, 0.0])


def test_documents_are_visited_by_clustering_coefficient_then_index():
    # Visiting order: coefficients (0, 1/3, 1, 1, 0) high to low, ties by index -> 2, 3, 1, 0, 4.
    # max_tokens = 3, every document 1 token.
    # visit 2: singleton; neighbour clusters {1} (closeness 1/1) and {3} (1/1): a tie, broken by
    #          id -> merge 1 (size 2), then 3 (size 3)                   -> cluster [2, 1, 3]
    # visit 3, visit 1: already absorbed -> skipped
    # visit 0: neighbour clusters [2, 1, 3] (edge 0-1 only: 1/3) and {4} (1/1)
    #          -> merge 4 first (size 2); [2, 1, 3] would make 5 > 3    -> cluster [0, 4]
    # visit 4: absorbed.
    out = cluster_documents(TRIANGLE_AND_PATH, [1] * 5, max_tokens=3)
    assert out.members == [[0, 4], [2, 1, 3]]
    assert out.sizes == [2, 3]
    # Visiting by index instead (0 first) would give [[0, 1, 4], [2, 3]]; in reverse index order
    # (4 first) [[4, 0], [3, 1, 2]]; with the coefficient ties broken the other way (3 before 2)
    # [[0, 4], [3, 1, 2]]. None equals the above.


def test_neighbour_clusters_are_merged_in_order_of_closeness():
    # K4 with weights: every coefficient is 1, so documents are visited by index: 0, 1, 2, 3.
    #        w(0,1)=0.2  w(0,2)=0.9  w(0,3)=0.5  w(1,2)=0.1  w(1,3)=0.3  w(2,3)=0.7
    # max_tokens = 2: a new cluster takes exactly one neighbour.
    # visit 0: closeness to {1} 0.2, {2} 0.9, {3} 0.5 -> order 2, 3, 1 -> merge 2 -> [0, 2]
    # visit 1: closeness to [0, 2] (0.2 + 0.1) / 2 = 0.15, to {3} 0.3 -> merge 3 -> [1, 3]
    # Without the sort (clusters by id) visit 0 would merge 1 -> [[0, 1], [2, 3]].
    adj = graph(4, {(0, 1): 0.2, (0, 2): 0.9, (0, 3): 0.5, (1, 2): 0.1, (1, 3): 0.3, (2, 3): 0.7})
    out = cluster_documents(adj, [1] * 4, max_tokens=2)
    assert out.members == [[0, 2], [1, 3]]
    # max_tokens = 4: everything fits; the merge order is the closeness order 2, 3, 1
    assert cluster_documents(adj, [1] * 4, max_tokens=4).members == [[0, 2, 3, 1]]


def test_closeness_is_the_average_link_to_the_cluster():
    # Path 0 - 1 - 2 - 3 with w(0,1)=1.0, w(1,2)=0.5, w(2,3)=0.4; no triangles, so every
    # coefficient is 0 and the documents are visited by index. max_tokens = 3.
    # visit 0: merge {1}                                               -> [0, 1]
    # visit 1: absorbed
    # visit 2: closeness to [0, 1] = (0 + 0.5) / 2 = 0.25, to {3} = 0.4 -> merge 3 (size 2);
    #          [0, 1] would make 4 > 3                                  -> [2, 3]
    # A summed closeness (0.5 > 0.4) would merge [0, 1] first: [[2, 0, 1], [3]].
    adj = graph(4, {(0, 1): 1.0, (1, 2): 0.5, (2, 3): 0.4})
    out = cluster_documents(adj, [1] * 4, max_tokens=3)
    assert out.members == [[0, 1], [2, 3]]


def test_merges_that_exceed_max_tokens_are_skipped_not_stopped():
    # Star 0 - {1, 2, 3} with closeness 0.9, 0.8, 0.7 and sizes 1, 3, 5, 1; max_tokens = 6.
    # visit 0 (all coefficients 0 -> index order): order 1, 2, 3
    #   merge 1: 1 + 3 = 4;  merge 2: 4 + 5 = 9 > 6 -> skipped;  merge 3: 4 + 1 = 5 -> [0, 1, 3]
    # visit 1, 3: absorbed; visit 2: its only neighbour's cluster is full (5 + 5 > 6) -> {2} stays
    adj = graph(4, {(0, 1): 0.9, (0, 2): 0.8, (0, 3): 0.7})
    out = cluster_documents(adj, [1, 3, 5, 1], max_tokens=6)
    assert out.members == [[0, 1, 3], [2]]
    assert out.sizes == [5, 5]
    assert np.array_equal(out.assignment(4), [0, 0, 1, 0])


def test_isolated_and_oversized_documents_stay_alone():
    # 0 - 1 linked but together 7 > 6 tokens; 2 has no neighbour
    adj = graph(3, {(0, 1): 1.0})
    out = cluster_documents(adj, [4, 3, 1], max_tokens=6)
    assert out.members == [[0], [1], [2]]


def test_default_size_limit_is_4096_tokens_and_errors_name_the_value():
    # two linked documents of 2048 + 2048 tokens fit the default S = 4096; 2048 + 2049 do not
    adj = graph(2, {(0, 1): 1.0})
    assert cluster_documents(adj, [2048, 2048]).members == [[0, 1]]
    assert cluster_documents(adj, [2048, 2049]).members == [[0], [1]]
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        cluster_documents(adj, [1, 1], max_tokens=0)
    with pytest.raises(ValueError, match=r"adjacency shape \(2, 2\) does not match 3 documents"):
        cluster_documents(adj, [1, 1, 1])


def test_documents_without_neighbours_do_not_stop_the_visit():
    # all coefficients 0 -> index order; 0 is isolated and visited first, then 1 merges 2
    adj = graph(3, {(1, 2): 1.0})
    assert cluster_documents(adj, [1, 1, 1], max_tokens=5).members == [[0], [1, 2]]
    # grow_absorbed: the triangle {0, 1, 2} (coefficients 1) forms first; visiting 1 and 2 finds
    # every neighbour in their own cluster, and the visit goes on to 3 (coefficient 0) -> [3, 4]
    tri = graph(5, {(0, 1): 1.0, (0, 2): 1.0, (1, 2): 1.0, (3, 4): 1.0})
    out = cluster_documents(tri, [1] * 5, max_tokens=10, grow_absorbed=True)
    assert out.members == [[0, 1, 2], [3, 4]]


def test_clustering_reports_its_stats():
    out = cluster_documents(TRIANGLE_AND_PATH, [1] * 5, max_tokens=3)
    assert out.stats == {"n_documents": 5, "n_clusters": 2, "n_edges": 5, "max_tokens": 3}
    assert 0.0 < out.seconds < 60.0               # measured, not the dataclass default 0.0


def test_grow_absorbed_lets_an_absorbed_document_grow_its_cluster():
    # Triangle {0, 1, 2}, then the path 2 - 3 - 4; one token each, S = 4.
    #   C: 0 -> 1, 1 -> 1, 2 -> 2 * 1 / (3 * 2) = 1/3, 3 -> 0, 4 -> 0; visit 0, 1, 2, 3, 4.
    # Visit 0: merges 1 and 2 (closeness 1 each, ties by index) -> {0, 1, 2}, 3 tokens.
    # Default (singletons only): 1 and 2 are absorbed and skipped; 3 is a singleton and ranks
    #   4 (closeness 1 / 1) before {0, 1, 2} (1 / 3): {3, 4} (2 tokens), + 3 more > 4 -> skip.
    # grow_absorbed: visiting 2 grows {0, 1, 2} by its neighbour 3 (4 tokens); 4 then fits
    #   nowhere (1 + 4 > 4) and stays alone.
    adj = graph(5, {(0, 1): 1.0, (0, 2): 1.0, (1, 2): 1.0, (2, 3): 1.0, (3, 4): 1.0})
    assert cluster_documents(adj, [1] * 5, max_tokens=4).members == [[0, 1, 2], [3, 4]]
    grown = cluster_documents(adj, [1] * 5, max_tokens=4, grow_absorbed=True)
    assert grown.members == [[0, 1, 2, 3], [4]]
    assert grown.sizes == [4, 1]


def test_coefficients_of_low_degree_nodes_raise_no_warnings():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")          # 0 / 0 for degree-0 and degree-1 nodes is hidden
        cc = local_clustering_coefficient(graph(4, {(0, 1): 1.0}))
    assert cc.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_coefficient_chunk_size_is_checked_by_name():
    with pytest.raises(ValueError, match=r"^chunk_size must be >= 1, got 0"):
        local_clustering_coefficient(graph(2, {(0, 1): 1.0}), chunk_size=0)
