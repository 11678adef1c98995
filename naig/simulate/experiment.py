"""An experiment: every rule × seed × learning rate on one engine, evaluated and summarised.

Protocol (docs/design.md §8): for each seed, every rule gets the same θ_0, the same
worker streams and the same validation (and test) batches; with several learning rates
each rule's is chosen on validation and its loss reported on the test split. A run
whose θ becomes non-finite stops there (``RunResult.diverged_at``, NaN loss); the
others go on. Ctrl-C (or SIGTERM) stops the experiment: the runs that finished are
kept and ``interrupted`` is True.

The engine is chosen once, by ``naig.simulate.engines.open_session``; a simulated
engine's runs are driven here by ``drive`` (``step()`` until ``done``, evaluations at
the configured points, a per-step CSV log), the distributed engine drives its own.

Example:
    >>> from naig.simulate.config import SimulateConfig
    >>> cfg = SimulateConfig(steps=2, seeds=1, strategies=("hogwild",), data_bytes=50_000,
    ...                      eval_every=0, eval_batches=1)
    >>> res = run_experiment(cfg)
    >>> res.summaries[0].strategy, res.n_params > 0
    ('hogwild', True)
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from naig.interrupts import deferred_interrupts, sigterm_as_interrupt
from naig.simulate.engines import open_session
from naig.simulate.parallel import run_parallel
from naig.simulate.results import RunResult, SimulateResult, summarise
from naig.simulate.runs import (
    RunContext,
    Session,
    StepEvent,
    drive,
    evaluates,
    evaluation_points,
)
from naig.sketch.core import SKETCH_DIM
from naig.threads import torch_threads

if TYPE_CHECKING:
    from naig.simulate.config import SimulateConfig

__all__ = ["run_experiment", "drive", "Session", "StepEvent", "RunContext", "ROUTING_BYTES", "environment",
           "evaluation_points", "evaluates"]

ROUTING_BYTES = SKETCH_DIM * 4  # a worker's routing signal: 14 float32 values


def run_experiment(config: SimulateConfig,
                   progress: Callable[[StepEvent], None] | None = None) -> SimulateResult | None:
    """Run every rule on every seed (and every lr) on the configured engine and summarise.

    Args:
        config: the experiment (validated on construction).
        progress: called after every step(-equivalent) of every run with a ``StepEvent``.

    Returns:
        A ``SimulateResult`` with one ``RunResult`` per (seed, rule, lr) and one
        ``StrategySummary`` per rule, in ``config.strategies`` order; None on a worker
        rank of the distributed engine under a launcher (rank 0 reports).

    Raises:
        UsageError: ``device`` cuda without a GPU, a ring buffer that does not fit, a
            launcher whose world size is not ``nproc``.
        DataError: if the corpus is missing or too small.
    """
    with torch_threads(config.threads):
        return _run_experiment(config, open_session, progress)


def _run_experiment(config: SimulateConfig, open_session: Callable[[SimulateConfig], Any],
                    progress: Callable[[StepEvent], None] | None) -> SimulateResult | None:
    """``run_experiment``'s body, with torch's threads already set."""
    session = open_session(config)
    if session is None:  # a worker rank: it served until the server said stop
        return None
    runs: list[RunResult] = []
    untrained: list[float] = []
    saved: list[str] = []
    interrupted = False
    planned = [(seed, name, lr) for seed in range(config.seeds) for name in config.strategies
               for lr in config.lr]
    try:
        with sigterm_as_interrupt(), session:
            try:
                if session.jobs > 1:  # a simulated session (the distributed engine's is 1)
                    run_parallel(session, planned, session.jobs, progress, runs, untrained, saved)
                else:
                    _run_all(session, planned, progress, runs, untrained, saved)
            except KeyboardInterrupt:
                interrupted = True
                partial = session.partial()
                runs += [partial] if partial is not None else []
    except KeyboardInterrupt:  # while the engine started (the rendezvous) or stopped
        interrupted = True
    with deferred_interrupts() as late:  # the runs are over: a stop now must not lose them
        result = _summary(config, session, planned, runs, untrained, saved, interrupted)
    return dataclasses.replace(result, interrupted=True) if late else result


def _summary(config: SimulateConfig, session: Any, planned: list[tuple[int, str, float]],
             runs: list[RunResult], untrained: list[float], saved: list[str], interrupted: bool
             ) -> SimulateResult:
    """The experiment's result from its finished runs."""
    done = {(r.seed, r.strategy, r.lr) for r in runs}
    not_run = () if interrupted else tuple(f"{n} seed {s} lr {lr:g}" for s, n, lr in planned
                                           if (s, n, lr) not in done)
    w = session.workload
    summaries, best = summarise(runs, config.strategies, "arrivals" if config.asynchronous else "lockstep")
    untrained_mean = statistics.fmean(untrained) if untrained else math.nan
    return SimulateResult(config, str(w.device), w.n_params, untrained_mean, ROUTING_BYTES, 4 * w.n_params,
                          tuple(runs), summaries, tuple(saved), environment(str(w.device)), interrupted, best,
                          distributed=session.block(), not_run=not_run)


def _run_all(session: Session, planned: list[tuple[int, str, float]],
             progress: Callable[[StepEvent], None] | None, runs: list[RunResult], untrained: list[float],
             saved: list[str]) -> None:
    """The planned (seed, rule, lr) runs in order, one context per seed; stops when the engine has
    no worker left (the rest are reported as not run)."""
    from naig.simulate.engines.base import NoWorkerLeft

    ctx, current = None, -1
    try:
        for seed, name, lr in planned:
            if seed != current:
                saved += ctx.saved if ctx is not None else []
                ctx, current = session.context(seed, progress), seed
                untrained.append(ctx.untrained)
            try:
                runs.append(session.run(name, seed, lr, ctx))
            except NoWorkerLeft:
                break
    finally:  # a Ctrl-C too: the files written so far are reported (they were left out)
        saved += ctx.saved if ctx is not None else []


def environment(device: str) -> dict[str, object]:
    """Versions and resources a reader needs to reproduce a run (recorded in the JSON)."""
    import platform

    import numpy

    from naig import __version__

    return {"naig": __version__, "torch": torch.__version__, "numpy": numpy.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "threads": torch.get_num_threads(), "device": device}
