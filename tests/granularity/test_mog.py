"""Mix-of-Granularity core: levels, MoGG graph, soft labels, router training, selection rule."""

import numpy as np
import pytest

from funnel_core.bm25 import BM25Index
from funnel_core.errors import PersistError
from funnel_core.granularity import (
    MOG_PRESETS,
    GranularityBM25,
    GranularityGraph,
    GranularityHierarchy,
    GranularityRouter,
    GraphGranularityBuilder,
    MixOfGranularityRetrieve,
    MultiGranularityChunker,
    RouterNotTrainedError,
    bm25_knn_graph,
    choose_level,
    level_choice_counts,
    level_similarities,
    soft_labels,
)
from funnel_core.text import count_tokens, split_sentences
from funnel_core.units import Unit

pytestmark = pytest.mark.models  # builds or loads a model in most tests

DOCS = [
    "Paris is the capital of France. The Eiffel Tower stands in Paris. It was built in 1889 for a "
    "world fair. Gustave Eiffel's company designed the tower. The Louvre is the largest art museum. "
    "It holds the Mona Lisa. The Seine river flows through the city. Many bridges cross the Seine.",
    "BM25 is a ranking function for search engines. It scores documents by term frequency. Inverse "
    "document frequency lowers the weight of common terms. Dense retrieval encodes text as vectors. "
    "A cross-encoder reads the query and the passage together. Rerankers reorder the candidates.",
    "Hamlet is a tragedy by William Shakespeare. It is set in Denmark. Prince Hamlet seeks revenge "
    "for his father's murder. Shakespeare also wrote Macbeth and Othello. The Globe theatre staged "
    "his plays in London.",
]


@pytest.fixture(scope="module")
def hierarchy():
    return MultiGranularityChunker(chunk_size=12, n_gra=4).split(DOCS)


@pytest.fixture(scope="module")
def embedder():
    from funnel_core.embeddings import SentenceEmbedder

    return SentenceEmbedder(batch_size=64)


# -- levels ----------------------------------------------------------------------------------
def test_levels_are_nested_pairs_without_overlap(hierarchy):
    assert hierarchy.n_gra == 4
    level1 = hierarchy.level(1)
    assert all(count_tokens(u.text) <= 12 for u in level1)
    for doc_i, doc in enumerate(DOCS):  # level 1 of a document is the document, once, in order
        ones = [u for u in level1 if u.funnel["doc_index"] == doc_i]
        assert " ".join(u.text for u in ones).split() == doc.split()
        assert all(u.text.endswith(".") for u in ones)  # sentence-aware ends
    for j in range(2, 5):
        for u in hierarchy.level(j):
            kids = [hierarchy.by_id[c] for c in u.funnel["child_ids"]]
            assert 1 <= len(kids) <= 2 and all(k.parent_id == u.id for k in kids)
            assert u.text == " ".join(k.text for k in kids)
            assert [k.funnel["position"] for k in kids] == \
                list(range(2 * u.funnel["position"], 2 * u.funnel["position"] + len(kids)))
            assert len({k.funnel["doc_id"] for k in kids}) == 1
    assert all(u.parent_id is None for u in hierarchy.level(4))
    assert all(u.level == "granularity-1" and u.funnel["granularity"] == 1 for u in level1)


def test_covers_and_container_agree(hierarchy):
    for j in range(1, 5):
        for i, u in enumerate(hierarchy.level(j)):
            covered = hierarchy.covers(j, i)
            assert " ".join(hierarchy.finest[f].text for f in covered) == u.text
            assert all(hierarchy.container_index(int(f), j) == i for f in covered)
    f = 5
    assert hierarchy.ancestor(hierarchy.finest[f].id, 3).id == hierarchy.container(f, 3).id


def test_hierarchy_round_trips_from_shuffled_units(hierarchy):
    units = [u for level in hierarchy.levels for u in level][::-1]
    again = GranularityHierarchy.from_units(units)
    assert [[u.id for u in lv] for lv in again.levels] == [[u.id for u in lv] for lv in hierarchy.levels]
    with pytest.raises(ValueError, match="granularity"):
        GranularityHierarchy.from_units([Unit(id="x", text="no level")])


def test_default_five_levels_and_bad_input():
    h = MultiGranularityChunker().split(["word " * 700])
    assert h.n_gra == 5 and len(h.level(1)) > len(h.level(5))
    with pytest.raises(ValueError, match="n_gra"):
        MultiGranularityChunker(n_gra=0)
    with pytest.raises(TypeError, match="n_gra"):
        MultiGranularityChunker(n_gra=2.5)
    with pytest.raises(ValueError, match="chunk_size"):
        MultiGranularityChunker(chunk_size=0)
    with pytest.raises(ValueError, match="empty corpus"):
        MultiGranularityChunker().split([])
    with pytest.raises(TypeError, match="list of documents"):
        MultiGranularityChunker().split("one string")
    with pytest.warns(UserWarning, match="no words"):
        h = MultiGranularityChunker(chunk_size=5).split(["  ", "a b c"])
    with pytest.raises(ValueError, match="every document is empty"), pytest.warns(UserWarning):
        MultiGranularityChunker().split(["", " "])
    with pytest.raises(ValueError, match=r"level must be an int in \[1, 5\]"):
        h.level(6)


def test_document_shorter_than_one_chunk_is_one_chunk_per_level():
    h = MultiGranularityChunker(chunk_size=50, n_gra=3).split(["Short text here.", DOCS[0]])
    short = [[u for u in h.level(j) if u.funnel["doc_index"] == 0] for j in (1, 2, 3)]
    assert [len(s) for s in short] == [1, 1, 1]
    assert {s[0].text for s in short} == {"Short text here."}
    assert short[0][0].parent_id == short[1][0].id


# -- graph (MoGG) ----------------------------------------------------------------------------
def test_graph_nodes_and_knn_edges_match_brute_force_bm25():
    builder = GraphGranularityBuilder(sentences_per_node=1, k_graph=2, t_graph=0.1, n_gra=3)
    nodes = builder.nodes(DOCS)
    assert all(len(split_sentences(n.text)) == 1 for n in nodes)
    index = BM25Index().index(nodes)
    directed = bm25_knn_graph(index, k_graph=2, t_graph=0.1, block_size=4)
    for i, node in enumerate(nodes):
        scores = index.get_scores(node.text)
        norm = scores / scores[i] if scores[i] > 0 else np.zeros_like(scores)
        norm[i] = -1
        expected = {int(j) for j in np.argsort(-norm, kind="stable")[:2]
                    if norm[j] >= 0.1 and scores[j] > 0}
        got = set(directed.indices[directed.indptr[i]:directed.indptr[i + 1]].tolist())
        assert got == expected
    graph = builder.build_from_nodes(nodes)
    assert graph.n_edges > 0 and (graph.adjacency != graph.adjacency.T).nnz == 0
    assert graph.build_seconds is not None and graph.build_seconds >= 0
    assert all(0.1 <= w <= 1.0 for w in graph.adjacency.data)


def test_hop_levels_grow_in_document_order_without_duplicates():
    graph = GraphGranularityBuilder(sentences_per_node=2, k_graph=2, t_graph=0.05, n_gra=3).build(DOCS)
    for i in range(len(graph.nodes)):
        sets = [graph.neighbourhood(i, j) for j in (1, 2, 3)]
        assert i in sets[0]
        for a, b in zip(sets, sets[1:]):
            assert set(a) <= set(b)
        for s in sets:
            assert list(s) == sorted(set(s.tolist()))
        unit = graph.levels[1][i]
        assert unit.text == " ".join(graph.nodes[m].text for m in sets[1])
        assert unit.funnel["center_id"] == graph.nodes[i].id and unit.funnel["granularity"] == 2
    again = GranularityGraph.from_units(list(reversed(graph.nodes)), n_gra=3)
    assert (again.adjacency != 0).nnz == (graph.adjacency != 0).nnz


