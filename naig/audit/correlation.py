"""Does the energy track staleness? Rank correlation of E_k (and ‖Δ_k‖) with lag (docs/design.md §6).

When worker files carry ``lag`` metadata, the audit reports Spearman's rank correlation
r_s of E_k with lag_k, and of ‖Δ_k‖ with lag_k, each with a two-sided permutation
p-value: under the null hypothesis that the energy ignores staleness, every pairing of
the K energies with the K lags is equally likely. The test is exact (all K! pairings)
when K! ≤ ``permutations``, else Monte Carlo with an explicit seed. Computed with
``scipy.stats`` (``rankdata``, ``permutation_test``); ties get average ranks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["PERMUTATIONS", "MIN_FILES", "spearman_permutation", "lag_correlation"]

PERMUTATIONS = 9999  # Monte Carlo resamples when K! exceeds it (exact below: K ≤ 7)
MIN_FILES = 3  # fewer pairs carry no rank information


def _pearson(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """Pearson correlation along ``axis`` (vectorised over permutations)."""
    xc = x - x.mean(axis=axis, keepdims=True)
    yc = y - y.mean(axis=axis, keepdims=True)
    return (xc * yc).sum(axis=axis) / np.sqrt((xc * xc).sum(axis=axis) * (yc * yc).sum(axis=axis))


def spearman_permutation(
    x: Sequence[float], y: Sequence[float], *, permutations: int = PERMUTATIONS, seed: int = 0
) -> tuple[float, float] | None:
    """Spearman's r_s of ``x`` and ``y`` with a two-sided permutation p-value.

    Args:
        x: (K,) values, e.g. lags.
        y: (K,) values, e.g. energies.
        permutations: resamples of the Monte Carlo test; the test is exact (every
            pairing) when K! ≤ permutations.
        seed: seed of the ``numpy.random.Generator`` that draws the resamples.

    Returns:
        ``(r_s, p_value)``, or None when r_s is undefined (K < 3, or x or y constant).

    Example:
        >>> r, p = spearman_permutation([0, 10, 20, 35], [0.1, 0.5, 0.4, 2.0])
        >>> round(r, 3), round(p, 3)  # exact: of 4! = 24 pairings 4 give r_s >= 0.8; two-sided: 2 × 4/24
        (0.8, 0.333)
    """
    from scipy import stats

    rx, ry = stats.rankdata(x), stats.rankdata(y)
    if len(rx) < MIN_FILES or np.ptp(rx) == 0 or np.ptp(ry) == 0:
        return None
    # One sample (the ranks of y) permuted against fixed x ranks: K! pairings, exact when K! ≤ permutations.
    res = stats.permutation_test((ry,), lambda yy, axis: _pearson(rx, yy, axis), permutation_type="pairings",
                                 vectorized=True, n_resamples=permutations, rng=np.random.default_rng(seed))
    return float(np.clip(res.statistic, -1.0, 1.0)), float(res.pvalue)


def _int_lag(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def lag_correlation(
    lags: Sequence[Any], energies: Sequence[float], delta_norms: Sequence[float], *,
    permutations: int = PERMUTATIONS, seed: int = 0,
) -> dict[str, Any] | None:
    """Rank correlation of E and of ‖Δ‖ with lag over the files whose lag is an int and E finite.

    Args:
        lags: (K,) ``lag`` metadata per worker file (int, or None/str when absent or not a number).
        energies: (K,) E_k (NaN for a non-finite file).
        delta_norms: (K,) ‖Δ_k‖.
        permutations: see ``spearman_permutation``.
        seed: see ``spearman_permutation``.

    Returns:
        None when fewer than 3 such files or all their lags are equal; else a JSON-ready
        dict: ``files`` (how many), ``permutations``, ``exact`` (every pairing counted),
        ``seed``, and ``energy`` / ``delta_norm``: ``{"spearman": r_s, "p_value": p}``
        (both None where the values are constant).

    Example:
        >>> doc = lag_correlation([0, 10, 20, None], [0.0, 1.0, 4.0, 9.0], [1.0, 3.0, 2.0, 9.0])
        >>> doc["files"], doc["energy"]["spearman"], doc["delta_norm"]["spearman"]
        (3, 1.0, 0.5)
    """
    keep = [i for i, lag in enumerate(lags) if _int_lag(lag) is not None and math.isfinite(energies[i])]
    x = [lags[i] for i in keep]
    if len(keep) < MIN_FILES or len(set(x)) == 1:
        return None
    doc: dict[str, Any] = {"files": len(keep), "permutations": permutations,
                           "exact": math.factorial(len(keep)) <= permutations, "seed": seed}
    for key, values in (("energy", energies), ("delta_norm", delta_norms)):
        got = spearman_permutation(x, [values[i] for i in keep], permutations=permutations, seed=seed)
        doc[key] = {"spearman": got[0] if got else None, "p_value": got[1] if got else None}
    return doc
