"""Measured against predicted staleness for one arrival model: what ``naig staleness`` reports.

``staleness_report`` simulates the arrivals (``simulate_arrivals``) and the synchronous
rounds (``round_times``), measures every value with a 95% interval and sets the
predictions of ``predict`` beside them (docs/design.md §10).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from naig.arrivals.engine import ArrivalTrace, check_count, round_times, simulate_arrivals
from naig.arrivals.model import ArrivalModel
from naig.arrivals.predict import SKETCH_BYTES, Prediction, predict, ring_allreduce_bytes
from naig.arrivals.stats import Estimate, batch_means, iid_mean, rate_estimate
from naig.errors import UsageError

__all__ = ["SCHEMA_VERSION", "PARAMS", "Measured", "StalenessReport", "measure", "warmup_length",
           "round_time_estimate", "staleness_report"]

SCHEMA_VERSION = 2
"""Of the staleness JSON document (2: the command's document also holds ``warnings``, the warning
lines it writes on stderr)."""
PARAMS = 124_439_808
"""Default model size for bandwidth figures: GPT-2 small (124,439,808 parameters)."""


@dataclass(frozen=True)
class Measured:
    """Staleness statistics of one trace, each with its 95% batch-means interval.

    Attributes:
        mean: τ over all updates. per_worker: (K,) τ per worker (NaN for a worker with none).
        p_zero: P(τ = 0). variance: Var τ (batch means of (τ − τ̄)²).
        rate: arrivals per second. age: E[A], seconds from the creation of the version used.
        histogram: (max τ + 1,) int64 counts of each τ.
        counts: (K,) int64 updates per worker.
        warmup: arrivals left out at the start (the statistics cover the others).
    """

    mean: Estimate
    per_worker: tuple[Estimate, ...]
    p_zero: Estimate
    variance: Estimate
    rate: Estimate
    age: Estimate
    histogram: np.ndarray
    counts: np.ndarray
    warmup: int


def _per_worker(trace: ArrivalTrace) -> tuple[Estimate, ...]:
    order = np.argsort(trace.worker, kind="stable")  # each worker's updates in arrival order
    bounds = np.cumsum([0, *np.bincount(trace.worker, minlength=trace.workers)])
    tau = trace.staleness[order]
    return tuple(batch_means(tau[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True))


def warmup_length(trace: ArrivalTrace) -> int:
    """Arrivals before every worker has delivered one gradient (at most N/10): the start-up,
    when jobs still hold version 0, left out of the steady-state statistics."""
    first = np.full(trace.workers, trace.arrivals, dtype=np.int64)
    np.minimum.at(first, trace.worker, np.arange(trace.arrivals))
    return int(min(first.max() + 1, trace.arrivals // 10))


def measure(trace: ArrivalTrace, warmup: int | None = None) -> Measured:
    """Measure a trace after its start-up: means with batch-means 95% intervals.

    Args:
        trace: the simulated arrivals.
        warmup: arrivals to leave out first; ``None``: ``warmup_length(trace)``.

    Example:
        >>> from naig.arrivals import ArrivalModel, simulate_arrivals
        >>> m = measure(simulate_arrivals(ArrivalModel.from_specs("exp:1", workers=4), 20_000))
        >>> round(m.mean.value, 2), m.mean.contains(3.0), m.warmup
        (3.0, True, 4)
    """
    w = warmup_length(trace) if warmup is None else check_count(warmup, "warmup", 0)
    tr = ArrivalTrace(**{f: getattr(trace, f)[w:] for f in ("worker", "job", "time", "pulled", "staleness",
                                                             "age")},
                      workers=trace.workers, window=trace.window, pending=trace.pending)
    tau = tr.staleness.astype(np.float64)
    return Measured(
        mean=batch_means(tau), per_worker=_per_worker(tr), p_zero=batch_means(tau == 0),
        variance=batch_means((tau - tau.mean()) ** 2),
        rate=rate_estimate(tr.time, start=float(trace.time[w - 1]) if w else 0.0),
        age=batch_means(tr.age), histogram=np.bincount(tr.staleness),
        counts=np.bincount(tr.worker, minlength=tr.workers), warmup=w,
    )


def _interval_list(e: Estimate | None) -> list[float] | None:
    return None if e is None else e.interval


@dataclass(frozen=True)
class StalenessReport:
    """One model's measured and predicted staleness, bandwidth and round time.

    Attributes:
        model, updates, seed, window, params, rounds: what was simulated.
        measured: the ``Measured`` statistics. predicted: the ``Prediction``.
        round_time: measured E[max_i C_i] over ``rounds`` synchronous rounds (t-interval).
        simulate_seconds: wall time of the arrival simulation (not in ``to_dict``, which is
            deterministic for a seed).
    """

    model: ArrivalModel
    updates: int
    seed: int
    window: int
    params: int
    rounds: int
    measured: Measured
    predicted: Prediction
    round_time: Estimate
    simulate_seconds: float = field(default=0.0, compare=False)

    @property
    def little(self) -> float | None:
        """λ̂·Ā − 1 from the measured rate and age (Little's law; equals E[τ] in blocking mode).

        None with a window B > 1: versions then advance once per B arrivals and the discrete
        form (one version per arrival) does not apply.
        """
        if self.window != 1:
            return None
        return self.measured.rate.value * self.measured.age.value - 1

    def within(self) -> dict:
        """For each prediction: inside the measured 95% interval (``None``: no prediction)."""
        m, p = self.measured, self.predicted
        per = (None if p.per_worker is None else [e.contains(v) for e, v in zip(m.per_worker, p.per_worker,
                                                                                   strict=True)])
        return {"mean": m.mean.contains(p.mean), "mean_plus_one": m.mean.contains(p.mean),
                "per_worker": per, "p_zero": m.p_zero.contains(p.p_zero),
                "variance": m.variance.contains(p.variance), "rate": m.rate.contains(p.rate),
                "age": m.age.contains(p.age), "little": m.mean.contains(self.little),
                "round_time": self.round_time.contains(p.round_time)}

    def bandwidth(self) -> dict:
        """Bytes per second at the master: gradients (4n) or sketches (56 B) up, parameters (4n) down."""
        full = 4 * self.params

        def flows(rate: float) -> dict:
            return {"up_gradient": rate * full, "up_sketch": rate * SKETCH_BYTES,
                    "down_parameters": rate * full}

        ring = ring_allreduce_bytes(self.params, self.model.workers)
        return {"unit": "bytes/s", "params": self.params, "gradient_bytes": full,
                "sketch_bytes": SKETCH_BYTES,
                "measured": flows(self.measured.rate.value), "predicted": flows(self.predicted.rate),
                "sync_allreduce_per_worker": ring / self.round_time.value if self.round_time.value > 0
                else math.inf}

    def _measured_dict(self) -> dict:
        m = self.measured
        return {
            "mean": m.mean.value, "mean_plus_one": m.mean.value + 1,
            "per_worker": [e.value for e in m.per_worker], "p_zero": m.p_zero.value,
            "variance": m.variance.value, "rate": m.rate.value, "age": m.age.value,
            "updates_per_second": m.rate.value / self.window, "warmup": m.warmup,
            "ci95": {"mean": m.mean.interval, "mean_plus_one": _interval_list(m.mean.shifted(1)),
                     "per_worker": [e.interval for e in m.per_worker], "p_zero": m.p_zero.interval,
                     "variance": m.variance.interval, "rate": m.rate.interval, "age": m.age.interval},
        }

    def _predicted_dict(self) -> dict:
        p = self.predicted
        return {"mean": p.mean, "mean_plus_one": p.mean_plus_one,
                "per_worker": None if p.per_worker is None else list(p.per_worker), "p_zero": p.p_zero,
                "variance": p.variance, "rate": p.rate, "age": p.age, "little": self.little,
                "updates_per_second": p.rate / self.window, "ci95": None}

    def to_dict(self) -> dict:
        """The JSON document (``schema_version`` 1): config, staleness, bandwidth, round_time."""
        pmf = self.predicted.pmf(np.arange(len(self.measured.histogram)))
        counts = int(self.measured.histogram.sum())
        return {
            "schema_version": SCHEMA_VERSION,
            "config": self.model.describe() | {"updates": self.updates, "seed": self.seed,
                                               "window": self.window, "params": self.params,
                                               "rounds": self.rounds},
            "staleness": {
                "measured": self._measured_dict(), "predicted": self._predicted_dict(),
                "within_ci95": self.within(),
                "histogram": {"counts": self.measured.histogram.tolist(),
                              "predicted": None if pmf is None else (counts * pmf).tolist()},
            },
            "bandwidth": self.bandwidth(),
            "round_time": {"measured": self.round_time.value, "ci95": self.round_time.interval,
                           "predicted": self.predicted.round_time, "rounds": self.rounds},
        }


def round_time_estimate(model: ArrivalModel, rounds: int = 10_000, seed: int = 0) -> Estimate:
    """E[max_i C_i], the synchronous round time, simulated over ``rounds`` rounds with its 95% t-interval.

    ``predict(model).round_time`` gives the value by quadrature where every C_i has a known CDF.

    Example:
        >>> e = round_time_estimate(ArrivalModel.from_specs("exp:1", workers=2), 20_000)
        >>> e.contains(1.5)
        True
    """
    return iid_mean(round_times(model, rounds, seed))


def staleness_report(model: ArrivalModel, updates: int, seed: int = 0, *, window: int = 1,
                     params: int = PARAMS, rounds: int = 10_000) -> StalenessReport:
    """Simulate ``updates`` arrivals and ``rounds`` synchronous rounds; measure and predict.

    Args:
        model: the workers and protocol.
        updates: N gradient arrivals (server updates when ``window`` = 1).
        seed: the seed of both simulations.
        window: B arrivals per server update.
        params: n, parameters of the model (float32) for the bandwidth figures.
        rounds: synchronous rounds simulated for E[max_i C_i].

    Raises:
        UsageError: a count below 1 (field ``updates``, ``params``, ``rounds``, ``window``) or a bad seed.
    """
    params, rounds = check_count(params, "params"), check_count(rounds, "rounds")
    if isinstance(window, int) and window > model.workers:
        raise UsageError(f"use an int in 1..{model.workers} (1: ASGD, {model.workers}: K-batch-async)",
                         field="window", value=window)
    t0 = time.perf_counter()
    trace = simulate_arrivals(model, updates, seed, window=window)
    wall = time.perf_counter() - t0
    return StalenessReport(model=model, updates=trace.arrivals, seed=seed, window=window, params=params,
                           rounds=rounds, measured=measure(trace), predicted=predict(model, window=window),
                           round_time=round_time_estimate(model, rounds, seed), simulate_seconds=wall)
