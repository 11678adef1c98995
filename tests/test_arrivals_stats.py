"""Batch-means intervals and the chi-square goodness-of-fit helper (docs/design.md §10)."""

import math

import numpy as np
import pytest
from scipy import stats

from naig.arrivals import Estimate, batch_means, chi_square_gof, iid_mean, rate_estimate


def test_batch_means_on_independent_data_matches_the_t_interval_width() -> None:
    x = np.random.default_rng(0).normal(3.0, 2.0, 60_000)
    e = batch_means(x)
    assert e.value == pytest.approx(x.mean()) and e.contains(3.0)
    t_width = 2 * stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    assert 0.6 < (e.high - e.low) / t_width < 1.5


def test_batch_means_widens_for_correlated_data() -> None:
    """An AR(1) sequence (ρ = 0.9): the plain t-interval is ~√19 too narrow, batch means is not."""
    rng = np.random.default_rng(1)
    z, x = rng.normal(size=90_000), np.zeros(90_000)
    for t in range(1, len(x)):
        x[t] = 0.9 * x[t - 1] + z[t]
    bm, naive = batch_means(x), iid_mean(x)
    assert (bm.high - bm.low) / (naive.high - naive.low) > 3


def test_too_few_values_give_no_interval() -> None:
    e = batch_means(np.arange(15.0))
    assert e.value == 7.0 and e.interval is None and e.contains(7.0) is None
    assert iid_mean(np.array([1.0])).interval is None


def test_iid_mean_is_the_t_interval() -> None:
    x = np.array([1.0, 2.0, 4.0, 7.0])
    lo, hi = stats.t.interval(0.95, 3, loc=x.mean(), scale=stats.sem(x))
    assert iid_mean(x).interval == pytest.approx([lo, hi])


def test_rate_inverts_the_mean_gap() -> None:
    times = np.cumsum(np.random.default_rng(2).exponential(0.25, 50_000))
    r = rate_estimate(times)
    assert r.value == pytest.approx(len(times) / times[-1]) and r.low < r.value < r.high and r.contains(4.0)
    assert rate_estimate(np.array([11.0, 12.0]), start=10.0).value == 1.0


def test_estimate_helpers() -> None:
    e = Estimate(1.0, 0.5, 1.5).shifted(1)
    assert (e.value, e.low, e.high) == (2.0, 1.5, 2.5) and e.contains(None) is None


def test_chi_square_accepts_the_true_pmf_and_rejects_a_near_one() -> None:
    x = np.random.default_rng(3).geometric(0.2, 50_000) - 1
    good = chi_square_gof(x, lambda k: 0.2 * 0.8**k)
    bad = chi_square_gof(x, lambda k: 0.21 * 0.79**k)
    assert good.p_value > 0.01 and bad.p_value < 1e-6
    assert good.observed.sum() == len(x) and good.expected.sum() == pytest.approx(len(x))
    assert good.expected.min() >= 5 and good.dof == len(good.observed) - 1