def test_empty_graph_warns_and_levels_are_the_nodes():
    with pytest.warns(UserWarning, match="no edges"):
        graph = GraphGranularityBuilder(k_graph=2, t_graph=1.0, n_gra=2).build(DOCS)
    assert graph.n_edges == 0
    assert [u.text for u in graph.levels[1]] == [n.text for n in graph.nodes]
    with pytest.raises(ValueError, match="t_graph"):
        GraphGranularityBuilder(t_graph=1.5)
    with pytest.raises(ValueError, match="k_graph"):
        GraphGranularityBuilder(k_graph=0)
    with pytest.raises(ValueError, match="n_gra"):
        GraphGranularityBuilder(n_gra=0)


# -- soft labels -----------------------------------------------------------------------------
def test_soft_labels_follow_the_paper():
    labels = soft_labels(np.array([[0.1, 0.9, 0.5, 0.0], [1.0, 1.0, 1.0, 0.2], [0, 0, 0, 0]]))
    assert labels.tolist() == [[0.0, 0.8, 0.2, 0.0], [0.8, 0.2, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    # one level: only the best label; negative second-best still gets 0.2 (it is second)
    assert soft_labels(np.array([[0.3]])).tolist() == [[0.8]]
    assert soft_labels(np.array([[0.5, -0.1]])).tolist() == [[0.8, 0.2]]
    assert soft_labels([[1, 2, 0]]).tolist() == [[0.2, 0.8, 0.0]]           # integer similarities
    with pytest.raises(ValueError, match="shape"):
        soft_labels(np.array([0.1, 0.2]))


def test_soft_labels_tolerance_and_tie_rule():
    sims = np.array([[0.90, 1.00, 0.97, 0.2],    # near-tie between levels 2 and 3, level 1 close
                     [0.50, 0.50, 0.50, 0.50]])  # exact four-way tie
    # tolerance 0: exact ties only -> row 0: best level 2, second level 3
    assert soft_labels(sims).tolist() == [[0, 0.8, 0.2, 0], [0.8, 0.2, 0, 0]]
    assert soft_labels(sims, ties="coarser").tolist() == [[0, 0.8, 0.2, 0], [0, 0, 0.2, 0.8]]
    # tolerance 0.05: levels with sim >= 1.00 - 0.05 (2 and 3) tie for best; finer wins (2);
    # then among {1, 3, 4} the best is 0.97, tied with nothing within 0.05 above 0.92 -> level 3
    assert soft_labels(sims, tolerance=0.05).tolist()[0] == [0, 0.8, 0.2, 0]
    # coarser wins the tie: best level 3, then among {1, 2, 4}: top 1.00, tied: {2} -> level 2
    assert soft_labels(sims, tolerance=0.05, ties="coarser").tolist()[0] == [0, 0.2, 0.8, 0]
    # tolerance 0.2: levels 1-3 tie (>= 0.8); finer -> 1 best, then among {2, 3, 4}: 2
    assert soft_labels(sims, tolerance=0.2).tolist()[0] == [0.8, 0.2, 0, 0]
    assert soft_labels(sims, tolerance=0.2, ties="coarser").tolist()[0] == [0, 0.2, 0.8, 0]
    with pytest.raises(ValueError, match="ties must be"):
        soft_labels(sims, ties="random")
    with pytest.raises(ValueError, match="tolerance"):
        soft_labels(sims, tolerance=-0.1)


def test_choose_level_and_margin_rule():
    assert choose_level([0.1, 0.9, 0.3]) == 2
    assert choose_level([0.5, 0.5, 0.1]) == 1            # ties go to the finer level
    assert choose_level([0.9, 0.85, 0.1], margin=0.1) == 2   # unsure (0.05 < 0.1): coarser of the two
    assert choose_level([0.9, 0.75, 0.1], margin=0.1) == 1   # 0.15 lead: the router's choice
    assert choose_level([0.2, 0.85, 0.9], margin=0.1) == 3   # runner-up finer: keep the coarser best
    assert choose_level([0.7], margin=0.5) == 1
    assert choose_level([0.5, 0.45], margin=0.1) == 2          # two levels: the rule applies
    assert choose_level([0.75, 0.5], margin=0.25) == 1         # a lead equal to the margin is enough
    assert choose_level([0.5, 0.5], margin=0.0) == 1
    w = np.array([[0.9, 0.1, 0.0], [0.9, 0.85, 0.0], [0.1, 0.2, 0.5], [0.6, 0.6, 0.1]])
    assert level_choice_counts(w) == [3, 0, 1]       # rows 0, 1, 3 -> level 1; row 2 -> level 3
    # margin 0.1: row 1 (lead 0.05) and row 3 (tie) move to level 2
    assert level_choice_counts(w, margin=0.1) == [1, 2, 1]


def test_choose_level_is_the_argmax_for_one_hot_and_unsigned_weights():
    """The returned level is argmax_j w_j whatever the weights' number type: a one-hot mask (bool)
    or unsigned integers, where negating the weights to sort them would fail or wrap around."""
    assert choose_level(np.array([False, False, True])) == 3
    assert choose_level(np.array([0, 3], dtype=np.uint8)) == 2
    assert choose_level(np.array([0, 3, 1], dtype=np.uint8), margin=0.5) == 2
    assert level_choice_counts(np.eye(3, dtype=bool)) == [1, 1, 1]


def test_level_similarities_hit_tfidf_cosine(hierarchy, embedder):
    qs = ["When was the Eiffel Tower built?", "Who wrote Hamlet?"]
    refs = ["1889", "William Shakespeare"]
    hit = level_similarities(qs, refs, hierarchy, similarity="hit")
    assert hit.shape == (2, 4) and hit.max() == 1.0 and ((hit >= 0) & (hit <= 1)).all()
    index = GranularityBM25(hierarchy)
    for sim in ("tfidf", "cosine"):
        s = level_similarities(qs, refs, index, similarity=sim, embedder=embedder)
        assert s.shape == (2, 4) and np.isfinite(s).all() and s.max() > 0
    with pytest.raises(ValueError, match="similarity"):
        level_similarities(qs, refs, index, similarity="bleu")


# -- router ----------------------------------------------------------------------------------
FACT_QS = [f"What year did {x} happen?" for x in (
    "the fall of Rome", "the moon landing", "the French revolution", "the first world war",
    "the invention of printing", "the signing of the treaty", "the big earthquake",
    "the founding of the city", "the final match", "the election")]
BROAD_QS = [f"Give an overview of the history and themes of {x}." for x in (
    "Roman culture", "space exploration", "European politics", "modern warfare",
    "book publishing", "diplomacy", "geology", "urban planning", "sports", "democracy")]


@pytest.fixture(scope="module")
def trained_router(embedder):
    labels = np.array([[0.8, 0.2, 0, 0]] * len(FACT_QS) + [[0, 0, 0.2, 0.8]] * len(BROAD_QS))
    router = GranularityRouter(4, embedder=embedder, hidden=32)
    history = router.fit(FACT_QS + BROAD_QS, labels, val_fraction=0.2, epochs=300, patience=20)
    return router, history


def test_router_learns_granularity_from_soft_labels(trained_router):
    router, history = trained_router
    assert history["val_loss"][history["best_epoch"] - 1] == min(history["val_loss"])
    assert history["train_loss"][-1] < history["train_loss"][0]
    w = router.predict(["What year did the revolution of Paris happen?",
                        "Give an overview of the history and themes of medieval art."])
    assert w.shape == (2, 4) and ((w > 0) & (w < 1)).all()
    assert int(np.argmax(w[0])) == 0 and int(np.argmax(w[1])) == 3
    assert all(type(x) is float for x in router.weights("anything"))


def test_router_weights_are_one_sigmoid_per_level_not_a_softmax(trained_router):
    """Section 3.2.2: one sigmoid per granularity level. Each weight is 1 / (1 + e^-z_j) of its
    own logit z_j (written here from the MLP's raw output), rows need not sum to 1, and moving
    one level's logit leaves the other levels' weights unchanged (a softmax would move them all)."""
    import copy

    import torch

    router, _ = trained_router
    qs = ["What year did the moon landing happen?", "Give an overview of sports."]
    emb = torch.from_numpy(router.embed(qs)).float()
    with torch.no_grad():
        z = router._mlp(emb).double().numpy()
    w = router.predict(qs)
    np.testing.assert_allclose(w, 1.0 / (1.0 + np.exp(-z)), rtol=1e-6)
    assert abs(w.sum(axis=1) - 1.0).max() > 0.05
    shifted = copy.copy(router)
    shifted._mlp = copy.deepcopy(router._mlp)
    with torch.no_grad():
        shifted._mlp[-1].bias[0] += 3.0
    w2 = shifted.predict(qs)
    np.testing.assert_allclose(w2[:, 1:], w[:, 1:], rtol=1e-6)
    assert (w2[:, 0] > w[:, 0]).all()


def test_router_save_load_and_untrained(trained_router, tmp_path, embedder):
    router, _ = trained_router
    router.save(tmp_path / "router")
    again = GranularityRouter.load(tmp_path / "router", embedder=embedder)
    q = ["What year did the moon landing happen?"]
    np.testing.assert_allclose(again.predict(q), router.predict(q), rtol=1e-6)
    with pytest.raises(PersistError, match="no trained router"):
        GranularityRouter.load(tmp_path / "missing")
    fresh = GranularityRouter(4, embedder=embedder)
    with pytest.raises(RouterNotTrainedError, match=r"^this GranularityRouter is not trained; call "
                       r"fit\(queries, soft_labels\(\.\.\.\)\) or GranularityRouter\.load\(path\) "
                       r"first, or pass router=None to MoG retrieval for uniform level weights\.$"):
        fresh.predict(q)
    assert router.predict(q).dtype == np.float64
    with pytest.raises(RouterNotTrainedError):
        fresh.save(tmp_path / "x")
    with pytest.raises(ValueError, match="labels must have shape"):
        fresh.fit(q * 2, np.zeros((2, 3)))


# -- MoG selection ---------------------------------------------------------------------------
def _expected_finest(structure, index, query, w, k_r, normalize="none"):
    """The rule written out naively: per level top-k_r (raw scores, eq. 1; or max-normalised),
    weighted sum per finest unit."""
    total = np.zeros(len(structure.finest))
    for j in range(1, structure.n_gra + 1):
        hits = index.search_level(query, j, k_r)
        if not hits:
            continue
        top = max(h.score for h in hits) if normalize == "max" else 1.0
        best = np.zeros(len(structure.finest))
        for h in hits:
            i = [u.id for u in structure.level(j)].index(h.id)
            for f in structure.covers(j, i):
                best[f] = max(best[f], h.score / top)
        total += w[j - 1] * best
    return int(np.argmax(total)), float(total.max())


@pytest.mark.parametrize("normalize", ["none", "max"])
@pytest.mark.parametrize("weights", [[1, 0, 0, 0], [0.1, 0.2, 0.9, 0.3], [0.2, 0.2, 0.2, 0.7]])
def test_mog_rule_picks_finest_then_returns_container_at_best_level(hierarchy, weights, normalize):
    index = GranularityBM25(hierarchy)
    mog = MixOfGranularityRetrieve(index, k_r=3, normalize=normalize)
    query = "Who designed the Eiffel Tower in Paris?"
    out = mog.retrieve(query, k=1, weights=weights)
    f, score = _expected_finest(hierarchy, index, query, np.array(weights, float), 3, normalize)
    level = int(np.argmax(weights)) + 1
    assert out[0].id == hierarchy.container(f, level).id
    assert out[0].funnel["chosen_level"] == level and out[0].level == f"granularity-{level}"
    assert out[0].funnel["router_weights"] == [float(x) for x in weights]
    assert out[0].score == pytest.approx(score) and out[0].funnel["finest_id"] == hierarchy.finest[f].id


def test_default_is_the_paper_preset_raw_scores_k_r_3(hierarchy):
    index = GranularityBM25(hierarchy)
    default = MixOfGranularityRetrieve(index)
    assert (default.k_r, default.normalize, default.level_margin) == (3, "none", 0.0)
    assert MOG_PRESETS["paper"] == {"k_r": 3, "normalize": "none", "level_margin": 0.0}
    norm = MixOfGranularityRetrieve.from_preset("normalised", index)
    assert (norm.k_r, norm.normalize) == (10, "max")
    assert MixOfGranularityRetrieve.from_preset("paper", index, k_r=5).k_r == 5
    with pytest.raises(ValueError, match="preset must be one of"):
        MixOfGranularityRetrieve.from_preset("best", index)
    with pytest.raises(ValueError, match="level_margin"):
        MixOfGranularityRetrieve(index, level_margin=2.0)
    # the default scores are raw weighted BM25 sums (eq. 1), not ratios to each level's best
    w = [0.1, 0.2, 0.9, 0.3]
    queries = ["Who designed the Eiffel Tower in Paris?", "Shakespeare tragedy Hamlet Denmark",
               "capital of France", "Eiffel Tower"]
    raw_vs_norm = []
    for q in queries:
        got = default.retrieve(q, k=1, weights=w)[0]
        f, score = _expected_finest(hierarchy, index, q, np.array(w), 3, "none")
        assert got.score == pytest.approx(score) and got.funnel["finest_id"] == hierarchy.finest[f].id
        raw_vs_norm.append(score != pytest.approx(_expected_finest(hierarchy, index, q, np.array(w), 3, "max")[1]))
    assert any(raw_vs_norm)
    # k_r bounds the hits per level: with k_r=1 only each level's top unit can score
    one = MixOfGranularityRetrieve(index, k_r=1).retrieve(queries[0], k=5, weights=w)
    f1, s1 = _expected_finest(hierarchy, index, queries[0], np.array(w), 1, "none")
    assert one[0].score == pytest.approx(s1)


def test_hit_rate_by_hand():
    from funnel_core.granularity.router import _hit_rate

    assert _hit_rate("The Eiffel Tower, in 1889.", "Eiffel 1889") == 1.0
    assert _hit_rate("The Eiffel Tower", "Gustave Eiffel") == 0.5
    assert _hit_rate("anything", "the") == 0.0          # normalised reference has no words


def test_coarse_top_k_returns_distinct_containers_with_the_stage_name(hierarchy):
    index = GranularityBM25(hierarchy)
    mog = MixOfGranularityRetrieve(index, k_r=10, name="mog-test")
    out = mog.retrieve("Paris Eiffel Tower Louvre Seine Shakespeare Hamlet", k=2, weights=[0, 0, 0.1, 1])
    assert len(out) == 2 and len({u.id for u in out}) == 2
    assert all(u.funnel["chosen_level"] == 4 for u in out)
    assert set(out[0].scores) == {"mog-test"}
    with pytest.raises(ValueError, match=r"need 4 level weights, got shape \(3,\)"):
        mog.retrieve("Paris", weights=[1, 0, 0])


def test_level_margin_returns_the_coarser_unit_when_the_router_is_unsure(hierarchy):
    index = GranularityBM25(hierarchy)
    q = "Who designed the Eiffel Tower in Paris?"
    w = [0.9, 0.85, 0.1, 0.1]
    assert MixOfGranularityRetrieve(index).retrieve(q, weights=w)[0].funnel["chosen_level"] == 1
    unsure = MixOfGranularityRetrieve(index, level_margin=0.1).retrieve(q, weights=w)[0]
    assert unsure.funnel["chosen_level"] == 2 and unsure.level == "granularity-2"


def test_mog_top_k_uniform_router_and_errors(hierarchy, trained_router):
    mog = MixOfGranularityRetrieve(hierarchy, None, k_r=5, top_k=3)
    out = mog("Shakespeare tragedy Hamlet Denmark")
    assert len(out) == 3 and len({u.id for u in out}) == 3
    assert all(u.funnel["chosen_level"] == 1 for u in out)  # uniform weights -> finest
    assert [u.score for u in out] == sorted((u.score for u in out), reverse=True)
    assert "Hamlet" in out[0].text
    assert (mog % 1)("Shakespeare") and mog("   ") == []
    router, _ = trained_router
    routed = MixOfGranularityRetrieve(hierarchy, router)("Give an overview of the history of Paris.")
    assert routed[0].funnel["chosen_level"] == 4 and "Paris" in routed[0].text
    with pytest.raises(ValueError, match="router has 4 outputs"):
        MixOfGranularityRetrieve(MultiGranularityChunker(n_gra=3).split(DOCS), router)
    with pytest.raises(RouterNotTrainedError):
        MixOfGranularityRetrieve(hierarchy, GranularityRouter(4, embedder=router.embedder))("Paris")
    with pytest.raises(ValueError, match="k must be >= 1"):
        mog.retrieve("Paris", k=0)
    with pytest.raises(TypeError, match="GranularityStructure"):
        MixOfGranularityRetrieve(["not", "a", "structure"])


def test_mog_over_graph_returns_hop_neighbourhoods():
    graph = GraphGranularityBuilder(sentences_per_node=1, k_graph=2, t_graph=0.05, n_gra=3).build(DOCS)
    mog = MixOfGranularityRetrieve(graph, k_r=5)
    out = mog.retrieve("Who designed the Eiffel Tower?", k=2, weights=[0.1, 0.9, 0.2])
    assert len(out) == 2 and all(u.funnel["chosen_level"] == 2 for u in out)
    center = out[0].funnel["center_id"]
    assert out[0].funnel["finest_id"] == center and "Eiffel" in out[0].text
    assert len(out[0].funnel["node_ids"]) >= 2


# -- hop ranges, overlapping neighbourhoods, k_r, router loss: by hand -------------------------
#: five sentence nodes on a path 0 - 1 - 2 - 3 - 4 (edges set by hand)
PATH_TEXTS = ["Paris is the capital of France.", "The Eiffel Tower stands in Paris.",
              "Gustave Eiffel designed the tower.", "The tower was built in 1889.",
              "Bread is baked in ovens."]
PATH_EDGES = [(0, 1), (1, 2), (2, 3), (3, 4)]


def _path_graph(n_gra=3):
    import scipy.sparse as sp

    nodes = [Unit(id=f"s{i}", text=t, funnel={"doc_index": 0, "position": i})
             for i, t in enumerate(PATH_TEXTS)]
    rows, cols = zip(*PATH_EDGES)
    adjacency = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(nodes),) * 2)
    return GranularityGraph(nodes, adjacency, n_gra=n_gra)


