"""Asynchronous training of a small GPT, rule against rule, on one of four engines (docs/design.md §8).

- ``config``: ``SimulateConfig``, validated on construction.
- ``workload``: ``Workload`` (model, data, loss, worker gradients, evaluation, streams).
- ``server``: ``ServerState.apply``, the one place an update is made.
- ``lags``, ``arrivals``, ``distributed``: one package per setting, its settings dataclass and its
  engine(s) (``arrivals``: ``engine``, ``local``, ``gossip``); ``engines``: their interface and ``select``.
- ``experiment``: ``run_experiment`` (every rule × seed × lr, evaluated and summarised).
- ``results``: ``RunResult``, ``StrategySummary``, ``SimulateResult``.
- ``model`` (the byte-level GPT), ``data`` (real text), ``strategies`` (one file per rule),
  ``faults`` (one fault grammar), ``options`` (every option of the config tree, declared once).

Importing this package loads no torch; its names load their submodules on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from naig.lazy import lazy_names

# Each public name and the submodule that defines it, imported on first use (PEP 562): the CLI reads
# ``naig.simulate.options`` (the option table) at start-up without loading torch.
_HOME = {
    "config": ("SimulateConfig", "parse_float_list", "parse_int_list"),
    "experiment": ("ROUTING_BYTES", "RunContext", "StepEvent", "environment", "run_experiment"),
    "results": ("RunResult", "SimulateResult", "StrategySummary"),
    "server": ("ServerState",),
    "workload": ("Workload", "resolve_device"),
}

if TYPE_CHECKING:
    from naig.simulate.config import SimulateConfig, parse_float_list, parse_int_list
    from naig.simulate.experiment import ROUTING_BYTES, RunContext, StepEvent, environment, run_experiment
    from naig.simulate.results import RunResult, SimulateResult, StrategySummary
    from naig.simulate.server import ServerState
    from naig.simulate.workload import Workload, resolve_device

__all__ = [
    "SimulateConfig",
    "Workload",
    "ServerState",
    "RunResult",
    "StrategySummary",
    "SimulateResult",
    "ROUTING_BYTES",
    "parse_int_list",
    "parse_float_list",
    "StepEvent",
    "RunContext",
    "environment",
    "resolve_device",
    "run_experiment",
]


__getattr__, __dir__ = lazy_names(__name__, _HOME, globals())
