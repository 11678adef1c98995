"""Confidence intervals for simulated means, and a chi-square goodness-of-fit test (docs/design.md §10).

Successive staleness values are correlated (an update's τ depends on the workers in
flight), so intervals use batch means: the sequence is cut into B equal consecutive
batches, whose means are close to independent when a batch is much longer than the
correlation; the interval is the point estimate ± t_{0.975, B−1}·s_B/√B (Law, *Simulation
Modeling and Analysis*, ch. 9). Independent samples (round times) use the plain t-interval.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["Estimate", "batch_means", "iid_mean", "rate_estimate", "GofResult", "chi_square_gof"]

BATCHES = 30


@dataclass(frozen=True)
class Estimate:
    """A measured value and its confidence interval (NaN bounds: too few samples for one).

    Example:
        >>> e = Estimate(1.0, 0.9, 1.1)
        >>> e.contains(1.05), e.contains(1.2), e.interval
        (True, False, [0.9, 1.1])
    """

    value: float
    low: float
    high: float

    def contains(self, x: float | None) -> bool | None:
        """Whether x lies in [low, high]; ``None`` when x or the interval is undefined."""
        if x is None or not (math.isfinite(self.low) and math.isfinite(self.high)):
            return None
        return bool(self.low <= x <= self.high)

    @property
    def interval(self) -> list[float] | None:
        """[low, high], or ``None`` when undefined."""
        return [self.low, self.high] if math.isfinite(self.low) and math.isfinite(self.high) else None

    def shifted(self, by: float) -> Estimate:
        """The same estimate plus a constant (τ → τ + 1)."""
        return Estimate(self.value + by, self.low + by, self.high + by)


def _t(level: float, dof: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.5 + level / 2, dof))


def batch_means(x: np.ndarray, batches: int = BATCHES, level: float = 0.95) -> Estimate:
    """The mean of a correlated sequence with a batch-means interval.

    Args:
        x: (N,) the sequence in simulation order.
        batches: B; fewer when N < 10·B (at least 10 values per batch), none below 2 batches.
        level: the confidence level.

    Returns:
        ``Estimate(mean of all x, low, high)``; NaN bounds when N < 20.

    Example:
        >>> e = batch_means(np.random.default_rng(0).normal(size=30_000))
        >>> bool(e.low < 0 < e.high), round(e.high - e.low, 2)
        (True, 0.03)
    """
    x = np.asarray(x, dtype=np.float64)
    value = float(x.mean()) if len(x) else math.nan
    b = min(batches, len(x) // 10)
    if b < 2:
        return Estimate(value, math.nan, math.nan)
    size = len(x) // b
    means = x[len(x) - b * size:].reshape(b, size).mean(axis=1)  # the first len % b values start no batch
    half = _t(level, b - 1) * float(means.std(ddof=1)) / math.sqrt(b)
    return Estimate(value, value - half, value + half)


def iid_mean(x: np.ndarray, level: float = 0.95) -> Estimate:
    """The mean of independent samples with its t-interval (NaN bounds below 2 samples)."""
    x = np.asarray(x, dtype=np.float64)
    value = float(x.mean()) if len(x) else math.nan
    if len(x) < 2:
        return Estimate(value, math.nan, math.nan)
    half = _t(level, len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return Estimate(value, value - half, value + half)


def rate_estimate(times: np.ndarray, batches: int = BATCHES, level: float = 0.95,
                  start: float = 0.0) -> Estimate:
    """Arrivals per second N / (t_N − start), with the batch-means interval of the mean gap inverted.

    Example:
        >>> rate_estimate(np.arange(1, 101) * 0.5).value
        2.0
    """
    gaps = batch_means(np.diff(np.asarray(times, dtype=np.float64), prepend=start), batches, level)
    inv = [1.0 / v if v > 0 else math.inf for v in (gaps.value, gaps.high, gaps.low)]
    return Estimate(*inv)


@dataclass(frozen=True)
class GofResult:
    """A chi-square goodness-of-fit test.

    Attributes:
        statistic: Σ (O − E)² / E over the bins.
        dof: bins − 1.
        p_value: P(χ²_dof ≥ statistic).
        observed, expected: (bins,) counts; the last bin holds every value ≥ its start.
    """

    statistic: float
    dof: int
    p_value: float
    observed: np.ndarray
    expected: np.ndarray


def chi_square_gof(values: np.ndarray, pmf: Callable[[np.ndarray], np.ndarray],
                   min_expected: float = 5.0) -> GofResult:
    """Test integer samples against a pmf on 0, 1, 2, …; bins 0..L−1 each expect ≥ ``min_expected``
    counts and the last bin, "≥ L", takes the rest of the mass (Cochran's rule).

    Args:
        values: (N,) non-negative ints, assumed independent.
        pmf: maps an int array k to P(X = k).

    Example:
        >>> x = np.random.default_rng(0).geometric(0.25, 20_000) - 1
        >>> r = chi_square_gof(x, lambda k: 0.25 * 0.75**k)
        >>> r.p_value > 0.01, r.dof > 10
        (True, True)
    """
    from scipy import stats

    values = np.asarray(values, dtype=np.int64)
    n = len(values)
    probs = np.asarray(pmf(np.arange(int(values.max()) + 2)), dtype=np.float64)
    small = np.flatnonzero(n * probs < min_expected)
    keep = int(small[0]) if len(small) else len(probs) - 1  # bins before the first one below the rule
    while keep > 1 and n * (1.0 - probs[:keep].sum()) < min_expected:
        keep -= 1
    expected = np.append(n * probs[:keep], n * (1.0 - probs[:keep].sum()))
    counts = np.bincount(values, minlength=keep + 1)
    observed = np.append(counts[:keep], counts[keep:].sum()).astype(np.float64)
    stat, p = stats.chisquare(observed, expected)
    return GofResult(float(stat), len(observed) - 1, float(p), observed, expected)