def _within_hops(start, hops):
    """Breadth-first search on PATH_EDGES: the nodes at most ``hops`` edges from ``start``."""
    seen, frontier = {start}, {start}
    for _ in range(hops):
        frontier = {b for a, b in PATH_EDGES if a in frontier} | \
                   {a for a, b in PATH_EDGES if b in frontier}
        frontier -= seen
        seen |= frontier
    return sorted(seen)


def test_level_j_is_the_j_hop_neighbourhood():
    """MoGG: the level-j snippet of node i is every node within j hops of i (j = 1..n_gra): level
    1 already holds the direct neighbours, level 2 their neighbours too."""
    graph = _path_graph(n_gra=3)
    assert graph.neighbourhood(2, 1).tolist() == [1, 2, 3]
    assert graph.neighbourhood(0, 2).tolist() == [0, 1, 2]
    for j in (1, 2, 3):
        for i in range(len(PATH_TEXTS)):
            want = _within_hops(i, j)
            assert graph.neighbourhood(i, j).tolist() == want
            unit = graph.levels[j - 1][i]
            assert unit.text == " ".join(PATH_TEXTS[m] for m in want)
            assert unit.funnel["node_ids"] == [f"s{m}" for m in want]


def _mog_by_hand(index, query, w, k_r, combine=max):
    """MoG over the path graph, written out: per level j, BM25's top-``k_r`` level-j snippets;
    a node's level-j score is the best score of a retrieved snippet that contains it (snippets
    overlap on a graph; ``combine=sum`` is the misreading); the mixed score is the
    router-weighted sum over levels. Returns ``{node index: mixed score}``."""
    total: dict[int, float] = {}
    for j in range(1, len(w) + 1):
        per_node: dict[int, list[float]] = {}
        for hit in index.search_level(query, j, k_r):
            center = int(hit.id.split("/")[0][1:])                   # "s<i>/h<j>"
            for f in _within_hops(center, j):
                per_node.setdefault(f, []).append(float(hit.score))
        for f, scores in per_node.items():
            total[f] = total.get(f, 0.0) + w[j - 1] * combine(scores)
    return total


