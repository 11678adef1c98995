"""The field's checks ``naig detect --protocol persistent`` runs beside the monitor, on the same records.

Each takes a run's per-step payloads (T, K, 16) (``naig.detect.sequential.Record``) and returns,
per step, the ranks it names. A non-finite rank (a NaN/Inf count, norm or sketch) is named by
every check.

============== =====================================================================================
check          names rank k at step t when
============== =====================================================================================
``nan-check``  its gradient has a non-finite entry (the check at the collective; nothing else)
``megatron``   non-finite, or ‖g_k‖ > 10 × the largest ‖g_k‖ of its earlier steps (Megatron-LM's
               large-gradient check, per rank)
``norm-z``     |z_k| > T, z_k = (x_k − mean_{j≠k} x_j) / sd_{j≠k}(x_j), x = log ‖g‖: the plain
               cross-rank z-score of the norm (sd with ddof 1)
``norm-cusum`` a two-sided CUSUM (δ = 0.5, reset after an alarm) of d_k / s_t passes h, with
               d_k = x_k − mean_{j≠k} x_j and s_t² the exponentially weighted (λ = 0.05) mean of
               the d² of earlier steps (its first ``WARMUP`` steps only accumulate)
============== =====================================================================================

T and h are calibrated on clean calibration replays to the same family-wise false-alarm rate
per step as the monitor (``calibrate``): T is the (1 − α) quantile of the per-step max over
ranks of |z|; h the value whose alarm rate over those replays is α (bisection).

Example:
    >>> import numpy as np
    >>> p = np.zeros((3, 3, 16)); p[:, :, 14] = 1.0; p[2, 1, 14] = 1e4   # ‖g‖² of 3 ranks, 3 steps
    >>> megatron(p)
    [(), (), (1,)]
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["BASELINES", "WARMUP", "DELTA", "LAMBDA", "nonfinite", "nan_check", "megatron", "norm_z",
           "norm_cusum", "calibrate_z", "calibrate_cusum", "names"]

BASELINES = ("nan-check", "megatron", "norm-z", "norm-cusum")
WARMUP, DELTA, LAMBDA, SPIKE = 16, 0.5, 0.05, 10.0


def nonfinite(payload: np.ndarray) -> np.ndarray:
    """(T, K) bool: a non-finite count, norm or sketch."""
    return (payload[..., -1] != 0) | ~np.isfinite(payload).all(axis=-1)


def names(flags: np.ndarray) -> list[tuple[int, ...]]:
    """(T, K) bool → the named ranks of each step."""
    return [tuple(int(r) for r in np.flatnonzero(row)) for row in flags]


def nan_check(payload: np.ndarray) -> list[tuple[int, ...]]:
    """Ranks with a non-finite gradient, per step."""
    return names(nonfinite(payload))


def megatron(payload: np.ndarray) -> list[tuple[int, ...]]:
    """Non-finite, or a norm above ``SPIKE`` × the rank's running max of its earlier finite norms."""
    bad = nonfinite(payload)
    norm = np.sqrt(np.where(bad, np.nan, payload[..., -2]))
    prev = np.fmax.accumulate(np.vstack([np.full((1, norm.shape[1]), np.nan), norm[:-1]]), axis=0)
    spike = np.nan_to_num(norm, nan=0.0) > SPIKE * np.nan_to_num(prev, nan=np.inf)
    return names(bad | spike)


def _log_norm(payload: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    bad = nonfinite(payload)
    x = 0.5 * np.log(np.maximum(np.where(bad, np.nan, payload[..., -2]), 1e-300))
    return x, bad


def _departure(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(…, K) x_k − mean of the others, and the others' sd (ddof 1), NaN where < 2 finite others."""
    ok = np.isfinite(x)
    v = np.where(ok, x, 0.0)
    n = ok.sum(-1, keepdims=True) - ok
    s1 = v.sum(-1, keepdims=True) - v
    s2 = (v * v).sum(-1, keepdims=True) - v * v
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = s1 / n
        var = (s2 - n * mean * mean) / (n - 1)
    d = np.where(ok & (n >= 1), x - mean, np.nan)
    sd = np.where(n >= 2, np.sqrt(np.maximum(var, 0.0)), np.nan)
    return d, sd


def z_scores(payload: np.ndarray) -> np.ndarray:
    """(…, K) |z| of the plain cross-rank z of log ‖g_k‖ (NaN for a non-finite rank)."""
    x, _ = _log_norm(payload)
    d, sd = _departure(x)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.abs(d / sd)


def norm_z(payload: np.ndarray, threshold: float) -> list[tuple[int, ...]]:
    """Non-finite, or |z_k| > ``threshold``."""
    z = z_scores(payload)
    return names(nonfinite(payload) | (np.nan_to_num(z, nan=0.0) > threshold))


def _cusum_flags(payload: np.ndarray, h: float) -> np.ndarray:
    """(…, T, K) bool alarms of the norm CUSUM (payload (…, T, K, 16); see the module)."""
    x, bad = _log_norm(payload)
    d, _ = _departure(x)
    lead, (t_len, k) = d.shape[:-2], d.shape[-2:]
    hi, lo = np.zeros((*lead, k)), np.zeros((*lead, k))
    var, weight = np.zeros(lead), np.zeros(lead)
    out = np.zeros(d.shape, dtype=bool)
    for t in range(t_len):
        dt = d[..., t, :]
        ok = np.isfinite(dt)
        if t >= WARMUP:
            s = np.sqrt(var / np.maximum(weight, 1e-300))[..., None]
            u = np.where(ok, dt / s, 0.0)
            hi = np.where(ok, np.maximum(0.0, hi + u - DELTA), hi)
            lo = np.where(ok, np.maximum(0.0, lo - u - DELTA), lo)
            alarm = (hi > h) | (lo > h)
            out[..., t, :] = alarm
            hi, lo = np.where(alarm, 0.0, hi), np.where(alarm, 0.0, lo)
        sq = np.where(ok, dt * dt, np.nan)
        step_var = np.nanmean(sq, axis=-1) if ok.any() else np.zeros(lead)
        fine = np.isfinite(step_var) & ~out[..., t, :].any(-1)
        var = np.where(fine, (1 - LAMBDA) * var + LAMBDA * np.nan_to_num(step_var), var)
        weight = np.where(fine, (1 - LAMBDA) * weight + LAMBDA, weight)
    return out | bad


def norm_cusum(payload: np.ndarray, h: float) -> list[tuple[int, ...]]:
    """Non-finite, or an alarm of the norm CUSUM at threshold ``h``."""
    return names(_cusum_flags(payload, h))


def calibrate_z(payloads: np.ndarray, alpha: float) -> float:
    """T: the (1 − α) quantile of the per-step max over ranks of |z| on clean replays (R, T, K, 16)."""
    m = np.nanmax(np.nan_to_num(z_scores(payloads), nan=-np.inf), axis=-1).ravel()
    return float(np.quantile(m, 1.0 - alpha, method="higher"))


def calibrate_cusum(payloads: np.ndarray, alpha: float) -> float:
    """h whose family-wise alarm rate on clean replays (R, T, K, 16), after the warm-up, is α."""
    def rate(h: float) -> float:
        return float(_cusum_flags(payloads, h)[..., WARMUP:, :].any(-1).mean())

    lo, hi = 0.1, 1.0
    while rate(hi) > alpha:
        lo, hi = hi, 2.0 * hi
    for _ in range(25):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if rate(mid) > alpha else (lo, mid)
    return hi if math.isfinite(hi) else math.inf
