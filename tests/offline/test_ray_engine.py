"""The offline pipeline's Ray engine against its local engine.

One module-scoped local Ray session (``ray.init(num_cpus=2)``); small corpora. The references
are the single-process functions of funnel_core.funnelrag.clustering / ClusteredBM25Index, the embedder
called directly, and the scorer called directly, not copies of the Ray code's steps.
"""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.sparse as sp

from funnel_core import offline
from funnel_core.bm25 import BM25Index
from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
from funnel_core.funnelrag.clustering import bm25_knn_adjacency, bm25_weight_matrix
from funnel_core.units import Unit

ray = pytest.importorskip("ray", reason="the Ray engine needs the 'ray' extra")

pytestmark = pytest.mark.ray


def _corpus(n: int, seed: int = 0) -> list[Unit]:
    """Clusterable documents: 12 topics of 25 words each plus shared background words."""
    rng = np.random.default_rng(seed)
    topics = [[f"t{t}w{i}" for i in range(25)] for t in range(12)]
    background = [f"common{i}" for i in range(40)]
    docs = []
    for i in range(n):
        t = topics[rng.integers(len(topics))]
        words = list(rng.choice(t, size=rng.integers(8, 30))) + list(rng.choice(background, size=5))
        docs.append(Unit(id=f"doc-{i}", text=" ".join(words), metadata={"n": i}))
    return docs


@pytest.fixture(scope="module")
def ray_session():
    from funnel_core.offline import ray as ray_engine

    started = not ray.is_initialized()
    ray_engine.ensure_ray(num_cpus=2)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def corpus() -> list[Unit]:
    return _corpus(400)


def _same_csr(a: sp.csr_matrix, b: sp.csr_matrix) -> bool:
    a, b = sp.csr_matrix(a), sp.csr_matrix(b)
    a.sort_indices()
    b.sort_indices()
    return (a.shape == b.shape and np.array_equal(a.indptr, b.indptr)
            and np.array_equal(a.indices, b.indices) and np.array_equal(a.data, b.data))


@pytest.mark.parametrize("backend", ["scipy", "numba"])
def test_ray_knn_graph_equals_single_process_graph(ray_session, corpus, backend):
    if backend == "numba":
        pytest.importorskip("numba")
    index = BM25Index().index(corpus)
    reference = bm25_knn_adjacency(index, k=6, threshold=0.05, backend=backend)
    assert reference.nnz > len(corpus)  # a real graph, not an empty one
    # uneven blocks (37 does not divide 400): a block boundary bug shows up as missing rows
    got = offline.knn_graph(index, k=6, threshold=0.05, engine="ray", block_size=37,
                            num_workers=2, backend=backend)
    assert _same_csr(got, reference)
    local = offline.knn_graph(bm25_weight_matrix(index), k=6, threshold=0.05, engine="local",
                              block_size=64, backend=backend)
    assert _same_csr(local, reference)


def test_ray_knn_blocks_are_in_row_order(ray_session, corpus):
    from funnel_core.funnelrag.clustering import knn_block
    from funnel_core.offline import ray as ray_engine

    w = bm25_weight_matrix(BM25Index().index(corpus))
    spans = [(300, 400), (0, 10), (10, 300)]
    blocks = ray_engine.knn_blocks(w, spans, k=4, threshold=0.1, backend="scipy", num_workers=2)
    for (s, e), b in zip(spans, blocks):
        assert _same_csr(b, knn_block(w, s, e, k=4, threshold=0.1, backend="scipy"))


def test_build_index_ray_gives_the_clusters_of_the_local_index(ray_session, corpus, tmp_path):
    reference = ClusteredBM25Index(max_tokens=120, knn_k=8, knn_threshold=0.1,
                                   adjacency="bm25").index(corpus)
    assert 1 < len(reference.clusters) < len(corpus)  # clusters were actually merged
    reports = {}
    for engine in ("local", "ray"):
        reports[engine] = offline.build_index(corpus, tmp_path / engine, engine=engine, max_tokens=120,
                                              knn_k=8, knn_threshold=0.1, block_size=50, embed=False)
    for engine in ("local", "ray"):
        built = offline.load_build(tmp_path / engine)
        assert [c.metadata["members"] for c in built["clustered"].clusters] == \
            [c.metadata["members"] for c in reference.clusters], engine
        assert built["dense"] is None
        assert built["manifest"]["engine"] == engine
        q = "t3w1 t3w2 t3w7"
        assert [u.id for u in built["clustered"].search(q, k=3)] == [u.id for u in reference.search(q, k=3)]
    assert _same_csr(offline.load_build(tmp_path / "ray")["knn"], offline.load_build(tmp_path / "local")["knn"])
    assert reports["ray"].n_clusters == reports["local"].n_clusters == len(reference.clusters)


@pytest.mark.slow
def test_ray_embeddings_equal_the_embedder(ray_session, tmp_path):
    from funnel_core.embeddings import SentenceEmbedder

    docs = _corpus(40, seed=1)
    texts, ids = [d.text for d in docs], [d.id for d in docs]
    offline.embed_texts(texts, tmp_path / "ray", ids=ids, engine="ray", shard_rows=7, num_workers=2,
                        dtype="float32")
    got_ids, got = offline.read_embeddings(tmp_path / "ray")
    assert got_ids == ids
    reference = SentenceEmbedder(device="cpu", dtype="float32").encode(texts)
    assert got.shape == reference.shape == (40, 384)
    # each row is its own text's embedding (a row shuffle would give cosine ~0.3 here, not 1), in
    # the precision asked for: the actors ran fp32 (in bf16 rows differ by up to ~5e-4)
    np.testing.assert_allclose(got, reference, atol=1e-5)
    dense = offline.dense_index_from_shards(docs, tmp_path / "ray")
    assert dense.search(docs[5].text, k=1)[0].id == docs[5].id