def test_a_node_in_overlapping_neighbourhoods_takes_its_best_snippet_score_not_the_sum():
    graph = _path_graph(n_gra=2)
    index = GranularityBM25(graph)
    query, w = "Eiffel tower Paris", [0.3, 1.0]
    want = _mog_by_hand(index, query, w, k_r=5)
    assert want != pytest.approx(_mog_by_hand(index, query, w, k_r=5, combine=sum))
    out = MixOfGranularityRetrieve(index, k_r=5).retrieve(query, k=5, weights=w)
    got = {int(u.funnel["finest_id"][1:]): u.score for u in out}
    assert got == pytest.approx(want)
    assert [u.score for u in out] == pytest.approx(sorted(want.values(), reverse=True))


def test_k_r_is_raised_to_the_number_of_results_asked_for():
    """k_r=1 and top-3: BM25 retrieves max(k_r, k) = 3 snippets per level, so the three results
    carry the scores of the 3-snippet rule, not those of one snippet per level."""
    graph = _path_graph(n_gra=2)
    index = GranularityBM25(graph)
    query, w = "Eiffel tower Paris", [1.0, 0.2]
    want = sorted(_mog_by_hand(index, query, w, k_r=3).values(), reverse=True)[:3]
    assert want != pytest.approx(sorted(_mog_by_hand(index, query, w, k_r=1).values(),
                                        reverse=True)[:3])
    out = MixOfGranularityRetrieve(index, k_r=1).retrieve(query, k=3, weights=w)
    assert [u.score for u in out] == pytest.approx(want)


def _hand_hierarchy():
    """Eight finest units -> four pairs -> three groups (the first group holds two pairs)."""
    finest = ["tower paris", "old stone", "tower city", "green hill", "river bank", "blue sea",
              "bread oven", "hot fire"]
    pair_of, group_of = [0, 0, 1, 1, 2, 2, 3, 3], [0, 0, 1, 2]
    pairs = [" ".join(finest[2 * i:2 * i + 2]) for i in range(4)]
    groups = [f"{pairs[0]} {pairs[1]}", pairs[2], pairs[3]]
    return GranularityHierarchy([
        [Unit(id=f"f{i}", text=t, parent_id=f"p{pair_of[i]}") for i, t in enumerate(finest)],
        [Unit(id=f"p{i}", text=t, parent_id=f"g{group_of[i]}") for i, t in enumerate(pairs)],
        [Unit(id=f"g{i}", text=t) for i, t in enumerate(groups)],
    ])


