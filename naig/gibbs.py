"""Gibbs weights and the Maslov–Gibbs einsum (MGE) combine (docs/design.md §7).

π_k = exp(−β E_k) / Σ_j exp(−β E_j), computed stably by shifting by min E.
Non-finite E_k get π_k = 0. β = 0 gives uniform weights (Hogwild!).
``beta="auto"`` sets β = 1 / median of the finite positive E_k (1.0 if none); with exactly two,
1 / the smaller (their median is their mean, which an outlier dominates: the worse worker would
keep π = e⁻²/(1 + e⁻²) = 0.119 whatever its energy; with the smaller, π_worse/π_better =
exp(1 − E_worse/E_better), so a worker of 6.3× the other's energy is frozen, as at K ≥ 3).
The combined update ĝ = Σ_k π_k g_k goes to an unchanged optimizer.
K_eff = 1 / Σ π_k²; a worker is frozen when π_k < 0.01 / K.
"""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from naig.errors import DataError, UsageError

__all__ = [
    "FROZEN_FACTOR",
    "parse_beta",
    "resolve_beta",
    "gibbs_weights",
    "naig_weights",
    "EmaReference",
    "EMA_DECAY",
    "BETA_HISTORY",
    "reference_index",
    "effective_workers",
    "frozen_mask",
    "normalized_entropy",
    "combine",
]

FROZEN_FACTOR = 0.01  # frozen when π_k < FROZEN_FACTOR / K
EMA_DECAY = 0.9  # the EMA reference: r ← 0.9 r + 0.1 x
BETA_HISTORY = 100  # auto-β of single arrivals: median of the last this many positive energies


def parse_beta(beta: str | float, field: str = "beta") -> float | str:
    """Validate a β value once, at the edge: ``"auto"`` or a finite float ≥ 0.

    Args:
        beta: the value to check (a string such as ``"auto"`` or ``"0.5"``, or a number).
        field: the argument name errors carry (``UsageError.field``).

    Returns:
        ``"auto"`` or β as a float.

    Raises:
        UsageError: for a negative, NaN, infinite or non-numeric value.

    Example:
        >>> parse_beta("AUTO"), parse_beta("0.5")
        ('auto', 0.5)
    """
    if isinstance(beta, str) and beta.strip().lower() == "auto":
        return "auto"
    if isinstance(beta, bool):  # float(True) is 1.0: a config's `true` is not a number
        raise UsageError("not a number; use 'auto' or a number", field=field, value=beta)
    try:
        value = float(beta)
    except (TypeError, ValueError):
        raise UsageError("not a number; use 'auto' or a finite float >= 0", field=field,
                         value=beta) from None
    if not math.isfinite(value) or value < 0:
        raise UsageError("must be finite and >= 0; use 'auto' or e.g. 1", field=field, value=beta)
    return value


def resolve_beta(beta: float | str, energies: np.ndarray, *, history: bool = False) -> float:
    """Turn a parsed β (float or ``"auto"``) into the inverse temperature used.

    Args:
        beta: a float ≥ 0 (returned as is), or ``"auto"``: 1 / median of the finite
            positive energies (of exactly two workers: 1 / the smaller, see the module). Parse
            user input with ``parse_beta`` first.
        history: the energies are one stream's past arrivals, not one step's workers: always
            the median (two past energies are no pair of workers).
        energies: float array of shape (K,).

    Returns:
        β as a Python float (1.0 for ``"auto"`` when no energy is finite and positive).

    Raises:
        UsageError: if ``beta`` is neither ``"auto"`` nor a finite float ≥ 0.

    Example:
        >>> resolve_beta("auto", np.array([0.0, 2.0, 4.0, 6.0, np.nan]))  # 1 / median of 2, 4, 6
        0.25
        >>> resolve_beta("auto", np.array([0.0, 2.0, 4.0, np.nan]))  # two positive: 1 / the smaller
        0.5
    """
    if beta != "auto":
        if not isinstance(beta, int | float | np.floating) or not (math.isfinite(beta) and beta >= 0):
            raise UsageError("must be 'auto' or a finite float >= 0; parse user input with "
                             "parse_beta", field="beta", value=beta)
        return float(beta)
    e = np.asarray(energies, dtype=np.float64)
    pos = e[np.isfinite(e) & (e > 0)]
    if not pos.size:
        return 1.0
    typical = float(pos.min()) if pos.size == 2 and not history else float(np.median(pos))
    return min(1.0 / typical, sys.float_info.max)  # a subnormal typical energy gives inf


