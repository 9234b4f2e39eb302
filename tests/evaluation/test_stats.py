"""funnel_core.evaluation.stats: the exact McNemar test, bootstrap intervals and the paired
bootstrap. Expected values are computed by hand from the definitions, not from the code."""

from __future__ import annotations

import re

import pytest

from funnel_core.evaluation.stats import bootstrap_ci, mcnemar_exact, paired_bootstrap


def test_mcnemar_exact_matches_the_binomial_tail():
    # a answers q0-q4 alone, b answers q5 alone, both answer q6, neither q7:
    # n = 6 discordant, k = 1 -> p = 2 * (C(6,0) + C(6,1)) / 2^6 = 2 * 7 / 64 = 0.21875
    a = [1, 1, 1, 1, 1, 0, 1, 0]
    b = [0, 0, 0, 0, 0, 1, 1, 0]
    r = mcnemar_exact(a, b)
    assert (r["a_only"], r["b_only"]) == (5, 1)
    assert r["p_value"] == pytest.approx(0.21875)
    # 10 vs 0 discordant: p = 2 / 1024
    r = mcnemar_exact([1] * 10 + [0] * 5, [0] * 10 + [0] * 5)
    assert r["p_value"] == pytest.approx(2 / 1024)
    # symmetric: swapping the systems swaps the counts, not the p-value
    r2 = mcnemar_exact(b, a)
    assert (r2["a_only"], r2["b_only"]) == (1, 5) and r2["p_value"] == pytest.approx(0.21875)
    # no discordant question: p = 1 (capped)
    assert mcnemar_exact([1, 0], [1, 0])["p_value"] == 1.0


def test_bootstrap_interval_of_a_proportion():
    assert bootstrap_ci([1.0] * 50) == (1.0, 1.0)
    # 400 questions, half answered: normal approximation 0.5 +- 1.96 * sqrt(0.25 / 400) = 0.5 +- 0.049
    lo, hi = bootstrap_ci([1, 0] * 200, n_boot=4000, seed=1)
    assert lo == pytest.approx(0.451, abs=0.012) and hi == pytest.approx(0.549, abs=0.012)
    assert bootstrap_ci([1, 0] * 200, seed=3) == bootstrap_ci([1, 0] * 200, seed=3)  # seeded


def test_paired_bootstrap_difference_and_interval():
    a = [1, 1, 0, 0] * 50
    b = [0, 1, 0, 1] * 50
    r = paired_bootstrap(a, b)
    assert r["difference"] == pytest.approx(0.0)
    assert r["ci"][0] < 0 < r["ci"][1]
    r = paired_bootstrap([1] * 100, [0] * 100)
    assert r["difference"] == 1.0 and r["ci"] == [1.0, 1.0] and r["share_of_resamples_le_0"] == 0.0
    with pytest.raises(ValueError, match="same questions"):
        paired_bootstrap([1, 0], [1])


@pytest.mark.parametrize("n_boot", [0, -1, -2000, 2.5, True, "100", None])
def test_bootstrap_refuses_a_resample_count_that_is_not_a_positive_int(n_boot):
    """n_boot = 0 used to fail inside numpy (an IndexError on an empty quantile), a negative one
    with 'negative dimensions'; the error now names the value and the fix."""
    with pytest.raises(ValueError, match=rf"n_boot must be an integer >= 1.*{re.escape(repr(n_boot))}"):
        bootstrap_ci([1.0, 0.0, 1.0], n_boot=n_boot)
    with pytest.raises(ValueError, match=rf"n_boot must be an integer >= 1.*{re.escape(repr(n_boot))}"):
        paired_bootstrap([1.0, 0.0, 1.0], [0.0, 0.0, 1.0], n_boot=n_boot)