@pytest.mark.parametrize("normalize", ["none", "max"])
def test_a_level_without_hits_leaves_the_coarser_levels_in_the_mix(normalize):
    """Eq. 1 sums over every level j the weighted score of the level's retrieved snippets; a
    level where BM25 retrieves nothing adds 0 and the coarser levels still count. Robertson's
    IDF, log((N - df + 0.5) / (df + 0.5)), is 0 for "tower" among the four pairs (df = 2) but
    positive among the eight finest units and the three groups (df = 2 of 8, 1 of 3). Every
    retrieved score is below 1, so "max" (divide by the level's best) changes the numbers."""
    hierarchy = _hand_hierarchy()
    index = GranularityBM25(hierarchy, method="robertson", engine="numpy")
    assert index.search_level("tower", 2, 3) == []
    f1, g3 = index.search_level("tower", 1, 3), index.search_level("tower", 3, 3)
    assert [u.id for u in f1] == ["f0", "f2"] and [u.id for u in g3] == ["g0"]
    assert max(u.score for u in f1 + g3) < 1.0
    w = [0.2, 0.5, 1.0]
    top = (lambda hits: max(u.score for u in hits)) if normalize == "max" else (lambda hits: 1.0)
    # f0 (and f2): level 1 hit + level 3 group g0 holding it; level 2 adds nothing
    want = w[0] * f1[0].score / top(f1) + w[2] * g3[0].score / top(g3)
    f, score = _expected_finest(hierarchy, index, "tower", np.array(w), 3, normalize)
    assert (f, score) == (0, pytest.approx(want))
    out = MixOfGranularityRetrieve(index, k_r=3, normalize=normalize).retrieve("tower", k=3,
                                                                               weights=w)
    assert [u.id for u in out] == ["g0"]                  # level 3 (largest weight), one group
    assert out[0].score == pytest.approx(want) and out[0].funnel["finest_id"] == "f0"


class _TwoKindsEmbedder:
    """Stands in for the sentence encoder: "fact ..." queries -> e1, "broad ..." queries -> e2."""

    model_name_or_path = "two-kinds"
    dimension = 4

    def encode(self, texts, **kw):
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for i, t in enumerate(texts):
            out[i, 0 if t.startswith("fact") else 1] = 1.0
        return out


def test_router_trains_one_sigmoid_per_level_with_binary_cross_entropy():
    """Section 3.2.2: each level's output is a sigmoid trained with binary cross-entropy against
    the soft label. Per level, -[y log p + (1 - y) log(1 - p)] is smallest at p = y, so a router
    trained to convergence predicts the soft labels themselves (0.8 / 0.2 / 0 / 0). A softmax
    trained with cross-entropy matches the labels with softmax(z) instead, and its sigmoids drift
    to ~1 for both labelled levels."""
    qs = [f"fact {i}" for i in range(10)] + [f"broad {i}" for i in range(10)]
    labels = np.array([[0.8, 0.2, 0, 0]] * 10 + [[0, 0, 0.2, 0.8]] * 10)
    router = GranularityRouter(4, embedder=_TwoKindsEmbedder(), hidden=16)
    router.fit(qs, labels, epochs=2000, lr=1e-2, patience=50)
    w = router.predict(["fact new", "broad new"])
    np.testing.assert_allclose(w, [[0.8, 0.2, 0, 0], [0, 0, 0.2, 0.8]], atol=0.03)
    p = np.clip(w, 1e-12, 1 - 1e-12)
    bce = -(labels[[0, 10]] * np.log(p) + (1 - labels[[0, 10]]) * np.log(1 - p)).mean()
    best = -(0.8 * np.log(0.8) + 0.2 * np.log(0.2)) / 2                # entropy of the labels
    assert bce == pytest.approx(best, abs=0.02)


# -- MoGG edges against their definition (section 3.3) ------------------------------------------
def _reference_edges(index, k, t_graph, pair_tokens=None):
    """Directed edges ``{(i, j): weight}`` written from the definition: the normalised similarity
    of node j to node i is bm25(text_i -> text_j) / bm25(text_i -> text_i); node i links to its k
    most similar other nodes (ties: lower index) whose similarity reaches t_graph and is > 0; the
    weight is the similarity, capped at 1. Only nodes that share a query term are similar at all
    (bm25l / bm25+ give every node a constant score, term or not). ``pair_tokens[i]`` (default:
    node i's tokens) is the query of the pair scores; the self-score always uses every token."""
    tokens = index.tokenize([u.text for u in index.units])
    edges = {}
    for i, toks in enumerate(tokens):
        query = toks if pair_tokens is None else pair_tokens[i]
        self_score = float(index.token_scores(toks)[i])
        pair = index.token_scores(query)
        if self_score <= 0:
            continue
        cands = [(float(pair[j]) / self_score, j) for j in range(len(tokens))
                 if j != i and set(query) & set(tokens[j]) and pair[j] > 0
                 and pair[j] / self_score >= t_graph]
        for norm, j in sorted(cands, key=lambda c: (-c[0], c[1]))[:k]:
            edges[(i, j)] = min(norm, 1.0)
    return edges


def _edges(matrix):
    m = matrix.tocoo()
    return {(int(r), int(c)): float(v) for r, c, v in zip(m.row, m.col, m.data)}


@pytest.mark.parametrize("method", ["lucene", "bm25l", "bm25+"])
def test_knn_graph_edge_weights_are_the_normalised_bm25_similarity(method):
    """Every edge and its weight, for BM25 variants with and without a non-occurrence score
    (bm25l / bm25+ add a per-query constant to every node's score, the self-score included)."""
    nodes = GraphGranularityBuilder(sentences_per_node=1).nodes(DOCS)
    index = BM25Index(method=method).index(nodes)
    got = _edges(bm25_knn_graph(index, k_graph=3, t_graph=0.05, block_size=5))
    want = _reference_edges(index, 3, 0.05)
    assert got.keys() == want.keys() and len(want) > 10
    for key, weight in want.items():
        assert got[key] == pytest.approx(weight, rel=1e-5)


@pytest.mark.parametrize("method", ["lucene", "bm25l"])
def test_max_df_leaves_frequent_terms_out_of_the_pair_scores_only(method):
    """``max_df``: terms in more than ``max_df * n`` nodes do not count in the pair scores; the
    self-scores stay exact (for bm25l, its non-occurrence part included). A term in exactly
    ``max_df * n`` nodes still counts."""
    nodes = GraphGranularityBuilder(sentences_per_node=1).nodes(DOCS + [
        "Paris and the tower and the river in Paris.", "The river, the tower and the museum."])
    index = BM25Index(method=method).index(nodes)
    tokens = index.tokenize([u.text for u in nodes])
    n = len(nodes)
    df = {}
    for toks in tokens:
        for t in set(toks):
            df[t] = df.get(t, 0) + 1
    assert max(df.values()) >= 3
    checked = 0
    for d in sorted(set(df.values()) - {max(df.values())}, reverse=True)[:3]:
        max_df = d / n
        kept = [[t for t in toks if df[t] <= d] for toks in tokens]
        want = _reference_edges(index, 3, 0.05, pair_tokens=kept)
        got = _edges(bm25_knn_graph(index, k_graph=3, t_graph=0.05, max_df=max_df))
        assert got.keys() == want.keys()
        for key, weight in want.items():
            assert got[key] == pytest.approx(weight, rel=1e-5)
        checked += got != _edges(bm25_knn_graph(index, k_graph=3, t_graph=0.05))
    assert checked >= 1  # the cut changed the graph at least once
    assert _edges(bm25_knn_graph(index, k_graph=3, t_graph=0.05, max_df=1.0)) == pytest.approx(
        _edges(bm25_knn_graph(index, k_graph=3, t_graph=0.05)))
    one = _edges(bm25_knn_graph(index, k_graph=1, t_graph=0.05))   # k_graph = 1: the best only
    assert one == pytest.approx(_reference_edges(index, 1, 0.05)) and one