def gibbs_weights(energies: np.ndarray, beta: float | str) -> np.ndarray:
    """π_k = exp(−β E_k) / Σ_j exp(−β E_j), stable for E up to 1e300 and β up to 1e12.

    Args:
        energies: float array of shape (K,); non-finite entries get π = 0.
        beta: inverse temperature, finite and ≥ 0, or ``"auto"`` (see ``resolve_beta``).

    Returns:
        float64 array of shape (K,), non-negative, summing to 1.

    Raises:
        DataError: if every energy is non-finite.
        UsageError: if ``beta`` is negative or not finite.

    Example:
        >>> gibbs_weights(np.array([0.0, np.log(3.0)]), beta=1.0).round(6).tolist()
        [0.75, 0.25]
    """
    e = np.asarray(energies, dtype=np.float64)
    b = resolve_beta(beta, e)
    ok = np.isfinite(e)
    if not ok.any():
        raise DataError("every energy is non-finite (NaN/Inf); no worker can be weighted")
    shifted = np.where(ok, e - e[ok].min(), 0.0)  # ≥ 0, finite
    with np.errstate(over="ignore", invalid="ignore"):
        z = np.where(ok, np.exp(-np.float64(b) * shifted), 0.0) if b else ok.astype(np.float64)
    return z / z.sum()


def reference_index(lags: Sequence[int] | Any, workers: Sequence[int] | Any | None = None,
                    usable: Sequence[bool] | Any | None = None) -> int:
    """The freshest row, NAIG's reference: the smallest staleness, ties to the lowest worker.

    Every NAIG reference of a batch (the rules, the sketch-first screen, the saved
    ``ref.safetensors``) is this one. Rows that are not ``usable`` (a non-finite sketch:
    a NaN gradient cannot be the point others are measured from) are passed over unless
    none is usable; then every energy is non-finite and ``naig_weights`` is uniform.

    Args:
        lags: (B,) staleness τ_k of each row: a sequence of ints, a numpy array or a torch tensor.
        workers: (B,) worker index of each row (default: the row index).
        usable: (B,) bool, rows that may be the reference (default: all).

    Returns:
        The row index (not the worker index).

    Example:
        >>> reference_index([10, 0, 0, 35]), reference_index([3, 1, 1], workers=[0, 5, 2])
        (1, 2)
        >>> reference_index([3, 1, 1], workers=[0, 5, 2], usable=[True, True, False])
        1
    """
    values = [int(t) for t in lags]
    who = list(range(len(values))) if workers is None else [int(w) for w in workers]
    rows = list(range(len(values)))
    if usable is not None:
        rows = [i for i, ok in zip(rows, usable, strict=True) if bool(ok)] or rows
    return min(rows, key=lambda i: (values[i], who[i]))


def effective_workers(pi: np.ndarray) -> float:
    """K_eff = 1 / Σ π_k² ∈ [1, K]."""
    return float(1.0 / np.sum(np.square(np.asarray(pi, dtype=np.float64))))


def frozen_mask(pi: np.ndarray) -> np.ndarray:
    """Boolean (K,): worker k is frozen when π_k < 0.01 / K."""
    pi = np.asarray(pi, dtype=np.float64)
    return pi < FROZEN_FACTOR / pi.shape[-1]


def normalized_entropy(pi: np.ndarray) -> np.ndarray:
    """H(π) / ln K ∈ [0, 1] along the last axis (1 = uniform; 0 = one worker)."""
    pi = np.asarray(pi, dtype=np.float64)
    k = pi.shape[-1]
    if k < 2:
        return np.zeros(pi.shape[:-1])
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.where(pi > 0, pi * np.log(pi), 0.0).sum(-1)
    return h / math.log(k)


