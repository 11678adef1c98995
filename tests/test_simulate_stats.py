"""Statistics over seeds, checked against scipy.stats and by hand (naig.simulate.stats)."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from naig.simulate.stats import (
    ORACLES,
    best_baseline,
    best_by_validation,
    paired,
    summarize,
    t_interval,
    time_to_loss,
)

NAN, INF = math.nan, math.inf
A = [2.7226, 2.8355, 2.9617, 2.6010, 2.9912]  # a fixed set of numbers (5 seeds)
B = [3.5545, 3.1020, 3.9004, 3.2217, 3.0126]


def test_summary_against_scipy() -> None:
    s = summarize(A)
    x = np.array(A)
    assert s.n == 5 and s.diverged == 0
    assert s.mean == pytest.approx(x.mean(), rel=1e-15)
    assert s.std == pytest.approx(x.std(ddof=1), rel=1e-15)
    lo, hi = sps.t.interval(0.95, 4, loc=x.mean(), scale=sps.sem(x))
    assert s.ci95 == pytest.approx((lo, hi), rel=1e-12)
    assert s.median == pytest.approx(2.8355, rel=1e-15)


def test_summary_by_hand() -> None:
    s = summarize([1.0, 2.0, 3.0, 6.0])  # mean 3, s² = (4 + 1 + 0 + 9)/3, t_{0.975, 3} = 3.182446305
    half = 3.182446305284263 * math.sqrt(14 / 3) / 2
    assert (s.mean, s.std) == pytest.approx((3.0, math.sqrt(14 / 3)), rel=1e-15)
    assert s.ci95 == pytest.approx((3 - half, 3 + half), rel=1e-12)
    assert s.median == 2.5
    assert t_interval([5.0, 5.0, 5.0]) == (5.0, 5.0)


def test_a_diverged_seed_makes_the_mean_undefined_and_counts_as_infinity_in_the_median() -> None:
    s = summarize([2.0, NAN, 3.0, INF])
    assert math.isnan(s.mean) and math.isnan(s.std) and all(math.isnan(c) for c in s.ci95)
    assert s.diverged == 2 and s.median == INF  # (2, 3, ∞, ∞): middle pair (3, ∞)
    assert summarize([2.0, NAN, 3.0]).median == 3.0  # (2, 3, ∞)
    one = summarize([2.5])
    assert one.mean == 2.5 and math.isnan(one.std) and math.isnan(one.ci95[0])
    d = summarize([1.0, NAN]).to_dict()
    assert set(d) == {"n", "mean", "std", "ci95", "median", "diverged"} and len(d["ci95"]) == 2
    assert (d["n"], d["median"], d["diverged"]) == (2, INF, 1) and math.isnan(d["mean"])


def test_paired_against_scipy() -> None:
    p = paired(A, B, "hogwild")
    d = np.array(A) - np.array(B)
    ref = sps.ttest_rel(A, B)
    assert p.n == 5 and p.dropped == 0 and p.baseline == "hogwild"
    assert p.diff == pytest.approx(d.mean(), rel=1e-14)
    assert p.p_value == pytest.approx(ref.pvalue, rel=1e-12)
    assert p.p_value == pytest.approx(sps.ttest_1samp(d, 0.0).pvalue, rel=1e-12)
    assert p.ci95 == pytest.approx(tuple(ref.confidence_interval(0.95)), rel=1e-12)
    assert p.diff_pct == pytest.approx(100 * d.mean() / np.mean(B), rel=1e-14)
    assert p.to_dict()["ci95"] == list(p.ci95) and set(p.to_dict()) >= {"diff", "ci95", "p_value"}


def test_paired_by_hand() -> None:
    p = paired([2.0, 3.0, 4.5], [2.5, 3.0, 5.0])  # d = (−.5, 0, −.5): mean −1/3, s = √(1/12), t = −2
    assert p.diff == pytest.approx(-1 / 3, rel=1e-15)
    assert p.p_value == pytest.approx(2 * sps.t.sf(2.0, 2), rel=1e-12)  # = 1 − 2/√6 for 2 df
    assert p.p_value == pytest.approx(1 - 2 / math.sqrt(6), rel=1e-12)
    t975 = 0.95 / math.sqrt(2 * 0.975 * 0.025)  # t quantile with 2 df in closed form: (2p − 1)/√(2p(1 − p))
    half = t975 * math.sqrt(1 / 12) / math.sqrt(3)
    assert p.ci95 == pytest.approx((-1 / 3 - half, -1 / 3 + half), rel=1e-12)


def test_paired_drops_diverged_seeds_and_counts_them() -> None:
    p = paired([2.0, NAN, 3.0, 4.5, 1.0], [2.5, 3.0, INF, 5.0, 1.5])
    assert p.n == 3 and p.dropped == 2
    assert p.diff == pytest.approx(-0.5) and p.ci95 == pytest.approx((-0.5, -0.5))
    assert p.p_value == 0.0  # equal non-zero differences: t = −∞
    none = paired([NAN], [1.0])
    assert none.n == 0 and math.isnan(none.diff) and math.isnan(none.p_value) and none.dropped == 1
    same = paired([1.0, 2.0], [1.0, 2.0])
    assert same.diff == 0.0 and math.isnan(same.p_value)
    with pytest.raises(ValueError, match="one value per seed"):
        paired([1.0, 2.0], [1.0])


def test_best_baseline_skips_oracles_and_methods_and_prefers_fewer_divergences() -> None:
    val = {"sync": [2.0, 2.1], "fresh-only": [2.2, 2.3], "naig": [2.4, 2.4], "hogwild": [3.0, 3.2],
           "staleness": [2.9, NAN], "median": [3.1, 3.2]}
    assert best_baseline(val, "lockstep") == "hogwild"  # 3.1 < 3.15; staleness diverged once
    assert best_baseline(val, "lockstep", exclude=set()) == "naig"
    assert best_baseline({"sync": [2.0], "hogwild": [3.0]}, "arrivals") == "sync"  # sync pays its round time
    assert ORACLES["lockstep"] == {"sync", "fresh-only"}
    assert best_baseline({"sync": [1.0]}, "lockstep") is None
    assert best_by_validation({"a": [1.0, 2.0], "b": [2.0, 1.0]}) == "a"  # tie: the first
    assert best_by_validation({"a": [NAN], "b": [INF, 5.0]}) == "b"


def test_time_to_loss_interpolates_linearly() -> None:
    assert time_to_loss([0, 10, 20], [5.0, 3.0, 2.0], 2.5) == 15.0
    assert time_to_loss([0, 10, 20], [5.0, 3.0, 2.0], 3.0) == 10.0
    assert time_to_loss([0.0, 1.5], [2.0, 1.0], 4.0) == 0.0
    assert time_to_loss([0, 10, 20], [5.0, 3.0, NAN], 2.5) == INF
    assert time_to_loss([0, 10], [5.0, 3.0], NAN) == INF