def test_knn_graph_errors_name_the_bad_value():
    index = BM25Index().index(GraphGranularityBuilder().nodes(DOCS))
    for kwargs, name in [({"k_graph": 0}, "^k_graph must be >= 1"), ({"t_graph": 1.5}, r"^t_graph must be in \[0, 1\]"),
                         ({"block_size": 0}, "^block_size must be >= 1"), ({"max_df": 0.0}, r"max_df must be in \(0, 1\]"),
                         ({"max_df": 1.5}, r"max_df must be in \(0, 1\] or None, got 1\.5")]:
        with pytest.raises(ValueError, match=name):
            bm25_knn_graph(index, **kwargs)


def test_graph_from_units_restores_document_order_and_edge_weights():
    """A graph rebuilt from its nodes (e.g. after a node parser) is the same graph: nodes in
    document order (level snippets list their nodes in document order), the same weighted edges;
    nodes without weights get weight 1; a node without neighbours' ids is refused."""
    graph = GraphGranularityBuilder(sentences_per_node=1, k_graph=2, t_graph=0.05, n_gra=3).build(DOCS)
    order = np.random.default_rng(0).permutation(len(graph.nodes))
    again = GranularityGraph.from_units([graph.nodes[i] for i in order], n_gra=3)
    assert [u.id for u in again.nodes] == [u.id for u in graph.nodes] and again.n_gra == 3
    assert _edges(again.adjacency) == pytest.approx(_edges(graph.adjacency))
    assert len({round(w, 4) for w in graph.adjacency.data}) > 2   # the weights are not all alike
    assert [u.text for u in again.levels[2]] == [u.text for u in graph.levels[2]]
    assert GranularityGraph.from_units(graph.nodes).n_gra == 5     # the builder's default
    bare = []
    for u in graph.nodes:
        v = u.copy()
        v.funnel.pop("graph_weights")
        bare.append(v)
    unweighted = GranularityGraph.from_units(bare, n_gra=3)
    assert set(unweighted.adjacency.data.tolist()) == {1.0}
    assert (unweighted.adjacency != 0).nnz == (graph.adjacency != 0).nnz
    # a last node without neighbours still counts: the graph has every node
    alone = Unit(id="z/s0", text="Nothing else.", funnel={"doc_index": 9, "position": 0,
                                                          "graph_neighbors": [], "graph_weights": []})
    with_alone = GranularityGraph.from_units(graph.nodes + [alone], n_gra=3)
    assert with_alone.adjacency.shape == (len(graph.nodes) + 1,) * 2 and with_alone.nodes[-1].id == "z/s0"
    lost = graph.nodes[1].copy()
    lost.funnel.pop("graph_neighbors")
    with pytest.raises(ValueError, match=r"^node '.*/s1' has no funnel\['graph_neighbors'\]; build the "
                       r"nodes with GraphGranularityBuilder / GraphGranularityNodeParser\.$"):
        GranularityGraph.from_units([graph.nodes[0], lost])


def test_graph_nodes_are_consecutive_sentences_of_each_document():
    """MoGG nodes: each document cut into runs of ``sentences_per_node`` consecutive sentences,
    every sentence once, in order; a node keeps its document's metadata and where it came from."""
    docs = [Unit(id="a", text=DOCS[0], metadata={"title": "Paris"}), Unit(id="b", text=DOCS[2])]
    nodes = GraphGranularityBuilder(sentences_per_node=3).nodes(docs)
    want = []
    for di, doc in enumerate(docs):
        sents = split_sentences(doc.text)
        want += [(f"{doc.id}/s{p}", " ".join(sents[s:s + 3]), dict(doc.metadata),
                  {"doc_id": doc.id, "doc_index": di, "position": p})
                 for p, s in enumerate(range(0, len(sents), 3))]
    assert [(u.id, u.text, u.metadata, u.funnel) for u in nodes] == want
    assert {u.level for u in nodes} == {"graph-node"}
    with pytest.raises(ValueError, match=r"^cannot build a graph from an empty corpus; pass at least "
                       r"one document\.$"):
        GraphGranularityBuilder().nodes([])
    with pytest.raises(ValueError, match=r"^every document is empty \(no sentences\); nothing to build "
                       r"a graph from\.$"):
        GraphGranularityBuilder().nodes(["   ", ""])


def test_builder_links_nodes_best_neighbour_first_and_passes_max_df():
    import time

    builder = GraphGranularityBuilder(sentences_per_node=1, k_graph=3, t_graph=0.05, max_df=0.15)
    nodes = builder.nodes(DOCS + ["Paris and the tower and the river in Paris.",
                                  "The river, the tower and the museum."])
    t0 = time.perf_counter()
    graph = builder.build_from_nodes(nodes)
    elapsed = time.perf_counter() - t0
    assert 0 <= graph.build_seconds <= elapsed
    index = BM25Index().index(nodes)
    directed = bm25_knn_graph(index, k_graph=3, t_graph=0.05, max_df=0.15)
    assert _edges(graph.adjacency) == pytest.approx(_edges(directed.maximum(directed.T)))
    exact = bm25_knn_graph(index, k_graph=3, t_graph=0.05)
    assert directed.nnz > 10 and _edges(directed) != _edges(exact)  # max_df mattered
    for i, u in enumerate(graph.nodes):   # the bookkeeping: neighbours best first, with weights
        row = graph.adjacency.getrow(i)
        pairs = sorted(zip(row.data.tolist(), row.indices.tolist()), key=lambda p: -p[0])
        assert u.funnel["graph_weights"] == pytest.approx([w for w, _ in pairs])
        assert u.funnel["graph_weights"] == sorted(u.funnel["graph_weights"], reverse=True)
        assert set(u.funnel["graph_neighbors"]) == {graph.nodes[c].id for _, c in pairs}
    # nodes without an indexable token (only stopwords) get no edges, and the graph still builds
    with pytest.warns(UserWarning, match="no edges"):
        empty = builder.build_from_nodes([Unit(id="x", text="the and of"), Unit(id="y", text="a to in")])
    assert empty.n_edges == 0 and empty.adjacency.shape == (2, 2)
    with pytest.raises(ValueError, match=r"^cannot build a graph from no nodes\.$"):
        builder.build_from_nodes([])


