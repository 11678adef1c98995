"""Thresholds at a false-alarm rate, and the statistics of the report with their 95% intervals.

**Threshold.** For each detector, the clean scores of every rank at every scored step of the
calibration seeds (N values) are sorted in decreasing order v_0 ≥ v_1 ≥ …; the threshold is
v_⌊αN⌋, so that at most ⌊αN⌋ clean calibration values lie strictly above it (a rank is
flagged when its score is *strictly* above the threshold). This is the empirical (1 − α)
quantile; it needs αN ≥ 1 (``DetectConfig`` refuses fewer samples) and is coarse when αN is
small: at α = 10⁻³ and N = 1,280 it is the second largest clean value.

**Rates over seeds.** Detection rate (the faulty rank's score above the threshold), top-1
localisation (the faulty rank's score strictly above every other rank's) and AUC (the
probability that the faulty rank's score exceeds a clean rank-step's score of the same seed,
ties counting ½: the Mann–Whitney statistic) are computed per seed; the figure is their mean
over seeds and its 95% interval is Student's t over seeds, mean ± t₀.₉₇₅,ₙ₋₁ · sd/√n, clipped
to [0, 1] (NaN for one seed).

**Observed false alarms** on clean test steps: flagged clean rank-steps / all of them, with
the Clopper–Pearson 95% interval (rank-steps taken as independent; they are not quite: the
relative scores of one step share their references).

Example:
    >>> import numpy as np
    >>> threshold(np.arange(1000.0), 0.01)   # 10 values above 989
    989.0
    >>> auc(np.array([3.0, 4.0]), np.array([1.0, 3.0]))
    0.875
"""

from __future__ import annotations

import math

import numpy as np

from naig.simulate.stats import t_interval

__all__ = ["threshold", "auc", "rate_interval", "clopper_pearson", "Interval"]

Interval = tuple[float, float, float]  # mean (or rate), low, high


def threshold(clean: np.ndarray, alpha: float) -> float:
    """The empirical (1 − α) quantile of clean scores (see the module): v_⌊αN⌋ of the sorted values.

    Args:
        clean: (N,) float64 scores (±inf allowed, no NaN).
        alpha: the false-alarm rate per rank-step, with αN ≥ 1.

    Raises:
        ValueError: for αN < 1 or NaN scores.
    """
    v = np.sort(np.asarray(clean, dtype=np.float64).ravel())[::-1]
    k = math.floor(alpha * len(v))
    if k < 1 or np.isnan(v).any():
        raise ValueError(f"needs alpha * N >= 1 finite-or-inf scores (N = {len(v)}, alpha = {alpha})")
    return float(v[k])


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(pos > neg) + ½ P(pos = neg) over all pairs (the Mann–Whitney AUC); NaN if either is empty."""
    p, n = np.sort(np.asarray(pos, float).ravel()), np.sort(np.asarray(neg, float).ravel())
    if not len(p) or not len(n):
        return math.nan
    below = np.searchsorted(n, p, side="left")  # negatives strictly below each positive
    ties = np.searchsorted(n, p, side="right") - below
    return float((below + 0.5 * ties).sum() / (len(p) * len(n)))


def rate_interval(values: np.ndarray) -> Interval:
    """(mean, low, high) of a rate over seeds: ``naig.simulate.stats.t_interval`` (Student's t, 95%)
    of its finite values, clipped to [0, 1] (NaN bounds below 2 values, all NaN for none)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if not len(v):
        return math.nan, math.nan, math.nan
    low, high = t_interval(v)
    mean = float(v.mean())
    return (mean, math.nan, math.nan) if math.isnan(low) else (mean, max(0.0, low), min(1.0, high))


def clopper_pearson(flagged: int, total: int) -> Interval:
    """(rate, low, high): the exact binomial 95% interval of flagged / total."""
    from scipy import stats

    if total <= 0:
        return math.nan, math.nan, math.nan
    ci = stats.binomtest(int(flagged), int(total)).proportion_ci(0.95, method="exact")
    return flagged / total, float(ci.low), float(ci.high)
