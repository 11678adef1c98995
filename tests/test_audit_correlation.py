"""Rank correlation of energy with lag: checked against scipy.stats and a brute-force permutation test."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from naig.audit.correlation import lag_correlation, spearman_permutation


def _brute_force(x, y):
    """Two-sided exact p-value over every pairing, scipy's convention: 2 × the smaller tail."""
    r0 = stats.spearmanr(x, y).statistic
    rs = np.array([stats.spearmanr(x, [y[i] for i in perm]).statistic
                   for perm in itertools.permutations(range(len(y)))])
    eps = 1e-12
    return r0, min(1.0, 2 * min(np.mean(rs >= r0 - eps), np.mean(rs <= r0 + eps)))


@pytest.mark.parametrize(("x", "y"), [
    ([0, 10, 20, 35], [0.11, 7.22, 2.5, 3.0]),
    ([0, 10, 20, 35, 50], [5.0, 4.0, 3.0, 2.5, 0.1]),
    ([0, 5, 5, 10, 20, 40], [1.0, 2.0, 2.0, 0.5, 9.0, 3.0]),  # ties: average ranks
])
def test_exact_matches_spearmanr_and_brute_force(x, y):
    r, p = spearman_permutation(x, y)
    want_r, want_p = _brute_force(x, y)
    assert r == pytest.approx(want_r, abs=1e-12)
    assert p == pytest.approx(want_p, abs=1e-12)


def test_monte_carlo_is_seeded_and_close_to_the_asymptotic_value():
    rng = np.random.default_rng(5)
    x = np.arange(12)
    y = x + rng.normal(scale=4.0, size=12)
    a, b = spearman_permutation(x, y, seed=1), spearman_permutation(x, y, seed=1)
    assert a == b and a != spearman_permutation(x, y, seed=2)
    assert a[0] == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
    assert a[1] == pytest.approx(stats.spearmanr(x, y).pvalue, abs=0.03)  # 9999 draws: ±0.01


def test_undefined_cases_are_none():
    assert spearman_permutation([1, 2], [3, 4]) is None
    assert spearman_permutation([1, 1, 1], [3, 4, 5]) is None
    assert lag_correlation([0, 0, 0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) is None  # one lag: nothing to rank
    assert lag_correlation([0, None, "x", 3], [1.0, 2.0, 3.0, 4.0], [1.0] * 4) is None  # 2 usable files
    doc = lag_correlation([0, 1, 2, 3], [0.0, 0.0, 0.0, math.nan], [1.0, 2.0, 4.0, 8.0])
    assert doc["files"] == 3 and doc["energy"] == {"spearman": None, "p_value": None}
    assert doc["delta_norm"]["spearman"] == 1.0 and doc["exact"] is True
