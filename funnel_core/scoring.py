"""Score helpers shared by every stage: pure functions, no model, no framework.

* :func:`sigmoid` — numerically safe logistic function;
* :func:`minmax` / :func:`normalize_scores` — normalisation of one list of scores, with one tie
  rule everywhere: when every score is equal (max - min <= 1e-12), min-max gives ``1.0`` to
  every candidate (they are all the best), z-score gives ``0.0``;
* :func:`rank_by_scores` — the order of candidates by score: best first, ties kept in input
  order (a stable sort), then an optional threshold and cut-off.
"""

from __future__ import annotations

import math
from typing import Sequence

__all__ = ["sigmoid", "minmax", "normalize_scores", "rank_by_scores", "check_finite_scores",
           "NORMALIZATIONS", "TIE_EPS"]

NORMALIZATIONS = ("minmax", "zscore", "none")
#: Spreads at or below this count as "all scores equal".
TIE_EPS = 1e-12


def sigmoid(x: float) -> float:
    """Numerically safe logistic function."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def minmax(values: Sequence[float]) -> list[float]:
    """Scale values to [0, 1]; all equal -> all ``1.0`` (the one tie rule)."""
    vals = [float(v) for v in values]
    if not vals:
        return []
    lo, hi = min(vals), max(vals)
    if hi - lo <= TIE_EPS:
        return [1.0] * len(vals)
    return [(v - lo) / (hi - lo) for v in vals]


def normalize_scores(scores: Sequence[float], method: str = "minmax") -> list[float]:
    """Normalise one list of scores: ``"minmax"`` (see :func:`minmax`), ``"zscore"`` (all
    equal -> all ``0.0``) or ``"none"``. Returns Python floats in input order.

    Raises ``ValueError`` for an unknown method or a non-finite score.
    """
    if method not in NORMALIZATIONS:
        raise ValueError(f"unknown normalization {method!r}; choose one of {NORMALIZATIONS}.")
    vals = [float(s) for s in scores]
    if not vals or method == "none":
        return vals
    if not all(math.isfinite(v) for v in vals):
        raise ValueError("scores must be finite numbers to be normalised; got NaN or inf.")
    if method == "minmax":
        return minmax(vals)
    mean = math.fsum(vals) / len(vals)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / len(vals))
    if std <= TIE_EPS:
        return [0.0] * len(vals)
    return [(v - mean) / std for v in vals]


def check_finite_scores(scores: Sequence[float], who: str = "scores",
                        ids: Sequence[object] | None = None, fix: str = "") -> list[float]:
    """``scores`` as Python floats, or ``ValueError`` naming how many are NaN/infinite, the first
    few positions (or ``ids``) and ``fix``: a NaN compares false with everything, so ranking
    it would put it anywhere (``sorted`` keeps it where it was), never where it belongs."""
    vals = [float(s) for s in scores]
    bad = [i for i, v in enumerate(vals) if not math.isfinite(v)]
    if bad:
        where = [ids[i] for i in bad[:5]] if ids is not None else bad[:5]
        label = "ids" if ids is not None else "positions"
        more = ", ..." if len(bad) > 5 else ""
        raise ValueError(
            f"{who} returned {len(bad)} non-finite score(s) of {len(vals)} ({label} "
            f"{', '.join(map(repr, where))}{more}: {[vals[i] for i in bad[:5]]}); a NaN cannot be "
            f"ranked. {fix or 'Check the model or the inputs that produced them.'}")
    return vals


def rank_by_scores(scores: Sequence[float], top_n: int | None = None,
                   threshold: float | None = None) -> list[int]:
    """Indices of ``scores``, best first; equal scores keep their input order. Scores below
    ``threshold`` are dropped, then at most ``top_n`` indices are kept. A NaN score raises
    ``ValueError`` (see :func:`check_finite_scores`); ``-inf``/``inf`` are ordered as numbers."""
    nan = [i for i, s in enumerate(scores) if math.isnan(float(s))]
    if nan:
        raise ValueError(f"cannot rank NaN scores (positions {nan[:5]}); drop or fix them first.")
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))
    if threshold is not None:
        order = [i for i in order if float(scores[i]) >= threshold]
    return order[:top_n] if top_n is not None else order
