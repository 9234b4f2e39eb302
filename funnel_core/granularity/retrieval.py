"""MoG retrieval (section 3.2.1, equations 1-2, Appendix A): the router mixes granularity levels.

For a query ``q``:

1. BM25 retrieves the top ``k_r`` units of every level ``j`` (``k_r = 3`` in the paper) with
   their raw scores ``s_j`` (equation 1; ``normalize="max"`` divides each level's scores by that
   level's best score instead, so levels of different chunk lengths are comparable: not the
   paper's rule).
2. The router gives one weight ``w_j`` per level (equation 1).
3. Every finest unit ``f`` gets the weighted score ``S(f) = sum_j w_j * s_j(u_j(f))`` where
   ``u_j(f)`` is the retrieved level-``j`` unit that covers ``f`` (0 when no retrieved unit of
   level ``j`` covers it; equation 2 applied through the shared finest units, Appendix A).
4. The finest unit with the best ``S`` is picked and the unit that contains it at the router's
   best level ``argmax_j w_j`` is returned. For top-``k`` the next finest units are taken in
   order of ``S``, skipping those whose container was already returned. (Option, not in the
   paper: with ``level_margin > 0`` a router that is unsure, whose best weight leads the
   runner-up by less than the margin, gets the coarser of the two levels.)

:data:`MOG_PRESETS` names the settings: ``"paper"`` (``k_r=3``, raw scores; the defaults) and
``"normalised"`` (``k_r=10``, per-level max normalisation, this package's earlier default).

This is not a plain top-k over the union of levels, which the paper shows favours coarse chunks.
It works over any :class:`~funnel_core.granularity.levels.GranularityStructure`: the nested
chunks of :class:`~funnel_core.granularity.levels.MultiGranularityChunker` (MoG) and the
hop-range levels of :class:`~funnel_core.granularity.graph.GranularityGraph` (MoGG).
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np

from funnel_core.bm25 import BM25Index
from funnel_core.errors import check_positive_int
from funnel_core.funnel import Stage
from funnel_core.granularity.levels import GranularityStructure
from funnel_core.settings import Settings
from funnel_core.units import Unit


class LevelRouter(Protocol):
    """What the selection rule needs of a router
    (:class:`funnel_core.granularity.router.GranularityRouter` is one): the number of levels and
    one weight per level for each query. A protocol here, so this module does not import the
    router module, which imports this one."""

    @property
    def n_levels(self) -> int: ...

    def predict(self, queries: Sequence[str]) -> Any: ...

__all__ = ["GranularityBM25", "MixOfGranularityRetrieve", "LEVEL_NORMALIZATIONS", "MOG_PRESETS",
           "choose_level", "structure_from_units", "mog_stage", "check_mog_settings",
           "mog_rebuilt"]

LEVEL_NORMALIZATIONS = ("max", "none")  # per-level BM25 scores (not funnel_core.scoring.NORMALIZATIONS)

#: Named settings of :class:`MixOfGranularityRetrieve`: ``"paper"`` is equation 1 as written
#: (raw BM25 scores, ``k_r = 3``); ``"normalised"`` divides each level's scores by its best.
MOG_PRESETS: dict[str, dict[str, Any]] = {
    "paper": {"k_r": 3, "normalize": "none", "level_margin": 0.0},
    "normalised": {"k_r": 10, "normalize": "max", "level_margin": 0.0},
}


def choose_level(weights: Sequence[float], margin: float = 0.0) -> int:
    """The level (1-based) whose unit is returned: ``argmax_j w_j``, ties to the finer level.

    With ``margin > 0``: when the best weight leads the runner-up by less than ``margin``, the
    coarser of the two levels is chosen (an unsure router gets more context). Not in the paper.
    """
    w = np.asarray(weights, dtype=np.float64)
    order = np.lexsort((np.arange(len(w)), -w))  # best first, finer first on ties
    best = int(order[0])
    if margin > 0 and len(w) > 1:
        second = int(order[1])
        if w[best] - w[second] < margin:
            best = max(best, second)
    return best + 1


class GranularityBM25:
    """One :class:`~funnel_core.bm25.BM25Index` per granularity level of a structure.

    Args:
        structure: The multi-granularity corpus.
        **bm25: Keyword arguments for every :class:`~funnel_core.bm25.BM25Index`.
    """

    def __init__(self, structure: GranularityStructure, **bm25: Any) -> None:
        if not isinstance(structure, GranularityStructure):
            raise TypeError(f"expected a GranularityStructure (GranularityHierarchy or "
                            f"GranularityGraph), got {type(structure).__name__}.")
        self.structure = structure
        self.indexes = [BM25Index(**bm25).index(level) for level in structure.levels]
        self.positions = [{u.id: i for i, u in enumerate(level)} for level in structure.levels]

    @property
    def n_gra(self) -> int:
        return self.structure.n_gra

    def search(self, query: str, k: int) -> list[list[Unit]]:
        """Top-``k`` units of each level (``out[j - 1]`` for level ``j``), best first."""
        return [index.search(query, k=k) for index in self.indexes]

    def search_level(self, query: str, level: int, k: int = 1) -> list[Unit]:
        """Top-``k`` units of one level (1-based): the fixed-granularity baseline."""
        self.structure._check_level(level)
        return self.indexes[level - 1].search(query, k=k)


class MixOfGranularityRetrieve(Settings, Stage):
    """The MoG selection rule as a first-stage retriever (ignores incoming units).

    Args:
        structure: A :class:`GranularityStructure`, or a ready :class:`GranularityBM25` over one.
        router: A trained :class:`~funnel_core.granularity.router.GranularityRouter`. ``None``
            gives every level the weight 1 (uniform weights; the chosen level is then the finest).
            An untrained router raises :class:`~funnel_core.granularity.router.RouterNotTrainedError`.
        k_r: Units BM25 retrieves per level (raised to ``top_k`` when smaller; paper: 3).
        top_k: Units returned (a cut-off ``stage % k`` lowers it, never raises it).
        normalize: ``"none"`` keeps raw BM25 scores (equation 1, the default); ``"max"`` divides
            each level's scores by its best score.
        level_margin: See :func:`choose_level` (0: the router's best level, as in the paper).
        bm25: Keyword arguments for the per-level BM25 indexes (when ``structure`` is given;
            an edit of it re-indexes the levels).

    Every setting is an attribute; an edit is validated and used at the next call.
    Each returned unit is a copy of a level unit with ``score`` = the weighted score ``S`` and
    bookkeeping (``Unit.funnel``) ``router_weights`` (one float per level), ``chosen_level``, ``finest_id`` and
    ``scores["mog"]``.
    """

    name = "mog"
    #: ``structure`` is kept as its per-level index; an edit of ``bm25`` re-indexes the levels.
    setting_attrs = {"structure": "index"}
    load_settings = frozenset({"bm25"})
    model_attrs = ()
    unserialised = ("structure", "router")

    def __init__(self, structure: GranularityStructure | GranularityBM25,
                 router: LevelRouter | None = None, *, k_r: int = 3, top_k: int = 1,
                 normalize: str = "none", level_margin: float = 0.0,
                 bm25: dict[str, Any] | None = None, name: str = "mog") -> None:
        self.k_r, self.normalize, self.level_margin = check_mog_settings(k_r, normalize,
                                                                         level_margin)
        self.bm25 = None if bm25 is None else dict(bm25)
        self.top_k = check_positive_int(top_k, "top_k")
        self.index = structure if isinstance(structure, GranularityBM25) \
            else GranularityBM25(structure, **(bm25 or {}))
        self.structure = self.index.structure
        if router is not None:
            if router.n_levels != self.structure.n_gra:
                raise ValueError(f"the router has {router.n_levels} outputs but the corpus has "
                                 f"{self.structure.n_gra} granularity levels; train a router with "
                                 f"n_levels={self.structure.n_gra}.")
        self.router = router
        self.name = name

    def drop_model(self) -> None:
        object.__setattr__(self, "index", GranularityBM25(self.structure, **(self.bm25 or {})))

    @classmethod
    def from_preset(cls, preset: str, structure: GranularityStructure | GranularityBM25,
                    router: LevelRouter | None = None, **overrides: Any) -> "MixOfGranularityRetrieve":
        """A retriever with the settings of :data:`MOG_PRESETS` ``[preset]`` (``overrides`` win)."""
        if preset not in MOG_PRESETS:
            raise ValueError(f"preset must be one of {sorted(MOG_PRESETS)}, got {preset!r}.")
        return cls(structure, router, **{**MOG_PRESETS[preset], **overrides})

    def weights(self, query: str) -> np.ndarray:
        """Router weights of the levels for ``query`` (ones when there is no router)."""
        if self.router is None:
            return np.ones(self.structure.n_gra, dtype=np.float64)
        return np.asarray(self.router.predict([query])[0], dtype=np.float64)

    def run(self, query: str, units: list[Unit]) -> list[Unit]:
        return self.retrieve(query, k=self.limit(self.top_k))

    def retrieve(self, query: str, k: int | None = None,
                 weights: Sequence[float] | None = None) -> list[Unit]:
        """The MoG top-``k`` for ``query`` (``weights`` overrides the router's, e.g. a cache)."""
        k = self.top_k if k is None else check_positive_int(k, "k")
        w = self.weights(query) if weights is None else np.asarray(weights, dtype=np.float64)
        if w.shape != (self.structure.n_gra,):
            raise ValueError(f"need {self.structure.n_gra} level weights, got shape {w.shape}.")
        hits = self.index.search(query, k=max(self.k_r, k))
        best: dict[int, np.ndarray] = {}  # finest index -> per-level best normalised score
        for j, units in enumerate(hits):
            if not units:
                continue
            raw = [float(u.score or 0.0) for u in units]  # BM25 hits are always scored
            top = max(raw)
            for u, score in zip(units, raw):
                s = score / top if self.normalize == "max" and top > 0 else score
                for f in self.structure.covers(j + 1, self.index.positions[j][u.id]).tolist():
                    row = best.get(f)
                    if row is None:
                        row = best[f] = np.zeros(self.structure.n_gra)
                    row[j] = max(row[j], s)
        if not best:
            return []
        finest = np.fromiter(best.keys(), dtype=np.int64, count=len(best))
        mixed = np.stack([best[f] for f in finest.tolist()]) @ w
        order = np.lexsort((finest, -mixed))  # best weighted score first; ties: document order
        level = choose_level(w.tolist(), self.level_margin)
        weights_list = [float(x) for x in w]
        out: list[Unit] = []
        seen: set[int] = set()
        for i in order.tolist():
            c = self.structure.container_index(int(finest[i]), level)
            if c in seen:
                continue
            seen.add(c)
            unit = self.structure.levels[level - 1][c].rescored(float(mixed[i]), self.name)
            unit.funnel.update(router_weights=weights_list, chosen_level=level,
                               finest_id=self.structure.finest[int(finest[i])].id)
            out.append(unit)
            if len(out) == k:
                break
        return out


def structure_from_units(units: Sequence[Unit], n_gra: int = 5) -> GranularityStructure:
    """The granularity structure that a splitter's units came from: a
    :class:`~funnel_core.granularity.graph.GranularityGraph` with ``n_gra`` hop ranges when the
    units carry ``funnel["graph_neighbors"]`` (MoGG nodes), else a
    :class:`~funnel_core.granularity.levels.GranularityHierarchy` (every level's units)."""
    from funnel_core.granularity.graph import GranularityGraph
    from funnel_core.granularity.levels import GranularityHierarchy

    units = list(units)
    if any("graph_neighbors" in u.funnel for u in units):
        return GranularityGraph.from_units(units, n_gra=n_gra)
    return GranularityHierarchy.from_units(units)


def check_mog_settings(k_r: int, normalize: str, level_margin: float) -> tuple[int, str, float]:
    """Validate the MoG selection settings; returns them (``level_margin`` as a float)."""
    check_positive_int(k_r, "k_r")
    if normalize not in LEVEL_NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {LEVEL_NORMALIZATIONS}, got {normalize!r}.")
    if isinstance(level_margin, bool) or not isinstance(level_margin, (int, float)) \
            or not 0.0 <= level_margin <= 1.0:
        raise ValueError(f"level_margin must be in [0, 1], got {level_margin!r}.")
    return k_r, normalize, float(level_margin)


def mog_stage(units: Sequence[Unit], router: LevelRouter | None = None, *,
              n_gra: int = 5, bm25: dict[str, Any] | None = None,
              **settings: Any) -> MixOfGranularityRetrieve:
    """The MoG stage over a splitter's ``units`` (what both adapters build): the structure they
    came from (``n_gra`` hop ranges for graph nodes), indexed with ``bm25``, and ``settings``
    (``k_r``, ``top_k``, ``normalize``, ``level_margin``, ``name``) of
    :class:`MixOfGranularityRetrieve`."""
    check_positive_int(n_gra, "n_gra (number of hop ranges)")
    return MixOfGranularityRetrieve(structure_from_units(units, n_gra), router, bm25=bm25,
                                    **settings)


def mog_rebuilt(stage: MixOfGranularityRetrieve, units: Sequence[Unit],
                n_gra: int) -> MixOfGranularityRetrieve:
    """``stage``'s settings over ``units`` with ``n_gra`` hop ranges: an adapter's edit of
    ``n_gra`` (a graph's levels change)."""
    return mog_stage(units, stage.router, n_gra=n_gra, bm25=stage.bm25, top_k=stage.top_k,
                     k_r=stage.k_r, normalize=stage.normalize, level_margin=stage.level_margin,
                     name=stage.name)
