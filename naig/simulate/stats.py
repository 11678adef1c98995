"""Statistics over seeds for the simulate tables and JSON (docs/design.md §12).

- Per strategy (``summarize``): mean, sample standard deviation and 95% t-interval
  mean ± t_{0.975, n−1} · s/√n over the seeds. A diverged seed (a non-finite value)
  makes the mean undefined (NaN); the median, with diverged seeds counted as +∞, and
  the divergence count are reported instead.
- Against a baseline (``paired``): the per-seed differences d_i = x_i − b_i over the
  seeds where neither diverged (the others are dropped and counted), their mean with a
  95% t-interval, and the two-sided paired t-test p-value (``scipy.stats.ttest_rel``).
- Choosing (``best_by_validation``, ``best_baseline``): fewest diverged seeds first, then
  the lowest mean validation loss over the others; oracles (``ORACLES``: ``sync`` in
  lockstep, ``fresh-only``) are never a "best baseline".
- ``time_to_loss``: when a curve first reaches a loss L, by linear interpolation.

Example:
    >>> s = summarize([2.0, 3.0, 4.0])
    >>> s.mean, s.std, [round(x, 4) for x in s.ci95]
    (3.0, 1.0, [0.5159, 5.4841])
    >>> summarize([2.0, float("nan"), 4.0]).to_dict()["median"]
    4.0
    >>> p = paired([2.0, 3.0, 4.5], [2.5, 3.0, 5.0])
    >>> p.n, p.diff, round(p.p_value, 4)
    (3, -0.3333333333333333, 0.1835)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

__all__ = [
    "CONFIDENCE",
    "ORACLES",
    "METHODS",
    "SeedSummary",
    "PairedDifference",
    "summarize",
    "t_interval",
    "paired",
    "best_by_validation",
    "best_baseline",
    "time_to_loss",
]

CONFIDENCE = 0.95
ORACLES = {"lockstep": frozenset({"sync", "fresh-only"}), "arrivals": frozenset({"fresh-only"})}
# NAIG, its ablations and NAIG on pseudo-gradients: the rules under test, never the "best baseline"
METHODS = frozenset({"naig", "naig-exact", "naig-blind", "diloco-naig", "diloco-naig-exact"})
Key = TypeVar("Key", bound=Hashable)


@dataclass(frozen=True)
class SeedSummary:
    """One strategy's values over seeds (e.g. final validation loss).

    Attributes:
        n: number of seeds.
        mean: mean over seeds; NaN when any seed diverged.
        std: sample standard deviation (n − 1); NaN for one seed or when any seed diverged.
        ci95: 95% t-interval of the mean (lo, hi); NaN where ``std`` is.
        median: median over seeds with diverged seeds as +∞.
        diverged: number of seeds whose value is not finite.
    """

    n: int
    mean: float
    std: float
    ci95: tuple[float, float]
    median: float
    diverged: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (NaN/Inf left for the writer to map to null)."""
        return dict(n=self.n, mean=self.mean, std=self.std, ci95=list(self.ci95), median=self.median,
                    diverged=self.diverged)


