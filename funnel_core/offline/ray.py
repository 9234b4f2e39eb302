"""The Ray engine of :mod:`funnel_core.offline` (the only module of funnel-rag that imports Ray).

Install with ``pip install 'funnel-rag[ray]'``. Call the functions of :mod:`funnel_core.offline`
with ``engine="ray"`` rather than these directly. Ray is started on first use with
``ray.init(**ray_options)`` unless it is already running: locally that is a one-machine Ray
(``num_cpus=2`` in the tests); ``address="auto"`` or ``"ray://head:10001"`` joins a cluster,
where the same tasks and actors spread over its nodes (every node needs funnel-rag installed, or
a ``runtime_env``).

* :func:`knn_adjacency` — the BM25 kNN graph as Ray tasks, one per row block, each calling
  :func:`funnel_core.funnelrag.clustering.knn_block` on the weight matrix shared through the object store;
  the blocks are stacked in order and symmetrised exactly as the local engine does.
* :func:`embed` / :func:`score` — Ray Data ``map_batches`` over a fixed pool of actors that
  build the embedder / scorer once; GPU actors when ``num_gpus > 0``; output written with
  ``Dataset.write_parquet`` in the shard layout :mod:`funnel_core.offline` reads back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import scipy.sparse as sp

__all__ = ["require_ray", "ensure_ray", "shutdown", "knn_blocks", "knn_adjacency", "embed", "score"]


def require_ray() -> Any:
    """Import Ray or explain how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError("engine='ray' needs Ray: pip install 'funnel-rag[ray]' (or 'ray[data]'), "
                          "or use engine='local'.") from exc
    return ray


_STARTED: list[bool] = [False]  # whether ensure_ray started the running session


def ensure_ray(address: str | None = None, num_cpus: int | None = None, **init_kwargs: Any) -> Any:
    """Start Ray (``ray.init``) unless it is running; return the ``ray`` module."""
    ray = require_ray()
    if not ray.is_initialized():
        init_kwargs.setdefault("include_dashboard", False)
        init_kwargs.setdefault("logging_level", "WARNING")
        ray.init(address=address, num_cpus=num_cpus, **init_kwargs)
        _STARTED[0] = True
    return ray


def shutdown(only_if_started_here: bool = False) -> None:
    """Stop the Ray session of this process, if any (with ``only_if_started_here``: only when
    :func:`ensure_ray` started it, leaving a caller's own session alone)."""
    try:
        import ray
    except ImportError:
        return
    if ray.is_initialized() and (_STARTED[0] or not only_if_started_here):
        ray.shutdown()
        _STARTED[0] = False


# -- kNN graph -----------------------------------------------------------------------------
def _knn_task(w: sp.csr_matrix, postings: sp.csc_matrix, start: int, stop: int,
              params: Mapping[str, Any], threads: int) -> sp.csr_matrix:
    from funnel_core.funnelrag.clustering import knn_block

    if params.get("backend") in ("auto", "numba"):
        try:
            import numba

            numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))  # type: ignore[attr-defined]
        except ImportError:
            pass
    return knn_block(w, start, stop, postings=postings, **params)


def knn_blocks(w: sp.csr_matrix, spans: Sequence[tuple[int, int]], *, k: int = 20,
               threshold: float = 0.1, query_terms: int = 16, num_workers: int | None = None,
               backend: str = "auto", progress: bool = False, threads_per_worker: int = 1,
               **ray_init: Any) -> list[sp.csr_matrix]:
    """Directed kNN rows ``start:stop`` of ``w`` for each span, one Ray task per span, in order.

    At most ``num_workers`` tasks (default: the cluster's CPUs) run at once, each with
    ``threads_per_worker`` numba threads; ``w`` and its postings go to the object store once.
    """
    from tqdm.auto import tqdm

    from funnel_core.funnelrag.clustering import check_knn_args, knn_backend

    check_knn_args(k, threshold, query_terms)
    backend = knn_backend(backend)  # fail here, not in a worker, when numba is missing
    ray = ensure_ray(**ray_init)
    w = sp.csr_matrix(w)
    if not w.has_sorted_indices:
        w = w.copy()
        w.sort_indices()
    n = w.shape[0]
    for start, stop in spans:
        if not 0 <= start <= stop <= n:
            raise ValueError(f"need 0 <= start <= stop <= {n}, got span ({start}, {stop}).")
    if num_workers is None:
        num_workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers!r}.")
    w_ref = ray.put(w)
    p_ref = ray.put(w.tocsc())
    params = dict(k=k, threshold=float(threshold), query_terms=query_terms, backend=backend)
    task = ray.remote(num_cpus=1)(_knn_task)
    spans = list(spans)
    blocks: list[Any] = [None] * len(spans)
    pending: dict[Any, int] = {}
    bar = tqdm(total=len(spans), desc="kNN blocks (ray)", disable=not progress, unit="block")
    nxt = 0
    try:
        while nxt < len(spans) or pending:
            while nxt < len(spans) and len(pending) < num_workers:
                start, stop = spans[nxt]
                pending[task.remote(w_ref, p_ref, start, stop, params, threads_per_worker)] = nxt
                nxt += 1
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                # a private copy: ray.get gives read-only views that pin the object store
                blocks[pending.pop(ref)] = ray.get(ref).copy()
                bar.update(1)
    finally:
        bar.close()
        for ref in pending:
            ray.cancel(ref)
    return blocks


