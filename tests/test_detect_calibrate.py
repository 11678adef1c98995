"""naig.detect.calibrate: the empirical threshold, AUC and the intervals against scipy."""

import math

import numpy as np
import pytest
from scipy import stats

from naig.detect.calibrate import auc, clopper_pearson, rate_interval, threshold


@pytest.mark.parametrize("alpha", [0.001, 0.01, 0.05])
def test_threshold_leaves_at_most_floor_alpha_n_clean_values_above(alpha: float) -> None:
    x = np.random.default_rng(0).standard_normal(5000)
    t = threshold(x, alpha)
    assert int((x > t).sum()) == math.floor(alpha * 5000)
    assert t in x


def test_threshold_with_infinities_and_ties() -> None:
    x = np.array([np.inf] + [1.0] * 99)
    assert threshold(x, 0.01) == 1.0  # one value above, the tie is not flagged


def test_threshold_refuses_too_few_samples() -> None:
    with pytest.raises(ValueError):
        threshold(np.arange(10.0), 0.05)


def test_auc_equals_mann_whitney_u() -> None:
    rng = np.random.default_rng(1)
    pos, neg = np.round(rng.normal(1, 1, 40), 1), np.round(rng.normal(0, 1, 70), 1)  # with ties
    u = stats.mannwhitneyu(pos, neg).statistic
    assert auc(pos, neg) == pytest.approx(u / (40 * 70), rel=1e-12)
    assert auc(np.array([np.inf]), np.array([np.inf, 0.0])) == 0.75
    assert math.isnan(auc(np.array([]), neg))


def test_rate_interval_is_the_t_interval_clipped_to_0_1() -> None:
    v = np.array([0.2, 0.4, 0.35, 0.5])
    mean, low, high = rate_interval(v)
    lo, hi = stats.t.interval(0.95, 3, loc=v.mean(), scale=stats.sem(v))
    assert (mean, low, high) == pytest.approx((v.mean(), lo, hi), rel=1e-12)
    assert rate_interval(np.array([0.9, 1.0, 1.0]))[2] == 1.0
    assert math.isnan(rate_interval(np.array([0.5]))[1])


def test_clopper_pearson_contains_the_rate() -> None:
    rate, low, high = clopper_pearson(3, 1000)
    assert rate == 0.003 and low < 0.003 < high
    assert clopper_pearson(0, 100)[1] == 0.0