@dataclass(frozen=True)
class PairedDifference:
    """A strategy against a baseline, seed by seed: d_i = x_i − b_i (negative: lower than baseline).

    Attributes:
        n: seeds compared (both finite).
        diff: mean of d_i (NaN when n = 0).
        diff_pct: 100 · diff / mean of b_i over the same seeds.
        ci95: 95% t-interval of the mean difference; NaN for n < 2.
        p_value: two-sided paired t-test p-value (``scipy.stats.ttest_rel``); NaN for n < 2
            or when every d_i is 0; 0 when the d_i are equal and non-zero.
        dropped: seeds left out because either run diverged.
        baseline: the baseline's name, when the caller gives it.
    """

    n: int
    diff: float
    diff_pct: float
    ci95: tuple[float, float]
    p_value: float
    dropped: int
    baseline: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``diff``, ``ci95``, ``p_value`` and the rest (NaN left for the writer)."""
        return dict(baseline=self.baseline, n=self.n, diff=self.diff, diff_pct=self.diff_pct,
                    ci95=list(self.ci95), p_value=self.p_value, dropped=self.dropped)


def _floats(values: Sequence[float]) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).reshape(-1)


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """mean ± t_{(1+c)/2, n−1} · s/√n of ``values`` (finite); (NaN, NaN) for fewer than 2.

    Example:
        >>> [round(x, 4) for x in t_interval([1.0, 2.0, 3.0, 6.0])]
        [-0.4374, 6.4374]
    """
    x = _floats(values)
    if x.size < 2:
        return (math.nan, math.nan)
    from scipy import stats as sps  # at first use: importing naig.simulate loads no scipy

    half = float(sps.t.ppf((1 + confidence) / 2, x.size - 1)) * float(np.std(x, ddof=1)) / math.sqrt(x.size)
    mean = float(np.mean(x))
    return (mean - half, mean + half)


def summarize(values: Sequence[float]) -> SeedSummary:
    """Mean, sample std, 95% t-interval, median and divergence count over seeds.

    Args:
        values: one value per seed; a non-finite value (NaN/Inf) marks a diverged seed.

    Returns:
        A ``SeedSummary`` (mean, std and interval NaN when any seed diverged).
    """
    x = _floats(values)
    finite = np.isfinite(x)
    diverged = int((~finite).sum())
    median = float(np.median(np.where(finite, x, math.inf))) if x.size else math.nan
    if diverged or not x.size:
        return SeedSummary(int(x.size), math.nan, math.nan, (math.nan, math.nan), median, diverged)
    std = float(np.std(x, ddof=1)) if x.size > 1 else math.nan
    return SeedSummary(int(x.size), float(np.mean(x)), std, t_interval(x), median, 0)


def paired(values: Sequence[float], baseline: Sequence[float], name: str | None = None) -> PairedDifference:
    """The paired per-seed difference ``values − baseline`` with its interval and t-test.

    Args:
        values: the strategy's value per seed.
        baseline: the baseline's value for the same seeds, in the same order.
        name: the baseline's name (recorded in the result).

    Returns:
        A ``PairedDifference`` over the seeds where both values are finite.

    Raises:
        ValueError: if the two sequences differ in length.
    """
    x, b = _floats(values), _floats(baseline)
    if x.shape != b.shape:
        raise ValueError(f"paired needs one value per seed on both sides, got {x.size} and {b.size}")
    keep = np.isfinite(x) & np.isfinite(b)
    x, b = x[keep], b[keep]
    n = int(x.size)
    diff = float(np.mean(x - b)) if n else math.nan
    ref = float(np.mean(b)) if n else math.nan
    pct = 100 * diff / ref if n and ref != 0 else math.nan
    p = math.nan
    if n >= 2:
        with warnings.catch_warnings():  # scipy warns on (near-)constant differences; the result stands
            warnings.simplefilter("ignore", RuntimeWarning)
            from scipy import stats as sps

            p = float(sps.ttest_rel(x, b).pvalue)
    return PairedDifference(n, diff, pct, t_interval(x - b), p, int((~keep).sum()), name)


def best_by_validation(candidates: Mapping[Key, Sequence[float]]) -> Key | None:
    """The candidate with the fewest diverged seeds, then the lowest mean of the others.

    Used to choose a baseline or a learning rate on validation losses; ties go to the
    first in ``candidates``' order; None when there are no candidates.

    Example:
        >>> best_by_validation({1e-3: [3.0, 3.2], 3e-3: [2.9, float("nan")], 1e-2: [3.1, 3.0]})
        0.01
    """
    def key(item: tuple[Key, Sequence[float]]) -> tuple[int, float]:
        x = _floats(item[1])
        finite = np.isfinite(x)
        return int((~finite).sum()), float(np.mean(x[finite])) if finite.any() else math.inf

    ranked = sorted(candidates.items(), key=key)  # sorted() is stable: ties keep the given order
    return ranked[0][0] if ranked else None


def best_baseline(val_losses: Mapping[str, Sequence[float]], mode: str,
                  exclude: frozenset[str] | set[str] = METHODS) -> str | None:
    """The best non-oracle baseline on validation losses.

    Args:
        val_losses: strategy → validation loss per seed.
        mode: ``"lockstep"`` or ``"arrivals"`` (selects ``ORACLES[mode]``).
        exclude: strategies that are not baselines (default ``METHODS``: naig and its ablations).

    Returns:
        The strategy name, or None when no candidate is left.

    Example:
        >>> best_baseline({"sync": [2.7], "hogwild": [3.5], "median": [3.1], "naig": [2.9]}, "lockstep")
        'median'
    """
    skip = ORACLES[mode] | frozenset(exclude)
    return best_by_validation({k: v for k, v in val_losses.items() if k not in skip})


def time_to_loss(xs: Sequence[float], losses: Sequence[float], target: float) -> float:
    """The first x at which the curve reaches ``target``, linearly interpolated.

    Args:
        xs: increasing positions (server updates or simulated seconds).
        losses: the loss at each position (NaN after a divergence).
        target: the loss L to reach.

    Returns:
        x where the piecewise-linear curve first crosses L; ``xs[0]`` if it starts at or
        below L; +∞ if it never reaches L (or ``target`` is not finite).

    Example:
        >>> time_to_loss([0, 10, 20], [5.0, 3.0, 2.0], 2.5)
        15.0
    """
    if not math.isfinite(target):
        return math.inf
    prev: tuple[float, float] | None = None
    for x, loss in zip(xs, losses, strict=True):
        if math.isfinite(loss) and loss <= target:
            if prev is None or not math.isfinite(prev[1]) or prev[1] == loss:
                return float(x)
            return prev[0] + (prev[1] - target) / (prev[1] - loss) * (x - prev[0])
        prev = (float(x), float(loss))
    return math.inf
