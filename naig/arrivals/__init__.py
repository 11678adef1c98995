"""Asynchrony from worker speeds: the arrival process of asynchronous optimisation (docs/design.md §10).

K workers with random compute times and message delays send gradients to one master;
staleness emerges from their speeds instead of being fixed. numpy only (scipy for the
intervals, the goodness-of-fit test and the round-time quadrature, imported on use).

- ``ArrivalModel`` (the workers, the protocol), ``Distribution`` / ``parse_distribution(s)``;
- ``simulate_arrivals`` (the exact vectorised event simulation, an ``ArrivalTrace``),
  ``round_times`` (synchronous rounds max_i C_i);
- ``ArrivalClock`` / ``RoundClock``: the same processes one event at a time, for training;
- ``predict`` (the laws), ``measure`` / ``staleness_report`` (measured vs predicted);
- ``batch_means``, ``iid_mean``, ``rate_estimate``, ``chi_square_gof`` (statistics).

Example:
    >>> from naig.arrivals import ArrivalModel, simulate_arrivals, predict
    >>> model = ArrivalModel.from_specs("exp:1", workers=8)
    >>> trace = simulate_arrivals(model, 100_000, seed=0)
    >>> round(float(trace.staleness.mean()), 2), predict(model).mean
    (7.0, 7.0)
"""

from naig.arrivals.clock import Arrival, ArrivalClock, RoundClock
from naig.arrivals.distributions import (
    KINDS,
    Distribution,
    parse_distribution,
    parse_distributions,
    worker_stream,
)
from naig.arrivals.engine import ArrivalTrace, round_times, simulate_arrivals
from naig.arrivals.model import MODES, ArrivalModel
from naig.arrivals.predict import SKETCH_BYTES, Prediction, expected_max, predict, ring_allreduce_bytes
from naig.arrivals.report import (
    PARAMS,
    SCHEMA_VERSION,
    Measured,
    StalenessReport,
    measure,
    round_time_estimate,
    staleness_report,
    warmup_length,
)
from naig.arrivals.stats import Estimate, GofResult, batch_means, chi_square_gof, iid_mean, rate_estimate

__all__ = [
    "KINDS", "MODES", "PARAMS", "SCHEMA_VERSION", "SKETCH_BYTES",
    "Distribution", "parse_distribution", "parse_distributions", "worker_stream",
    "ArrivalModel", "ArrivalTrace", "simulate_arrivals", "round_times",
    "Arrival", "ArrivalClock", "RoundClock",
    "Prediction", "predict", "expected_max", "ring_allreduce_bytes",
    "Measured", "StalenessReport", "measure", "warmup_length", "round_time_estimate", "staleness_report",
    "Estimate", "GofResult", "batch_means", "iid_mean", "rate_estimate", "chi_square_gof",
]