def test_graph_and_builder_errors_name_the_bad_value():
    node = Unit(id="n", text="Paris is the capital.")
    import scipy.sparse as sp
    with pytest.raises(ValueError, match=r"^a granularity graph needs at least one node\.$"):
        GranularityGraph([], sp.csr_matrix((0, 0)))
    with pytest.raises(ValueError, match=r"^adjacency has shape \(2, 2\), expected \(1, 1\)\.$"):
        GranularityGraph([node], sp.csr_matrix((2, 2)))
    with pytest.raises(ValueError, match=r"^n_gra \(number of hop ranges\) must be >= 1"):
        GranularityGraph([node], sp.csr_matrix((1, 1)), n_gra=0)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # one node: nothing to link, no warning
        assert GranularityGraph([node], sp.csr_matrix((1, 1))).n_edges == 0
    with pytest.warns(UserWarning, match=r"^the granularity graph has no edges \(no pair of nodes reaches "
                      r"t_graph\); every hop range is the node alone\. Lower t_graph or raise k_graph\.$"):
        GranularityGraph([node, Unit(id="m", text="x")], sp.csr_matrix((2, 2)))
    for kwargs, match in [({"sentences_per_node": 0}, "^sentences_per_node must be >= 1"),
                          ({"block_size": 0}, "^block_size must be >= 1"), ({"k_graph": 0}, "^k_graph must be >= 1"),
                          ({"t_graph": -0.1}, r"^t_graph must be in \[0, 1\]"),
                          ({"n_gra": 0}, r"^n_gra \(number of hop ranges\) must be >= 1"),
                          ({"max_df": 0.0}, r"^max_df must be in \(0, 1\] or None, got 0\.0\.$"),
                          ({"max_df": 1.5}, r"^max_df must be in \(0, 1\] or None, got 1\.5\.$")]:
        with pytest.raises(ValueError, match=match):
            GraphGranularityBuilder(**kwargs)
    assert GraphGranularityBuilder(max_df=1.0).max_df == 1.0


# -- router training (section 3.2.2: BCE on the soft labels, early stopping) ----------------------
def test_router_training_loss_is_the_mean_bce_over_the_training_queries():
    """With a learning rate of 0 the MLP never changes, so every epoch's training loss is the
    mean binary cross-entropy of that fixed MLP over the training queries (batches of unequal
    size weighted by their sizes), the validation loss never improves after epoch 1, and training
    stops ``patience`` epochs later with the epoch-1 weights."""
    import torch

    qs = [f"fact {i}" for i in range(9)]
    labels = np.array([[0.8, 0.2, 0.0, 0.0]] * 9)
    router = GranularityRouter(4, embedder=_TwoKindsEmbedder(), hidden=8, dropout=0.0)
    h = router.fit(qs, labels, lr=0.0, batch_size=3, patience=4, epochs=50, val_fraction=0.2)
    with torch.no_grad():
        z = router._mlp(torch.from_numpy(_TwoKindsEmbedder().encode(["fact 0"]))).double().numpy()[0]
    p = 1 / (1 + np.exp(-z))
    bce = float(-(labels[0] * np.log(p) + (1 - labels[0]) * np.log(1 - p)).mean())
    assert h["train_loss"] == pytest.approx([bce] * h["epochs_run"], rel=1e-5)
    assert h["val_loss"] == pytest.approx([bce] * h["epochs_run"], rel=1e-5)
    assert (h["best_epoch"], h["epochs_run"], h["n_val"], h["n_train"]) == (1, 5, 2, 7)
    assert h["best_val_loss"] == pytest.approx(bce, rel=1e-5)


def test_router_training_runs_the_epochs_asked_for_and_is_reproducible():
    import time

    qs = [f"fact {i}" for i in range(6)] + [f"broad {i}" for i in range(6)]
    labels = np.array([[0.8, 0.2, 0, 0]] * 6 + [[0, 0, 0.2, 0.8]] * 6)
    runs = []
    for _ in range(2):
        router = GranularityRouter(4, embedder=_TwoKindsEmbedder(), hidden=8)
        t0 = time.perf_counter()
        h = router.fit(qs, labels, epochs=6, patience=100, lr=1e-2, seed=3)
        elapsed = time.perf_counter() - t0
        assert h["epochs_run"] == len(h["train_loss"]) == len(h["val_loss"]) == 6
        assert h["best_epoch"] == 1 + int(np.argmin(h["val_loss"]))
        assert 0 <= h["embed_seconds"] <= elapsed and 0 <= h["train_seconds"] <= elapsed
        assert set(h) == {"train_loss", "val_loss", "best_epoch", "best_val_loss", "epochs_run",
                          "n_train", "n_val", "embed_seconds", "train_seconds"}
        runs.append((h["train_loss"], h["val_loss"], router.predict(["fact x"]).tolist()))
    assert runs[0] == runs[1]
    # the validation share: round(val_fraction * n), at least 1, leaving at least 1 to train on
    for n, fraction, n_val in [(2, 0.2, 1), (10, 0.05, 1), (3, 0.9, 2), (10, 0.26, 3)]:
        router = GranularityRouter(4, embedder=_TwoKindsEmbedder(), hidden=4)
        h = router.fit(qs[:n], labels[:n], epochs=1, val_fraction=fraction)
        assert (h["n_val"], h["n_train"]) == (n_val, n - n_val)


def test_router_training_errors_name_the_bad_value():
    router = GranularityRouter(4, embedder=_TwoKindsEmbedder(), hidden=4)
    labels = np.zeros((3, 4))
    qs = ["fact a", "fact b", "broad c"]
    cases = [((qs[0], labels[:1]), {}, TypeError, r"^queries must be a list of strings\.$"),
             ((qs[:1], labels[:1]), {}, ValueError,
              r"^need at least 2 labelled queries to train \(one for validation\), got 1\.$"),
             ((qs, labels[:2]), {}, ValueError, r"labels must have shape \(3, 4\), got \(2, 4\)"),
             ((qs, labels), {"val_fraction": 0.0}, ValueError, r"^val_fraction must be in \(0, 1\), got 0\.0\.$"),
             ((qs, labels), {"val_fraction": 1.0}, ValueError, r"^val_fraction must be in \(0, 1\), got 1\.0\.$"),
             ((qs, labels), {"epochs": 0}, ValueError, "epochs"),
             ((qs, labels), {"batch_size": 0}, ValueError, "batch_size"),
             ((qs, labels), {"patience": 0}, ValueError, "patience")]
    for args, kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            router.fit(*args, **kwargs)


def test_two_nodes_that_share_a_term_are_linked():
    """The smallest graph: each of two similar nodes has the other as its neighbour."""
    index = BM25Index().index([Unit(id="a", text="Paris tower river"), Unit(id="b", text="Paris museum")])
    assert sorted(_edges(bm25_knn_graph(index, k_graph=3, t_graph=0.0))) == [(0, 1), (1, 0)]


# -- MoGG graph: corner cases of the definition ----------------------------------------------------
def _star_graph(n_leaves, n_gra=3):
    import scipy.sparse as sp

    n = n_leaves + 1
    nodes = [Unit(id=f"s{i}", text=f"node {i}") for i in range(n)]
    adjacency = sp.csr_matrix((np.ones(n_leaves), ([0] * n_leaves, list(range(1, n)))), shape=(n, n))
    return GranularityGraph(nodes, adjacency, n_gra=n_gra)


@pytest.mark.parametrize("n_leaves", [127, 255, 256])
def test_hop_ranges_of_a_hub_with_hundreds_of_neighbours(n_leaves):
    """A star: node 0 linked to every leaf. Within 1 hop of a leaf are the leaf and the hub;
    within 2 or more hops, every node (the hub is one hop away at every range). Reachability is a
    yes/no question: counting the paths in a small integer type wrapped around at 256 paths and
    dropped the hub from a leaf's 3-hop range."""
    graph = _star_graph(n_leaves)
    everyone = list(range(n_leaves + 1))
    for leaf in (1, n_leaves):
        assert graph.neighbourhood(leaf, 1).tolist() == [0, leaf]
        assert graph.neighbourhood(leaf, 2).tolist() == everyone
        assert graph.neighbourhood(leaf, 3).tolist() == everyone
    for hops in (1, 2, 3):
        assert graph.neighbourhood(0, hops).tolist() == everyone
        assert graph.reach(hops).dtype == np.bool_


