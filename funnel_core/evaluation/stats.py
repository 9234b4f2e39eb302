"""Statistics of the evaluation harness: bootstrap intervals, paired bootstrap and the exact McNemar
test on paired 0/1 outcomes, percentiles."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def _check_n_boot(n_boot: object) -> int:
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 1:
        raise ValueError(f"n_boot must be an integer >= 1 (the number of bootstrap resamples, e.g. "
                         f"2000), got {n_boot!r}.")
    return int(n_boot)


def bootstrap_ci(hits: Sequence[float], n_boot: int = 2000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``hits`` (questions resampled with replacement)."""
    n_boot = _check_n_boot(n_boot)
    x = np.asarray(hits, dtype=np.float64)
    if len(x) == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return (float(lo), float(hi))


def paired_bootstrap(a: Sequence[float], b: Sequence[float], n_boot: int = 2000, seed: int = 0,
                     level: float = 0.95) -> dict:
    """Mean difference ``mean(a) - mean(b)`` over the same questions, with a paired bootstrap
    interval (the same resampled questions for both systems) and the share of resamples <= 0."""
    n_boot = _check_n_boot(n_boot)
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"paired samples need the same questions; got {x.shape} and {y.shape}.")
    d = x - y
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return {"difference": float(d.mean()), "ci": [float(lo), float(hi)],
            "share_of_resamples_le_0": float((means <= 0).mean())}


def mcnemar_exact(a: Sequence[float], b: Sequence[float]) -> dict:
    """Exact (binomial) McNemar test on paired 0/1 outcomes.

    ``a_only`` = questions system a answers and b does not, ``b_only`` the reverse. Under the null
    each discordant question is a fair coin, so the two-sided p-value is
    ``min(1, 2 * P(Binomial(n, 1/2) <= min(a_only, b_only)))`` with ``n = a_only + b_only``.
    """
    x, y = np.asarray(a) > 0, np.asarray(b) > 0
    if x.shape != y.shape:
        raise ValueError(f"paired samples need the same questions; got {x.shape} and {y.shape}.")
    a_only, b_only = int((x & ~y).sum()), int((~x & y).sum())
    n = a_only + b_only
    k = min(a_only, b_only)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n if n else 1.0
    return {"a_only": a_only, "b_only": b_only, "p_value": float(min(1.0, 2 * tail))}


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation (numpy's default)."""
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else float("nan")