def combine(pi: Any, grads: Any) -> Any:
    """The MGE combine ĝ = Σ_{k: π_k ≠ 0} π_k g_k, an einsum over the worker axis.

    Rows of weight 0 are left out of the sum, so a NaN/Inf gradient given π_k = 0 (as
    ``gibbs_weights`` gives a non-finite energy) cannot poison ĝ through 0·NaN.

    Args:
        pi: (K,) weights: a numpy array, torch tensor or list.
        grads: (K, ...) stacked gradients, a numpy array or a torch tensor.

    Returns:
        Array/tensor of shape (...) in the dtype of ``grads`` (zeros when every π_k is 0).

    Example:
        >>> combine([0.5, 0.0], np.array([[1.0, 2.0], [np.nan, 0.0]])).tolist()
        [0.5, 1.0]
    """
    if type(grads).__module__.startswith("torch"):
        import torch

        flat = grads.reshape(grads.shape[0], -1)  # (K, m): one matrix-vector product
        pi = torch.as_tensor(pi, device=grads.device, dtype=grads.dtype)
        keep = pi != 0
        if not bool(keep.all()):
            rows = keep.nonzero().squeeze(1)
            pi, flat = pi.index_select(0, rows), flat.index_select(0, rows)
        return (pi @ flat).reshape(grads.shape[1:])
    pi = np.asarray(pi, dtype=grads.dtype)
    keep = pi != 0
    return np.einsum("k,k...->...", pi[keep], grads[keep])


def naig_weights(energies: np.ndarray, beta: float | str) -> np.ndarray:
    """NAIG's weights: ``gibbs_weights``, or uniform when no energy is finite (the one fallback).

    When every energy is NaN/Inf (the reference itself is non-finite) no worker can be
    preferred: π is uniform, so ĝ is the plain (non-finite) mean and the caller sees the
    divergence instead of an exception or a silently skipped update. Every NAIG weighting
    (the ``naig`` rules, ``diloco-naig``, the sketch-first screen) uses this function.

    Args:
        energies: (K,) float energies.
        beta: a float ≥ 0 or ``"auto"``.

    Returns:
        (K,) float64, non-negative, summing to 1.

    Example:
        >>> naig_weights(np.array([np.nan, np.inf]), 1.0).tolist()
        [0.5, 0.5]
    """
    try:
        return gibbs_weights(energies, beta)
    except DataError:
        k = np.asarray(energies).shape[0]
        return np.full(k, 1.0 / k)


class EmaReference:
    """NAIG's reference for single arrivals: an EMA of the accepted points, w = exp(−β E).

    For each arrival x (a sketch S g, or g itself): the first finite x seeds r; then
    E = energy(x − r), β from the last ``BETA_HISTORY`` positive energies (``"auto"``:
    1/median), w = exp(−β E), and when w > 0, r ← 0.9 r + 0.1 x. A non-finite x or E
    gets w = 0 and changes nothing. The ``naig`` rules at window 1 and the sketch-first
    screen both use this class.

    Args:
        beta: a float ≥ 0 or ``"auto"``.
        energy: the energy of one drift (m,) → a 0-d tensor or float.

    Example:
        >>> import torch
        >>> ema = EmaReference(1.0, lambda d: float((d * d).sum()))
        >>> ema.weight(torch.zeros(2)), round(ema.weight(torch.tensor([1.0, 0.0])), 4)
        (1.0, 0.3679)
    """

    def __init__(self, beta: float | str, energy: Any) -> None:
        self.beta, self.energy = beta, energy
        self.point: Any = None
        self.history: deque[float] = deque(maxlen=BETA_HISTORY)

    def weight(self, point: Any) -> float:
        """w of one arrival (m,) float64 tensor, updating the reference and the β history."""
        if not bool(point.isfinite().all()):
            return 0.0
        if self.point is None:
            self.point = point.clone()  # seeded by the first finite arrival
        e = float(self.energy(point - self.point))
        if not math.isfinite(e):
            return 0.0
        if e > 0:
            self.history.append(e)
        w = math.exp(-resolve_beta(self.beta, np.asarray(self.history, dtype=np.float64), history=True) * e)
        if w > 0.0:
            self.point.mul_(EMA_DECAY).add_(point, alpha=1 - EMA_DECAY)
        return w