def knn_adjacency(w: sp.csr_matrix, *, k: int = 20, threshold: float = 0.1, query_terms: int = 16,
                  block_size: int = 4096, num_workers: int | None = None, backend: str = "auto",
                  progress: bool = False, threads_per_worker: int = 1,
                  **ray_init: Any) -> sp.csr_matrix:
    """The BM25 kNN graph of weight matrix ``w`` with one Ray task per block of ``block_size`` rows
    (:func:`knn_blocks`), stacked in order and symmetrised (maximum).

    Equal, entry for entry, to :func:`funnel_core.funnelrag.clustering.knn_adjacency_from_weights` on the same
    input: each block is the pure function :func:`funnel_core.funnelrag.clustering.knn_block`.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size!r}.")
    n = w.shape[0]
    spans = [(s, min(n, s + block_size)) for s in range(0, n, block_size)]
    blocks = knn_blocks(w, spans, k=k, threshold=threshold, query_terms=query_terms,
                        num_workers=num_workers, backend=backend, progress=progress,
                        threads_per_worker=threads_per_worker, **ray_init)
    adj = sp.vstack(blocks, format="csr") if blocks else sp.csr_matrix((n, n))
    del blocks
    return adj.maximum(adj.T).tocsr()


# -- Ray Data batch jobs -------------------------------------------------------------------
class _EmbedActor:
    """Builds the embedder once per actor; embeds one batch per call."""

    def __init__(self, model: str | None, batch_size: int, normalize: bool, device: str,
                 dtype: str = "auto") -> None:
        from funnel_core.embeddings import SentenceEmbedder

        self.embedder = SentenceEmbedder(model, device=device, batch_size=batch_size,
                                         normalize=normalize, dtype=dtype)
        _ = self.embedder.model  # load now: once per actor, not inside the first batch's timing

    def __call__(self, batch: Any) -> Any:
        from funnel_core.offline.shards import embed_table

        texts = batch.column("text").to_pylist()
        emb = self.embedder.encode(texts) if texts else np.zeros((0, self.embedder.dimension), np.float32)
        return embed_table(batch.column("row").to_numpy(), batch.column("id").to_pylist(), emb)


class _ScoreActor:
    """Builds the scorer once per actor; scores one batch of query groups per call."""

    def __init__(self, factory: Callable[[], Any]) -> None:
        self.scorer = factory()

    def __call__(self, batch: Any) -> Any:
        from funnel_core.offline.shards import score_table

        return score_table(batch.to_pylist(), self.scorer)


def _data_context(progress: bool) -> None:
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = bool(progress)
    if hasattr(ctx, "print_on_execution_start"):
        ctx.print_on_execution_start = bool(progress)


def _map_actors(ds: Any, actor: type, ctor_kwargs: dict[str, Any], *, batch_size: int,
                num_workers: int, num_gpus: float) -> Any:
    import ray.data

    resources = {"num_gpus": num_gpus} if num_gpus > 0 else {"num_cpus": 1}
    return ds.map_batches(actor, fn_constructor_kwargs=ctor_kwargs, batch_size=batch_size,
                          batch_format="pyarrow", zero_copy_batch=True,
                          compute=ray.data.ActorPoolStrategy(size=num_workers), **resources)


def embed(texts: Sequence[str], ids: Sequence[str], out: Path, *, model: str | None, batch_size: int,
          normalize: bool, shard_rows: int, num_workers: int, num_gpus: float, progress: bool,
          dtype: str = "auto", **ray_init: Any) -> None:
    """Ray Data job of :func:`funnel_core.offline.embed_texts` (see there)."""
    import pyarrow as pa

    ensure_ray(**ray_init)
    import ray.data

    _data_context(progress)
    device = "cuda" if num_gpus > 0 else "cpu"
    blocks = [pa.table({"row": pa.array(np.arange(s, min(len(texts), s + shard_rows)), pa.int64()),
                        "id": pa.array(list(ids[s:s + shard_rows]), pa.string()),
                        "text": pa.array(list(texts[s:s + shard_rows]), pa.string())})
              for s in range(0, len(texts), shard_rows)] or \
        [pa.table({"row": pa.array([], pa.int64()), "id": pa.array([], pa.string()),
                   "text": pa.array([], pa.string())})]
    ds = ray.data.from_arrow(blocks)
    ds = _map_actors(ds, _EmbedActor, dict(model=model, batch_size=batch_size, normalize=normalize,
                                           device=device, dtype=dtype),
                     batch_size=shard_rows, num_workers=num_workers, num_gpus=num_gpus)
    ds.write_parquet(str(out))


def score(groups: Sequence[Mapping[str, Any]], factory: Callable[[], Any], out: Path, *,
          groups_per_batch: int, num_workers: int, num_gpus: float, progress: bool,
          **ray_init: Any) -> None:
    """Ray Data job of :func:`funnel_core.offline.score_groups` (see there)."""
    import pyarrow as pa

    ensure_ray(**ray_init)
    import ray.data

    _data_context(progress)
    schema = pa.schema([("query_id", pa.string()), ("query", pa.string()),
                        ("unit_ids", pa.list_(pa.string())), ("texts", pa.list_(pa.string()))])
    blocks = [pa.Table.from_pylist(list(groups[s:s + groups_per_batch]), schema=schema)
              for s in range(0, len(groups), groups_per_batch)] or [schema.empty_table()]
    ds = ray.data.from_arrow(blocks)
    ds = _map_actors(ds, _ScoreActor, dict(factory=factory), batch_size=groups_per_batch,
                     num_workers=num_workers, num_gpus=num_gpus)
    ds.write_parquet(str(out))
