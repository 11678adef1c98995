"""Asynchronous training of a small GPT with stale workers, rule against rule (docs/design.md §8).

- ``config``: ``SimulateConfig``, validated on construction.
- ``loop``: ``Simulation`` (what the runs share) and ``Run`` (one strategy and seed,
  advanced by ``step()``); ``run_simulation`` runs them all.
- ``results``: ``RunResult``, ``StrategySummary``, ``SimulateResult``.
- ``model`` (the byte-level GPT), ``data`` (real text), ``strategies`` (one file per rule).
"""

from naig.simulate.config import SimulateConfig, parse_float_list, parse_int_list, resolve_device
from naig.simulate.loop import (
    ROUTING_BYTES,
    Run,
    RunContext,
    Simulation,
    StepEvent,
    allocate_ring,
    environment,
    ring_rows,
    run_simulation,
)
from naig.simulate.results import RunResult, SimulateResult, StrategySummary

__all__ = [
    "SimulateConfig",
    "Simulation",
    "Run",
    "RunResult",
    "StrategySummary",
    "SimulateResult",
    "ROUTING_BYTES",
    "allocate_ring",
    "parse_int_list",
    "parse_float_list",
    "StepEvent",
    "RunContext",
    "environment",
    "resolve_device",
    "ring_rows",
    "run_simulation",
]
