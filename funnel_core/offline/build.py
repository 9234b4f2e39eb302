"""The offline side of FunnelRAG, engine-agnostic: what a user builds once per corpus.

One pipeline, :func:`build_index`::

    BM25 index over the documents -> BM25 kNN graph -> Algorithm 1 (clusters)
        -> BM25 index over the clusters -> document embeddings (optional)

and the two batch jobs that grow with the corpus: :func:`embed_texts` (embed every text with a
:class:`~funnel_core.embeddings.SentenceEmbedder`) and :func:`score_groups` (score every
(query, candidate) pair with a post-ranker, for L2G distillation data).

Each takes ``engine="local"`` (this process, the default) or ``engine="ray"`` (Ray tasks and Ray
Data actors, :mod:`funnel_core.offline.ray`; ``pip install 'funnel-rag[ray]'``; the same code runs
on a laptop's ``ray.init()`` and on a Ray cluster). Both engines give the same result: the same
kNN graph entry for entry, hence the same clusters, and the same embeddings and scores up to
floating-point batching effects. Algorithm 1 is sequential and always runs in this process, on
the assembled graph.

The batch jobs write shards (Parquet) that :func:`read_embeddings` and :func:`read_pair_scores`
read back in input order, so a :class:`~funnel_core.embeddings.DenseIndex`
(:func:`dense_index_from_shards`), a vector database loader or the L2G trainer
(:func:`apply_pair_scores`) can consume them. Nothing here imports Ray unless ``engine="ray"``.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from funnel_core.errors import check_positive_int
from funnel_core.hardware import normalize_dtype
from funnel_core.offline.shards import embed_table, score_table
from funnel_core.units import Unit, check_unique_ids

__all__ = [
    "ENGINES",
    "BuildReport",
    "knn_graph",
    "build_index",
    "load_build",
    "embed_texts",
    "read_embeddings",
    "dense_index_from_shards",
    "score_groups",
    "read_pair_scores",
    "apply_pair_scores",
]

ENGINES = ("local", "ray")
BUILD_FORMAT = "funnel-rag.offline-build"
_EMBED_SCHEMA = ("row", "id", "embedding")
_SCORE_SCHEMA = ("query_id", "unit_id", "position", "score")


def _check_engine(engine: str) -> str:
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}.")
    return engine


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


# -- 1. the kNN graph ------------------------------------------------------------------------
def knn_graph(index_or_weights: Any, *, k: int = 20, threshold: float = 0.1, query_terms: int = 16,
              engine: str = "local", block_size: int = 4096, num_workers: int | None = None,
              backend: str = "auto", progress: bool = False,
              ray_options: Mapping[str, Any] | None = None) -> sp.csr_matrix:
    """The BM25 kNN document graph of :func:`funnel_core.funnelrag.clustering.bm25_knn_adjacency`.

    Args:
        index_or_weights: A :class:`~funnel_core.bm25.BM25Index` over the documents, or its
            (documents x terms) weight matrix (:func:`funnel_core.funnelrag.clustering.bm25_weight_matrix`).
        k: As in :func:`funnel_core.funnelrag.clustering.knn_block`.
        threshold: As in :func:`funnel_core.funnelrag.clustering.knn_block`.
        query_terms: As in :func:`funnel_core.funnelrag.clustering.knn_block`.
        engine: ``"local"`` (blocks one after the other in this process) or ``"ray"`` (each block
            of ``block_size`` rows is a Ray task; the blocks are stacked in order).
        block_size: Rows per block.
        num_workers: Ray only: at most this many blocks in flight (default: the cluster's CPUs).
        backend: ``"auto"``, ``"numba"`` or ``"scipy"`` (:func:`funnel_core.funnelrag.clustering.knn_block`).
        ray_options: Ray only: extra ``ray.init`` arguments (``address`` for a cluster, ...) and
            ``threads_per_worker`` (numba threads inside each task, default 1).

    Returns:
        The symmetric float64 CSR graph; the same matrix, entry for entry, for both engines.
    """
    from funnel_core.funnelrag.clustering import bm25_weight_matrix, knn_adjacency_from_weights

    _check_engine(engine)
    check_positive_int(block_size, "block_size")
    w = index_or_weights if sp.issparse(index_or_weights) else bm25_weight_matrix(index_or_weights)
    w = sp.csr_matrix(w)
    if engine == "local":
        return knn_adjacency_from_weights(w, k=k, threshold=threshold, query_terms=query_terms,
                                          chunk_size=block_size, backend=backend)
    from funnel_core.offline import ray as ray_engine

    return ray_engine.knn_adjacency(w, k=k, threshold=threshold, query_terms=query_terms,
                                    block_size=block_size, num_workers=num_workers, backend=backend,
                                    progress=progress, **dict(ray_options or {}))


# -- 2. batch embedding ----------------------------------------------------------------------
def _device_for(num_gpus: float) -> str:
    if num_gpus < 0:
        raise ValueError(f"num_gpus must be >= 0, got {num_gpus!r}.")
    return "cuda" if num_gpus > 0 else "cpu"


def embed_texts(texts: Sequence[str], out_dir: str | os.PathLike, *, ids: Sequence[str] | None = None,
                model: str | None = None, engine: str = "local", batch_size: int = 64,
                normalize: bool = True, shard_rows: int = 4096, num_workers: int = 1,
                num_gpus: float = 0, progress: bool = False, dtype: str = "auto",
                ray_options: Mapping[str, Any] | None = None) -> Path:
    """Embed ``texts`` with a :class:`~funnel_core.embeddings.SentenceEmbedder` into Parquet shards.

    Args:
        texts: The texts (row ``i`` of the output is ``texts[i]``).
        out_dir: A new or empty folder for the shards (``*.parquet`` with columns ``row``, ``id``,
            ``embedding``); read them back with :func:`read_embeddings`.
        ids: One id per text (default: the row numbers as strings).
        model: Sentence-transformers model (hub name or folder; ``None``: packaged MiniLM).
        engine: ``"local"`` or ``"ray"`` (Ray Data ``map_batches`` over a pool of ``num_workers``
            actors, each loading the model once).
        batch_size: Texts per forward pass.
        shard_rows: Texts per Ray Data block (and per shard file of the local engine).
        num_workers: Ray only: actors in the pool.
        num_gpus: GPUs per actor; ``0`` (default) runs CPU actors on ``device="cpu"``, ``> 0``
            GPU actors on ``device="cuda"`` (fractions share a GPU). Local engine: ``> 0`` picks
            ``"cuda"``.
        progress: Show a progress bar.
        dtype: Embedder precision (:class:`~funnel_core.embeddings.SentenceEmbedder`): ``"auto"``
            (default: bf16 only where the hardware runs it natively, :mod:`funnel_core.hardware`),
            ``"float32"``, ``"bfloat16"`` or ``"float16"``; every Ray actor uses it too.
        ray_options: Ray only: keyword arguments for ``ray.init``.

    Returns:
        ``Path(out_dir)``.
    """
    _check_engine(engine)
    check_positive_int(batch_size, "batch_size")
    check_positive_int(shard_rows, "shard_rows")
    check_positive_int(num_workers, "num_workers")
    if isinstance(texts, str):
        raise TypeError("embed_texts expects a list of strings; wrap a single text in a list.")
    texts = list(texts)
    ids = [str(i) for i in range(len(texts))] if ids is None else [str(i) for i in ids]
    if len(ids) != len(texts):
        raise ValueError(f"got {len(ids)} ids for {len(texts)} texts.")
    dtype = normalize_dtype(dtype)  # checked here, not first inside a Ray actor
    out = _fresh_dir(out_dir)
    device = _device_for(num_gpus)
    if engine == "ray":
        from funnel_core.offline import ray as ray_engine

        ray_engine.embed(texts, ids, out, model=model, batch_size=batch_size, normalize=normalize,
                         shard_rows=shard_rows, num_workers=num_workers, num_gpus=num_gpus,
                         progress=progress, dtype=dtype, **dict(ray_options or {}))
        return out
    import pyarrow.parquet as pq
    from tqdm.auto import tqdm

    from funnel_core.embeddings import SentenceEmbedder

    embedder = SentenceEmbedder(model, device=device, batch_size=batch_size, normalize=normalize,
                                dtype=dtype)
    for s, start in enumerate(tqdm(range(0, len(texts), shard_rows), desc="embedding",
                                   disable=not progress, unit="shard")):
        stop = min(len(texts), start + shard_rows)
        emb = embedder.encode(texts[start:stop])
        pq.write_table(embed_table(np.arange(start, stop), ids[start:stop], emb),
                       out / f"part-{s:06d}.parquet")
    if not texts:
        pq.write_table(embed_table(np.zeros(0), [], np.zeros((0, embedder.dimension))),
                       out / "part-000000.parquet")
    return out


def _fresh_dir(path: str | os.PathLike) -> Path:
    out = Path(path)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{str(out)!r} is not empty; pass a new or empty folder for the shards "
                              "(shards of an earlier run would be read back with the new ones).")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _read_shards(path: str | os.PathLike, columns: Sequence[str], what: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    files = sorted(path.rglob("*.parquet")) if path.is_dir() else []
    if not files:
        raise FileNotFoundError(f"no {what} shards (*.parquet) under {str(path)!r}; write them with "
                                f"funnel_core.offline first, or check the folder.")
    tables = [pq.read_table(f) for f in files]
    missing = [c for c in columns if c not in tables[0].column_names]
    if missing:
        raise ValueError(f"{str(files[0])!r} is not a {what} shard: columns {missing} are missing.")
    return pa.concat_tables([t.select(list(columns)) for t in tables])


def read_embeddings(path: str | os.PathLike) -> tuple[list[str], np.ndarray]:
    """Read the shards written by :func:`embed_texts`: ``(ids, embeddings)`` in input order.

    ``embeddings`` is a float32 array of shape (n, dim); rows missing from the shards or written
    twice raise ``ValueError`` (an interrupted or mixed run), never a silent misalignment.
    """
    table = _read_shards(path, _EMBED_SCHEMA, "embedding")
    rows = table.column("row").to_numpy()
    order = np.argsort(rows, kind="stable")
    if not np.array_equal(rows[order], np.arange(len(rows))):
        raise ValueError(f"the embedding shards under {str(path)!r} do not hold rows 0..{len(rows) - 1} "
                         "exactly once; an earlier run was interrupted or mixed in: embed again "
                         "into an empty folder.")
    col = table.column("embedding").combine_chunks()
    dim = col.type.list_size
    emb = col.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    emb = emb.reshape(len(rows), dim)[order]
    ids = table.column("id").to_pylist()
    return [ids[i] for i in order], emb


def dense_index_from_shards(units: Sequence[Unit], path: str | os.PathLike, embedder: Any = None):
    """A :class:`~funnel_core.embeddings.DenseIndex` over ``units`` with the embeddings read from
    shards of :func:`embed_texts` (their ids must be the units' ids, in the same order)."""
    from funnel_core.embeddings import DenseIndex, SentenceEmbedder

    units = list(units)
    ids, emb = read_embeddings(path)
    if ids != [u.id for u in units]:
        raise ValueError(f"the embedding shards under {str(path)!r} were written for other units "
                         f"({len(ids)} ids, {len(units)} units, or a different order); embed these "
                         "units with ids=[u.id for u in units].")
    return DenseIndex(embedder or SentenceEmbedder()).index(units, embeddings=emb)


# -- 3. batch pair scoring -------------------------------------------------------------------
def _scorer_with_device(factory: Callable[..., Any], device: str) -> Callable[[], Any]:
    """``factory`` with ``device=`` filled in when it accepts one and was not given one."""
    given = factory.keywords if isinstance(factory, functools.partial) else {}
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return factory
    if "device" in params and "device" not in (given or {}):
        return functools.partial(factory, device=device)
    return factory


def _normalise_groups(groups: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for n, g in enumerate(groups):
        try:
            qid, query, uids, texts = g["query_id"], g["query"], list(g["unit_ids"]), list(g["texts"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"group {n} must be a mapping with 'query_id', 'query', 'unit_ids' and "
                             f"'texts', got {g!r:.200}.") from exc
        if len(uids) != len(texts):
            raise ValueError(f"group {n} ({qid!r}) has {len(uids)} unit_ids and {len(texts)} texts.")
        out.append({"query_id": str(qid), "query": str(query), "unit_ids": [str(u) for u in uids],
                    "texts": [str(t) for t in texts]})
    return out


def score_groups(groups: Iterable[Mapping[str, Any]], scorer: Callable[..., Any],
                 out_dir: str | os.PathLike, *, engine: str = "local", groups_per_batch: int = 8,
                 num_workers: int = 1, num_gpus: float = 0, progress: bool = False,
                 ray_options: Mapping[str, Any] | None = None) -> Path:
    """Score (query, candidate) pairs with a post-ranker into Parquet shards.

    The unit of work is a *group*: one query with all its candidates, scored by one
    ``scorer.score(query, texts)`` call, because some scorers score candidates jointly (FiD
    attention normalises over all passages read together), so a query's candidates are never
    split across batches or workers.

    Args:
        groups: Mappings with ``query_id``, ``query``, ``unit_ids`` and ``texts``.
        scorer: A picklable factory returning a :class:`~funnel_core.rerank.base.Reranker`
            (anything with ``score(query, texts)``), e.g.
            ``functools.partial(CrossEncoderScorer, "path/to/model")``; each worker calls it once
            (the model loads once per actor). When it accepts ``device`` and none was given,
            ``device`` is set from ``num_gpus``.
        out_dir: A new or empty folder; columns ``query_id``, ``unit_id``, ``position``,
            ``score``; read back with :func:`read_pair_scores`.
        engine: ``"local"`` or ``"ray"`` (Ray Data ``map_batches`` over ``num_workers`` actors).
        groups_per_batch: Groups per batch (and per shard file of the local engine).
        num_gpus: GPUs per actor: ``0`` CPU actors (``device="cpu"``), ``> 0`` GPU actors
            (``device="cuda"``).
    """
    _check_engine(engine)
    check_positive_int(groups_per_batch, "groups_per_batch")
    check_positive_int(num_workers, "num_workers")
    if not callable(scorer) or (not isinstance(scorer, type) and hasattr(scorer, "score")):
        raise TypeError("scorer must be a factory (a class, or functools.partial(ScorerClass, ...)) "
                        "that builds the scorer, not a built scorer: each worker builds its own "
                        "copy and loads the model once.")
    groups = _normalise_groups(groups)
    out = _fresh_dir(out_dir)
    factory = _scorer_with_device(scorer, _device_for(num_gpus))
    if engine == "ray":
        from funnel_core.offline import ray as ray_engine

        ray_engine.score(groups, factory, out, groups_per_batch=groups_per_batch,
                         num_workers=num_workers, num_gpus=num_gpus, progress=progress,
                         **dict(ray_options or {}))
        return out
    import pyarrow.parquet as pq
    from tqdm.auto import tqdm

    model = factory()
    for s, start in enumerate(tqdm(range(0, max(1, len(groups)), groups_per_batch), desc="scoring",
                                   disable=not progress, unit="batch")):
        pq.write_table(score_table(groups[start:start + groups_per_batch], model),
                       out / f"part-{s:06d}.parquet")
    return out


def read_pair_scores(path: str | os.PathLike) -> dict[str, dict[str, float]]:
    """Read the shards of :func:`score_groups`: ``{query_id: {unit_id: score}}`` (candidates in
    their input order)."""
    table = _read_shards(path, _SCORE_SCHEMA, "score")
    cols = {c: table.column(c).to_pylist() for c in _SCORE_SCHEMA}
    order = sorted(range(len(cols["score"])), key=lambda i: (cols["query_id"][i], cols["position"][i]))
    out: dict[str, dict[str, float]] = {}
    for i in order:
        out.setdefault(cols["query_id"][i], {})[cols["unit_id"][i]] = float(cols["score"][i])
    return out


def apply_pair_scores(units: Sequence[Unit], scores: Mapping[str, float], name: str = "postrank") -> list[Unit]:
    """Rescored copies of the ``units`` that have a score in ``scores`` (one query's entry of
    :func:`read_pair_scores`), e.g. the scored passages that
    :func:`funnel_core.train.l2g.l2g_group` / :func:`~funnel_core.train.l2g.train_l2g` take."""
    return [u.rescored(float(scores[u.id]), name) for u in units if u.id in scores]


# -- 4. the whole build ------------------------------------------------------------------------
@dataclass
class BuildReport:
    """What :func:`build_index` did: sizes, seconds per phase, the engine and its settings."""

    path: str
    engine: str
    n_documents: int
    n_clusters: int
    n_edges: int
    seconds: dict[str, float] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "engine": self.engine, "n_documents": self.n_documents,
                "n_clusters": self.n_clusters, "n_edges": self.n_edges, "seconds": self.seconds,
                "config": self.config}


def build_index(documents: Sequence[Unit], out_dir: str | os.PathLike, *, engine: str = "local",
                max_tokens: int = 4096, knn_k: int = 20, knn_threshold: float = 0.1,
                query_terms: int = 16, block_size: int = 4096, knn_backend: str = "auto",
                embed: bool = True, embed_model: str | None = None, embed_batch_size: int = 64,
                num_workers: int | None = None, num_gpus: float = 0, progress: bool = False,
                ray_options: Mapping[str, Any] | None = None,
                bm25_config: Mapping[str, Any] | None = None) -> BuildReport:
    """Run the offline pipeline over ``documents`` and persist the result in ``out_dir``.

    Phases: BM25 index over the documents -> kNN graph (:func:`knn_graph`, ``engine``) ->
    Algorithm 1 and the cluster BM25 index (:class:`~funnel_core.funnelrag.clustered_index.ClusteredBM25Index`,
    this process) -> document embeddings (:func:`embed_texts`, ``engine``; skipped unless
    ``embed``). The clusters equal ``ClusteredBM25Index(...).index(documents)`` with the same
    settings, for either engine.

    ``out_dir`` is written in one atomic rename and holds ``clustered/`` (load with
    :class:`~funnel_core.funnelrag.clustered_index.ClusteredBM25Index` ``.load``), ``dense/`` (a
    :class:`~funnel_core.embeddings.DenseIndex`, when ``embed``), ``knn.npz`` (the graph,
    ``scipy.sparse.load_npz``) and ``manifest.json`` (this report). :func:`load_build` reads it.
    """
    from funnel_core.bm25 import BM25Index
    from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
    from funnel_core.funnelrag.clustering import bm25_weight_matrix
    from funnel_core.persist import save_snapshot

    _check_engine(engine)
    documents = list(documents)
    if not documents:
        raise ValueError("cannot build an index over an empty corpus; pass at least one document.")
    check_unique_ids(documents)
    bm25_config = dict(bm25_config or {})
    secs: dict[str, float] = {}
    t0 = time.perf_counter()
    _log(progress, f"[1/4] BM25 index over {len(documents)} documents")
    w = bm25_weight_matrix(BM25Index(**bm25_config).index(documents))
    secs["bm25"] = time.perf_counter() - t0

    t = time.perf_counter()
    _log(progress, f"[2/4] kNN graph (engine={engine}, k={knn_k}, threshold={knn_threshold})")
    adj = knn_graph(w, k=knn_k, threshold=knn_threshold, query_terms=query_terms, engine=engine,
                    block_size=block_size, num_workers=num_workers, backend=knn_backend,
                    progress=progress, ray_options=ray_options)
    del w
    secs["knn"] = time.perf_counter() - t

    t = time.perf_counter()
    _log(progress, f"[3/4] Algorithm 1 over {adj.nnz // 2} edges, then BM25 over the clusters")
    clustered = ClusteredBM25Index(max_tokens=max_tokens, adjacency="bm25", knn_k=knn_k,
                                   knn_threshold=knn_threshold, **bm25_config).index(documents, adjacency=adj)
    secs["clusters"] = time.perf_counter() - t

    config = dict(max_tokens=max_tokens, knn_k=knn_k, knn_threshold=knn_threshold,
                  query_terms=query_terms, block_size=block_size, knn_backend=knn_backend,
                  embed=embed, embed_model=embed_model, num_workers=num_workers, num_gpus=num_gpus,
                  bm25_config=bm25_config)
    box: dict[str, Any] = {}

    def write(tmp: Path) -> dict:
        clustered.save(tmp / "clustered")
        sp.save_npz(tmp / "knn.npz", adj)
        if embed:
            from funnel_core.embeddings import SentenceEmbedder

            t = time.perf_counter()
            _log(progress, f"[4/4] embeddings of {len(documents)} documents (engine={engine})")
            with tempfile.TemporaryDirectory(prefix="funnel-embed-") as shards:
                embed_texts([d.text for d in clustered.documents], Path(shards) / "shards",
                            ids=[d.id for d in clustered.documents], model=embed_model, engine=engine,
                            batch_size=embed_batch_size, num_workers=num_workers or 1,
                            num_gpus=num_gpus, progress=progress, ray_options=ray_options)
                dense = dense_index_from_shards(clustered.documents, Path(shards) / "shards",
                                                SentenceEmbedder(embed_model))
            dense.save(tmp / "dense")
            secs["embeddings"] = time.perf_counter() - t
        secs["total"] = time.perf_counter() - t0
        report = BuildReport(path=str(out_dir), engine=engine, n_documents=len(documents),
                             n_clusters=len(clustered.clusters), n_edges=int(adj.nnz // 2),
                             seconds={k: round(v, 3) for k, v in secs.items()}, config=config)
        box["report"] = report
        return {k: v for k, v in report.to_dict().items() if k != "path"}

    save_snapshot(out_dir, BUILD_FORMAT, 1, write)
    report = box["report"]
    _log(progress, f"done: {report.n_documents} documents, {report.n_clusters} clusters -> {out_dir} "
                   f"({secs['total']:.1f} s)")
    return report


def load_build(path: str | os.PathLike) -> dict[str, Any]:
    """Open a folder written by :func:`build_index`: ``{"clustered": ClusteredBM25Index,
    "dense": DenseIndex or None, "knn": csr_matrix, "manifest": dict}``."""
    from funnel_core.embeddings import DenseIndex
    from funnel_core.funnelrag.clustered_index import ClusteredBM25Index
    from funnel_core.persist import load_snapshot

    def read(folder: Path, manifest: dict) -> dict[str, Any]:
        dense = DenseIndex.load(folder / "dense") if (folder / "dense").exists() else None
        return {"clustered": ClusteredBM25Index.load(folder / "clustered"), "dense": dense,
                "knn": sp.load_npz(folder / "knn.npz").tocsr(), "manifest": manifest["meta"]}

    return load_snapshot(path, BUILD_FORMAT, 1, "offline build", read)


def _json_default(o: Any) -> Any:  # pragma: no cover - used by the CLI for numpy scalars
    if isinstance(o, np.generic):
        return o.item()
    return str(o)


def report_json(report: BuildReport) -> str:
    """The report as JSON text (used by ``funnel build``)."""
    return json.dumps(report.to_dict(), indent=1, default=_json_default)
