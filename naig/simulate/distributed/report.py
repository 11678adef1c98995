"""Measured staleness of real processes beside the predictions for their speeds (docs/design.md §14).

The server records, for every gradient that arrives, its worker, its staleness τ
(version at application − version pulled) and its arrival time. From those:

- the measured block (the ``naig staleness`` keys): mean τ, τ + 1, per-worker means,
  P(τ = 0), the max, each mean with its batch-means 95% interval (``ci95``), and the
  arrival rate; the start-up (until every worker has delivered once, at most N/10) is
  left out, as in ``naig.arrivals.measure``;
- each worker's measured cycle: the mean time between its consecutive arrivals (compute,
  slowdown, messages and the server's reply all included);
- the predictions of ``naig.arrivals.predict`` for those cycles (K − 1, or (K − 1)/B, and
  the per-worker law E[τ_i] = E[C_i]·Σ_{j≠i} 1/E[C_j]), which depend on the cycle means only,
  so constant laws at the measured means give them. They do not apply (null) when the
  server holds a window (``sync``, sketch-first windows) or when a worker was lost.

Example:
    >>> import numpy as np
    >>> tau, who = np.array([1, 1, 1, 1]), np.array([0, 1, 0, 1])
    >>> block = staleness_block(tau, who, np.arange(4.0), workers=2, window=1, applies=True)
    >>> block["mean"], block["per_worker"], block["cycle_seconds"], block["predicted"]["per_worker"]
    (1.0, [1.0, 1.0], [2.0, 2.0], [1.0, 1.0])
"""

from __future__ import annotations

import math

import numpy as np

from naig.arrivals import ArrivalModel, Estimate, batch_means, predict, rate_estimate

__all__ = ["warmup", "cycle_means", "staleness_block"]


def warmup(workers_of: np.ndarray, k: int) -> int:
    """Arrivals before every worker has delivered once (at most N/10): the start-up, left out."""
    n = len(workers_of)
    seen: set[int] = set()
    for i, w in enumerate(workers_of.tolist()):
        seen.add(w)
        if len(seen) == k:
            return min(i + 1, n // 10)
    return n // 10


def cycle_means(workers_of: np.ndarray, times: np.ndarray, k: int) -> list[float]:
    """Each worker's mean time between consecutive arrivals, seconds (NaN with fewer than 2)."""
    out = []
    for w in range(k):
        t = times[workers_of == w]
        out.append(float(np.diff(t).mean()) if len(t) > 1 else math.nan)
    return out


def _interval(e: Estimate) -> list[float] | None:
    return e.interval


def _predicted(cycles: list[float], window: int) -> dict:
    """predict() for constant laws at the measured cycle means (the laws need only the means)."""
    model = ArrivalModel.from_specs(",".join(f"const:{c!r}" for c in cycles))
    p = predict(model, window=window)
    return {"mean": p.mean, "mean_plus_one": p.mean_plus_one,
            "per_worker": None if p.per_worker is None else list(p.per_worker), "p_zero": None,
            "rate": p.rate, "ci95": None}


def staleness_block(tau: np.ndarray, workers_of: np.ndarray, times: np.ndarray, workers: int, window: int,
                    applies: bool) -> dict:
    """The measured staleness of one run beside its prediction.

    Args:
        tau: (N,) int staleness of every arrival, in arrival order.
        workers_of: (N,) int worker of each arrival.
        times: (N,) float arrival times, seconds from the run's start.
        workers: K.
        window: B.
        applies: False when no prediction applies (held windows, a lost worker).

    Returns:
        ``mean``, ``mean_plus_one``, ``per_worker``, ``p_zero``, ``max``, ``ci95`` (mean,
        mean_plus_one, per_worker, p_zero), ``rate`` (arrivals/s), ``warmup``,
        ``cycle_seconds`` (per worker), ``predicted`` (the same keys, or null) and
        ``within_ci95`` (mean, per_worker; null where undefined).
    """
    w0 = warmup(workers_of, workers)
    tau_s, who, t = tau[w0:].astype(np.float64), workers_of[w0:], times[w0:]
    if len(tau_s) == 0:
        return {"mean": math.nan, "mean_plus_one": math.nan, "per_worker": [math.nan] * workers,
                "p_zero": math.nan, "max": None, "ci95": None, "rate": math.nan, "warmup": w0,
                "cycle_seconds": [math.nan] * workers, "predicted": None, "within_ci95": None}
    mean, p0 = batch_means(tau_s), batch_means(tau_s == 0)
    per = [batch_means(tau_s[who == w]) for w in range(workers)]
    cycles = cycle_means(workers_of, times, workers)
    ok = applies and all(math.isfinite(c) and c > 0 for c in cycles)
    pred = _predicted(cycles, window) if ok else None
    within = None if pred is None else {
        "mean": mean.contains(pred["mean"]),
        "per_worker": None if pred["per_worker"] is None else
        [e.contains(v) for e, v in zip(per, pred["per_worker"], strict=True)]}
    rate = rate_estimate(t, start=float(times[w0 - 1]) if w0 else 0.0)
    return {"mean": mean.value, "mean_plus_one": mean.value + 1, "per_worker": [e.value for e in per],
            "p_zero": p0.value, "max": int(tau.max()),
            "ci95": {"mean": _interval(mean), "mean_plus_one": _interval(mean.shifted(1)),
                     "per_worker": [_interval(e) for e in per], "p_zero": _interval(p0)},
            "rate": rate.value, "warmup": w0, "cycle_seconds": cycles, "predicted": pred,
            "within_ci95": within}