@pytest.mark.slow
def test_ray_pair_scores_equal_the_scorer(ray_session, tmp_path):
    # fp32: this tiny random model's scores differ by ~1e-5, below bf16's resolution, and
    # dtype="auto" (or runtime="auto") runs bf16 on a CPU with native bf16
    from funnel_core.rerank.cross_encoder import CrossEncoderScorer
    from funnel_core.testing import tiny_cross_encoder

    model = tiny_cross_encoder(tmp_path / "ce")
    docs = _corpus(30, seed=2)
    groups = [{"query_id": f"q{i}", "query": f"t{i}w1 t{i}w2",
               "unit_ids": [d.id for d in docs[i:i + 3 + i % 4]],
               "texts": [d.text for d in docs[i:i + 3 + i % 4]]} for i in range(9)]
    factory = functools.partial(CrossEncoderScorer, model, batch_size=4, dtype="float32")
    offline.score_groups(groups, factory, tmp_path / "ray", engine="ray", groups_per_batch=2, num_workers=2)
    offline.score_groups(groups, factory, tmp_path / "local", engine="local", groups_per_batch=4)
    got, local = offline.read_pair_scores(tmp_path / "ray"), offline.read_pair_scores(tmp_path / "local")
    scorer = CrossEncoderScorer(model, dtype="float32", batch_size=4, device="cpu")
    assert sorted(got) == sorted(g["query_id"] for g in groups)
    for g in groups:
        expected = scorer.score(g["query"], g["texts"])
        assert list(got[g["query_id"]]) == g["unit_ids"]
        np.testing.assert_allclose(list(got[g["query_id"]].values()), expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(list(local[g["query_id"]].values()), expected, rtol=1e-5, atol=1e-6)
    assert len({round(s, 6) for q in got.values() for s in q.values()}) > 5  # not constant scores
    # the scores feed L2G: rescored passages, ready for funnel_core.train.l2g.l2g_group
    scored = offline.apply_pair_scores(docs, got["q0"], name="postrank")
    assert [u.id for u in scored] == groups[0]["unit_ids"]
    assert scored[0].score == pytest.approx(got["q0"][scored[0].id])


def test_score_groups_rejects_a_built_scorer_and_ragged_groups(tmp_path):
    from funnel_core.rerank.bm25 import BM25Scorer

    with pytest.raises(TypeError, match="factory"):
        offline.score_groups([], BM25Scorer(), tmp_path / "a")
    with pytest.raises(ValueError, match="unit_ids"):
        offline.score_groups([{"query_id": "q", "query": "x", "unit_ids": ["a"], "texts": []}],
                             BM25Scorer, tmp_path / "b")


def test_readers_refuse_a_mixed_or_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="shards"):
        offline.read_embeddings(tmp_path / "nothing")
    import pyarrow.parquet as pq

    (tmp_path / "mixed").mkdir()
    from funnel_core.offline.shards import embed_table
    table = embed_table(np.array([0, 1]), ["a", "b"], np.ones((2, 3), np.float32))
    pq.write_table(table, tmp_path / "mixed" / "x.parquet")
    pq.write_table(table, tmp_path / "mixed" / "y.parquet")  # rows 0 and 1 twice
    with pytest.raises(ValueError, match="exactly once"):
        offline.read_embeddings(tmp_path / "mixed")
    with pytest.raises(FileExistsError, match="not empty"):
        offline.embed_texts(["a"], tmp_path / "mixed")


def test_local_engine_does_not_import_ray(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        import funnel_core, funnel_core.offline, funnel_core.cli
        from funnel_core import offline
        from funnel_core.units import Unit
        docs = [Unit(id=str(i), text=f"alpha beta w{{i % 7}} w{{i % 5}} gamma") for i in range(60)]
        offline.build_index(docs, {str(tmp_path / 'out')!r}, engine="local", max_tokens=40, embed=False)
        bad = sorted(m for m in sys.modules if m == "ray" or m.startswith("ray."))
        assert not bad, bad
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]


def test_funnel_build_command(ray_session, tmp_path):
    import json

    from funnel_core.cli import main

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"id": d.id, "text": d.text}) for d in _corpus(120, seed=3)))
    assert main(["build", str(corpus), str(tmp_path / "idx"), "--engine", "ray", "--no-embed",
                 "--max-tokens", "100", "--block-size", "25"]) == 0
    assert main(["build", str(corpus), str(tmp_path / "idx-local"), "--no-embed",
                 "--max-tokens", "100"]) == 0
    a = offline.load_build(tmp_path / "idx")["clustered"]
    b = offline.load_build(tmp_path / "idx-local")["clustered"]
    assert [c.metadata["members"] for c in a.clusters] == [c.metadata["members"] for c in b.clusters]
    assert main(["query", str(tmp_path / "idx"), "t1w3 t1w4", "-k", "2"]) == 0


@pytest.mark.slow
def test_build_index_with_embeddings_persists_a_dense_index(tmp_path):
    from funnel_core.embeddings import SentenceEmbedder

    docs = _corpus(30, seed=4)
    report = offline.build_index(docs, tmp_path / "b", engine="local", max_tokens=100, embed=True)
    built = offline.load_build(tmp_path / "b")
    dense = built["dense"]
    assert [u.id for u in dense.units] == [d.id for d in docs]
    np.testing.assert_allclose(dense.embeddings, SentenceEmbedder(device="cpu").encode([d.text for d in docs]),
                               atol=1e-5)
    assert dense.search(docs[7].text, k=1)[0].id == docs[7].id
    assert "embeddings" in report.seconds and built["manifest"]["n_clusters"] == report.n_clusters
