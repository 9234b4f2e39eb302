"""Hybrid search from "Searching for Best Practices in Retrieval-Augmented
Generation" (Wang et al., 2024).

Hybrid search (section 3.4.3, Table 8) fuses a sparse ranking (BM25) and a dense ranking
(embeddings) with

    S_h = alpha * S_sparse + S_dense,          alpha = 0.3 by default (the paper's best value)

over *normalised* scores. Raw BM25 scores are unbounded and cosine similarities live in
[-1, 1], so both lists are normalised before they are added:

* ``"minmax"`` (default): ``(s - min) / (max - min)`` over the scores of *that list* (the
  candidates one side returned for this query), so each side's best candidate gets 1 and its
  worst 0. A list whose scores are all equal maps to 1.0.
* ``"zscore"``: ``(s - mean) / std`` over the list (std 0 -> all 0).
* ``"none"``: raw scores (only sensible when both sides share a scale).

Alpha fusion refuses a non-finite score (``ValueError`` naming the side and the ids) under
every normalisation, ``"none"`` included: an ``inf`` would otherwise rank first and a ``NaN``
anywhere. RRF reads ranks only and is unaffected.

A candidate that only one side returned gets the *minimum* normalised value of the other side
(0 under min-max): it ranked below everything that side returned, so it gets that side's lowest
score. Reciprocal rank fusion (``method="rrf"``, Cormack et al., 2009) is offered as an
alternative: ``score = sum_side weight_side / (k + rank_side)``, ``k = 60``, rank from 1; it
needs no normalisation at all.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Sequence, Union

from funnel_core.errors import check_positive_int, check_probability, check_query
from funnel_core.funnel import Stage
from funnel_core.scoring import NORMALIZATIONS, check_finite_scores, normalize_scores
from funnel_core.settings import Settings
from funnel_core.units import SCORE_PREFIX, Unit

__all__ = [
    "NORMALIZATIONS",
    "FUSION_METHODS",
    "normalize_scores",
    "alpha_fusion",
    "rrf_fusion",
    "fuse",
    "check_fusion_config",
    "same_identity",
    "HybridRetrieve",
]

# NORMALIZATIONS and normalize_scores live in funnel_core.scoring (one tie rule); re-exported here.
FUSION_METHODS = ("alpha", "rrf")

#: One side of a hybrid: a :class:`Stage` (called as ``stage(query, units)``) or any callable
#: ``fn(query) -> list[Unit]`` (for example ``index.search`` or a framework retriever wrapped
#: by an adapter).
Side = Union[Stage, Callable[[str], Sequence[Unit]]]


def _scores_of(units: Sequence[Unit], side: str) -> list[float]:
    out = []
    for u in units:
        if u.score is None:
            raise ValueError(
                f"unit {u.id!r} from the {side} side has no score; alpha fusion needs scored "
                "units (use method='rrf', which only needs ranks)."
            )
        out.append(float(u.score))
    # every normalisation, "none" included: an inf would rank first and a NaN anywhere
    return check_finite_scores(out, f"the {side} side of the hybrid", [u.id for u in units],
                               "Fusion needs finite scores: fix or filter that retriever's "
                               "output, or use method='rrf', which only reads ranks.")


def _dedup(units: Sequence[Unit]) -> list[Unit]:
    """Keep the first (best-ranked) occurrence of each id."""
    seen: set[str] = set()
    out = []
    for u in units:
        if u.id not in seen:
            seen.add(u.id)
            out.append(u)
    return out


def _merge(sparse: list[Unit], dense: list[Unit], fused: dict[str, float], stage: str,
           extra: dict[str, dict[str, Any]]) -> list[Unit]:
    """Build output units (sparse copy preferred, score history of both sides), best first.

    One copy per output unit: the copy of the sparse unit (or the dense one when only the dense
    side found it), with the other side's score history merged in and the fused score set.
    """
    sparse_by_id = {u.id: u for u in sparse}
    dense_by_id = {u.id: u for u in dense}
    out = []
    for uid in sorted(fused, key=lambda i: (-fused[i], i)):
        base = sparse_by_id.get(uid) or dense_by_id[uid]
        unit = base.copy()
        if uid in sparse_by_id and uid in dense_by_id:
            for key, val in dense_by_id[uid].funnel.items():
                if key.startswith(SCORE_PREFIX):
                    unit.funnel.setdefault(key, val)
        unit.score = float(fused[uid])
        unit.record_score(stage, unit.score)
        unit.funnel.update(extra[uid])  # both callers give every fused id its ranks / scores
        out.append(unit)
    return out


def alpha_fusion(sparse: Sequence[Unit], dense: Sequence[Unit], alpha: float = 0.3,
                 normalization: str = "minmax", stage: str = "hybrid") -> list[Unit]:
    """The paper's hybrid score ``S_h = alpha * S_sparse + S_dense`` over normalised scores.

    Args:
        sparse: Units from the sparse retriever, best first, with scores.
        dense: Units from the dense retriever, best first, with scores.
        alpha: Weight of the sparse side, in [0, 1] (0.3 in the paper).
        normalization: ``"minmax"`` (default), ``"zscore"`` or ``"none"``.
        stage: Name under which the fused score is kept in ``funnel["score_<stage>"]``.

    Returns:
        The union of both lists, fused score in ``score``, best first (ties by id). Each unit's
        bookkeeping (``Unit.funnel``) gets ``sparse_score``/``dense_score`` (normalised, the value used) and
        ``sparse_rank``/``dense_rank`` (0-based, ``None`` when that side missed it).
    """
    alpha = check_probability(alpha, "alpha")
    sparse, dense = _dedup(sparse), _dedup(dense)
    s_norm = normalize_scores(_scores_of(sparse, "sparse"), normalization)
    d_norm = normalize_scores(_scores_of(dense, "dense"), normalization)
    s_floor = min(s_norm) if s_norm else 0.0
    d_floor = min(d_norm) if d_norm else 0.0
    s_map = {u.id: (s, r) for r, (u, s) in enumerate(zip(sparse, s_norm))}
    d_map = {u.id: (s, r) for r, (u, s) in enumerate(zip(dense, d_norm))}
    fused: dict[str, float] = {}
    extra: dict[str, dict[str, Any]] = {}
    for uid in {**s_map, **d_map}:
        s, s_rank = s_map.get(uid, (s_floor, None))
        d, d_rank = d_map.get(uid, (d_floor, None))
        fused[uid] = alpha * s + d
        extra[uid] = {"sparse_score": float(s), "dense_score": float(d),
                      "sparse_rank": s_rank, "dense_rank": d_rank}
    return _merge(sparse, dense, fused, stage, extra)


def rrf_fusion(sparse: Sequence[Unit], dense: Sequence[Unit], k: int = 60,
               weights: tuple[float, float] = (1.0, 1.0), stage: str = "hybrid") -> list[Unit]:
    """Reciprocal rank fusion: ``score = w_s / (k + rank_sparse) + w_d / (k + rank_dense)``.

    Ranks start at 1; a side that missed a unit contributes 0. Scores are not needed.

    Args:
        sparse: Sparse-side units, best first.
        dense: Dense-side units, best first.
        k: The RRF constant (60 in Cormack et al.); larger flattens the rank discount.
        weights: Weights of the sparse and dense sides.
        stage: Name under which the fused score is kept in ``funnel["score_<stage>"]``.
    """
    check_positive_int(k, "rrf_k")
    if len(weights) != 2 or any(not isinstance(w, (int, float)) or w < 0 for w in weights):
        raise ValueError(f"weights must be two non-negative numbers (sparse, dense), got {weights!r}.")
    sparse, dense = _dedup(sparse), _dedup(dense)
    fused: dict[str, float] = {}
    extra: dict[str, dict[str, Any]] = {}
    for side, units, w in (("sparse", sparse, weights[0]), ("dense", dense, weights[1])):
        for rank, u in enumerate(units):
            fused[u.id] = fused.get(u.id, 0.0) + float(w) / (k + rank + 1)
            extra.setdefault(u.id, {"sparse_rank": None, "dense_rank": None})[f"{side}_rank"] = rank
    return _merge(sparse, dense, fused, stage, extra)


def check_fusion_config(method: str, alpha: float, normalization: str, rrf_k: int) -> float:
    """Validate fusion settings (shared by the stage and the framework adapters); returns alpha."""
    if method not in FUSION_METHODS:
        raise ValueError(f"unknown fusion method {method!r}; choose one of {FUSION_METHODS}.")
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"unknown normalization {normalization!r}; choose one of "
                         f"{NORMALIZATIONS}.")
    check_positive_int(rrf_k, "rrf_k")
    return check_probability(alpha, "alpha")


def fuse(sparse: Sequence[Unit], dense: Sequence[Unit], *, method: str = "alpha",
         alpha: float = 0.3, normalization: str = "minmax", rrf_k: int = 60,
         k: int | None = None, stage: str = "hybrid") -> list[Unit]:
    """Fuse a sparse and a dense ranking with ``method`` (``"alpha"`` or ``"rrf"``), cut to ``k``."""
    alpha = check_fusion_config(method, alpha, normalization, rrf_k)
    check_positive_int(k, "k", allow_none=True)
    if method == "rrf":
        out = rrf_fusion(sparse, dense, k=rrf_k, stage=stage)
    else:
        out = alpha_fusion(sparse, dense, alpha=alpha, normalization=normalization, stage=stage)
    return out[:k] if k is not None else out


def same_identity(sparse: Sequence[Unit], dense: Sequence[Unit]) -> None:
    """Give a dense unit the id of the sparse unit that is the same document, in place.

    Two retrievers built over the same id-less Documents (LangChain's default) name them
    differently: our BM25 numbers them ``"0"``, ``"1"``, ..., a vector store gives them uuids.
    A dense unit whose id the sparse side also returned keeps it; otherwise it takes the id of
    the first sparse unit with the same text whose own id the dense side did not return, so
    fusion merges the two copies instead of returning the text twice. Documents with ids both
    sides share are matched by id alone.
    """
    dense_ids = {u.id for u in dense}
    sparse_ids = {u.id for u in sparse}
    free: dict[str, list[str]] = {}
    for u in sparse:
        if u.id not in dense_ids:
            free.setdefault(u.text, []).append(u.id)
    for u in dense:
        if u.id not in sparse_ids and free.get(u.text):
            u.id = free[u.text].pop(0)


class HybridRetrieve(Settings, Stage):
    """A first stage that fuses a sparse and a dense retriever (paper section 3.4.3).

    Each side is a :class:`Stage` (called as ``stage(query, units)``, e.g.
    :class:`~funnel_core.bm25.BM25Retrieve`, :class:`~funnel_core.embeddings.DenseRetrieve`) or
    any callable ``fn(query) -> list[Unit]``. The two sides may receive *different* query
    strings: ``dense_query`` (and ``sparse_query``) rewrite the query for one side, which is how
    HyDE plugs in — the dense side embeds a hypothetical answer document, BM25 keeps the user's
    words. :meth:`retrieve` takes both strings explicitly.

    Args:
        sparse: The sparse side (BM25).
        dense: The dense side (embeddings).
        k: Units to return (``None``: the whole fused union). ``stage % k`` also cuts.
        sparse_query: Optional ``fn(query) -> str`` rewriting the query for the sparse side.
        dense_query: Optional ``fn(query) -> str`` rewriting the query for the dense side (e.g. a
            HyDE generator).
        name: Stage name (key of the fused score in ``funnel["score_<stage>"]``).
        alpha: Sparse weight in ``S_h = alpha * S_sparse + S_dense``, in [0, 1]
            (``method="alpha"``).
        method: ``"alpha"`` (weighted sum of normalised scores) or ``"rrf"`` (reciprocal rank
            fusion).
        normalization: Score normalisation of each side for ``method="alpha"``: ``"minmax"``,
            ``"zscore"`` or ``"none"``.
        rrf_k: RRF constant (``method="rrf"``; Cormack et al.: 60).

    Every setting is an attribute; an edit (``stage.alpha = 0.5``) is validated and used at the
    next call.
    """

    unserialised = ("sparse", "dense", "sparse_query", "dense_query")

    def __init__(self, sparse: Side, dense: Side, *, k: int | None = None,
                 sparse_query: Callable[[str], str] | None = None,
                 dense_query: Callable[[str], str] | None = None,
                 name: str = "hybrid", alpha: float = 0.3, method: str = "alpha",
                 normalization: str = "minmax", rrf_k: int = 60) -> None:
        for label, side in (("sparse", sparse), ("dense", dense)):
            if not (isinstance(side, Stage) or callable(side)):
                raise TypeError(f"the {label} side must be a funnel_core Stage or a callable "
                                f"fn(query) -> list[Unit], got {type(side).__name__}.")
        self.sparse, self.dense = sparse, dense
        self.alpha = check_fusion_config(method, alpha, normalization, rrf_k)
        self.method, self.normalization, self.rrf_k = method, normalization, rrf_k
        self.k = check_positive_int(k, "k", allow_none=True)
        self.sparse_query, self.dense_query = sparse_query, dense_query
        self.name = name

    @staticmethod
    def _call_side(side: Side, query: str, units: list[Unit]) -> list[Unit]:
        if not query:
            return []
        if isinstance(side, Stage):
            return list(side(query, units))
        return list(side(query))

    def fuse(self, sparse: Sequence[Unit], dense: Sequence[Unit]) -> list[Unit]:
        """Fuse two ranked lists with this stage's method and settings, cut to ``k``."""
        return fuse(sparse, dense, method=self.method, alpha=self.alpha,
                    normalization=self.normalization, rrf_k=self.rrf_k, k=self.limit(self.k),
                    stage=self.name)

    def _queries(self, query: str, sparse_query: str | None,
                 dense_query: str | None) -> tuple[str, str]:
        sq = check_query(sparse_query) if sparse_query is not None else (
            check_query(self.sparse_query(query)) if self.sparse_query else query)
        dq = check_query(dense_query) if dense_query is not None else (
            check_query(self.dense_query(query)) if self.dense_query else query)
        return sq, dq

    def retrieve(self, query: str, *, sparse_query: str | None = None,
                 dense_query: str | None = None, units: Sequence[Unit] = ()) -> list[Unit]:
        """Run both sides and fuse. ``sparse_query``/``dense_query`` override the query per side.

        An empty ``query`` returns ``[]``.
        """
        query = check_query(query)
        if not query:
            return []
        sq, dq = self._queries(query, sparse_query, dense_query)
        units = list(units)
        return self.fuse(self._call_side(self.sparse, sq, units),
                         self._call_side(self.dense, dq, units))

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        return self.retrieve(query, units=units)

    async def arun(self, query: str, units: list[Unit]) -> list[Unit]:
        """Both sides run concurrently in worker threads."""
        sq, dq = await asyncio.to_thread(self._queries, query, None, None)
        s, d = await asyncio.gather(
            asyncio.to_thread(self._call_side, self.sparse, sq, units),
            asyncio.to_thread(self._call_side, self.dense, dq, units))
        return self.fuse(s, d)