def test_knn_graph_caps_weights_at_one_and_keeps_a_similarity_equal_to_t_graph():
    """BM25's length normalisation can score another node above the node's own text (ratio > 1):
    the weight is capped at 1. A similarity equal to ``t_graph`` reaches it: duplicated
    sentences (ratio exactly 1) are linked at ``t_graph = 1``."""
    texts = ["Paris river", "Paris river Paris river", "Louvre museum art", "Seine bridges",
             "Louvre museum art"]
    index = BM25Index().index([Unit(id=str(i), text=t) for i, t in enumerate(texts)])
    tokens = index.tokenize(texts)
    raw = index.token_scores(tokens[0])
    assert raw[1] / raw[0] > 1.05                     # node 1 outscores node 0 on node 0's text
    graph = bm25_knn_graph(index, k_graph=3, t_graph=0.0)
    assert graph.dtype == np.float32
    assert _edges(graph) == pytest.approx(_reference_edges(index, 3, 0.0))
    assert _edges(graph)[(0, 1)] == 1.0
    assert _edges(bm25_knn_graph(index, k_graph=3, t_graph=1.0)) == {(0, 1): 1.0, (2, 4): 1.0,
                                                                    (4, 2): 1.0}


def test_knn_graph_of_one_node_and_of_a_last_node_without_terms():
    """One node: no edges, a 1 x 1 matrix. A last node whose text has no indexable token (only
    stopwords) is still a node of the graph: the matrix is n x n, that node without edges."""
    one = bm25_knn_graph(BM25Index().index([Unit(id="a", text="Paris river")]))
    assert one.shape == (1, 1) and one.nnz == 0 and one.dtype == np.float32
    units = [Unit(id="a", text="Paris river"), Unit(id="b", text="Paris tower"),
             Unit(id="c", text="the and of")]
    index = BM25Index().index(units)
    graph = bm25_knn_graph(index, k_graph=3, t_graph=0.0)
    assert graph.shape == (3, 3) and set(_edges(graph)) == {(0, 1), (1, 0)}
    assert _edges(graph) == pytest.approx(_reference_edges(index, 3, 0.0))
    built = GraphGranularityBuilder(t_graph=0.0).build_from_nodes(units)
    assert built.adjacency.shape == (3, 3) and built.nodes[2].funnel["graph_neighbors"] == []


def test_graph_defaults_are_the_documented_ones():
    """docs/mix_of_granularity.md: n_gra 5, 2-sentence nodes, k_graph 3, t_graph 0.3. The kNN
    graph's defaults give the reference edges for k = 3, t = 0.3 on a corpus where one node has
    more than three neighbours above 0.3."""
    texts = ["Eiffel tower Paris"] + [f"Eiffel tower Paris {w}" for w in
                                      ("night", "lights", "visitors", "summer", "river")]
    index = BM25Index().index([Unit(id=str(i), text=t) for i, t in enumerate(texts)])
    assert len([e for e in _reference_edges(index, 5, 0.3) if e[0] == 0]) > 3
    assert _edges(bm25_knn_graph(index)) == pytest.approx(_reference_edges(index, 3, 0.3))
    builder = GraphGranularityBuilder()
    assert (builder.sentences_per_node, builder.n_gra, builder.k_graph, builder.t_graph) == (2, 5, 3, 0.3)
    import scipy.sparse as sp
    assert GranularityGraph([Unit(id="a", text="x")], sp.csr_matrix((1, 1))).n_gra == 5


def test_graph_stores_symmetric_float32_weights():
    """The adjacency is the symmetric maximum of the directed weights, stored as float32 whatever
    the input's type."""
    import scipy.sparse as sp

    nodes = [Unit(id=f"n{i}", text=f"t{i}") for i in range(3)]
    directed = sp.csr_matrix(np.array([[0, 0.5, 0], [0.25, 0, 0], [0, 0.75, 0]], dtype=np.float64))
    graph = GranularityGraph(nodes, directed, n_gra=2)
    assert graph.adjacency.dtype == np.float32
    np.testing.assert_array_equal(graph.adjacency.toarray(),
                                  [[0, 0.5, 0], [0.5, 0, 0.75], [0, 0.75, 0]])


@pytest.mark.filterwarnings("ignore:the granularity graph has no edges")
def test_graph_from_hand_made_nodes_counts_missing_positions_as_the_first():
    """Nodes made by hand may lack ``doc_index`` / ``position``: they count as document 0,
    position 0, so they come first; the others keep document order."""
    def node(name, **funnel):
        return Unit(id=name, text=name, funnel={"graph_neighbors": [], **funnel})

    nodes = [node("c", doc_index=0, position=1), node("a", doc_index=1, position=0), node("bare"),
             node("no-position", doc_index=1)]
    graph = GranularityGraph.from_units(nodes, n_gra=1)
    assert [u.id for u in graph.nodes] == ["bare", "c", "a", "no-position"]


# -- router training: documented defaults, label types, error messages ----------------------------
class _DistinctEmbedder:
    """A fixed random vector per query (no model): queries the router cannot generalise over, so
    the validation loss rises once it overfits and early stopping ends training."""

    model_name_or_path = "distinct"
    dimension = 8

    def encode(self, texts, **kw):
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for i, t in enumerate(texts):
            out[i] = np.random.default_rng(int(t.split()[-1])).normal(size=self.dimension)
        return out


def test_router_fit_defaults_are_the_documented_ones():
    """docs/mix_of_granularity.md: val_fraction 0.2, epochs 200, lr 1e-3, patience 10, batch_size
    32 (and seed 0). Fifty queries (40 to train: two batches of 32 and 8) with random soft labels:
    training stops early, so the patience matters, and the default run is the explicit one."""
    qs = [f"query {i}" for i in range(50)]
    labels = soft_labels(np.random.default_rng(1).random((50, 3)))
    runs = []
    for kwargs in ({}, dict(val_fraction=0.2, epochs=200, lr=1e-3, patience=10, batch_size=32, seed=0)):
        router = GranularityRouter(3, embedder=_DistinctEmbedder(), hidden=64, dropout=0.0)
        h = router.fit(qs, labels, **kwargs)
        runs.append((h["train_loss"], h["val_loss"], h["best_epoch"], h["n_val"]))
    assert runs[0] == runs[1]
    assert runs[0][2] + 10 == len(runs[0][0]) < 200       # stopped 10 epochs after the best one
    assert runs[0][3] == 10
    # without early stopping, the default runs 200 epochs
    router = GranularityRouter(3, embedder=_DistinctEmbedder(), hidden=4)
    assert router.fit(qs[:6], labels[:6], patience=10_000)["epochs_run"] == 200


def test_router_trains_on_integer_hard_labels():
    """Hard 0/1 labels given as integers are targets like any other (BCE needs float targets)."""
    qs = [f"fact {i}" for i in range(6)] + [f"broad {i}" for i in range(6)]
    labels = np.array([[1, 0, 0, 0]] * 6 + [[0, 0, 0, 1]] * 6)
    router = GranularityRouter(4, embedder=_TwoKindsEmbedder(), hidden=8)
    router.fit(qs, labels, epochs=300, lr=1e-2, patience=300)
    w = router.predict(["fact new", "broad new"])
    assert w[0].argmax() == 0 and w[1].argmax() == 3


def test_router_training_error_names_the_setting():
    router = GranularityRouter(4, embedder=_TwoKindsEmbedder(), hidden=4)
    qs, labels = ["fact a", "fact b", "broad c"], np.zeros((3, 4))
    for name in ("epochs", "batch_size", "patience"):
        with pytest.raises(ValueError, match=rf"^{name} must be >= 1, got 0"):
            router.fit(qs, labels, **{name: 0})
