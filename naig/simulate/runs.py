"""The run contracts every engine and the experiment share; this module imports no engine.

A run (``naig.simulate.engines.base.Run``) is stepped by ``drive`` to the end of its budget,
evaluated at ``evaluation_points``, logged per step by ``RunContext.open_log`` and reported to
the progress callback as ``StepEvent`` s; a ``Session`` is an engine opened for one experiment
(``naig.simulate.engines.open_session`` chooses it). An engine starts a run from the workload,
its own setting and the ``RunRules`` (budget, optimizer, faults, the combination rules' options),
never from the whole config tree; the driver here reads the tree's evaluation schedule.
``naig.simulate.experiment`` orchestrates with these; the engines (simulated and distributed)
implement them.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from naig.errors import DataError
from naig.simulate.results import RunResult, pi_stats
from naig.simulate.workload import Batches, Workload

if TYPE_CHECKING:
    from naig.simulate.config import SimulateConfig
    from naig.simulate.engines.base import Run
    from naig.simulate.faults import Fault
    from naig.simulate.strategies import StrategyOptions
    from naig.sketch.torch_sketch import TorchSketch

__all__ = ["StepEvent", "RunContext", "RunRules", "Session", "drive", "evaluates", "evaluation_points",
           "log_name", "make_context"]


@dataclass(frozen=True)
class RunRules:
    """What an engine is handed besides the workload and its setting (``SimulateConfig.run_rules``).

    Attributes:
        steps: the budget, server steps per run (with a clock: steps × K gradients).
        optimizer: the server optimizer, ``sgd`` or ``adam``.
        faults: the injected faults (``naig.simulate.faults``).
        options: the combination rules' options at the first learning rate, without a sketch
            (``strategy_options`` gives a run's).
    """

    steps: int
    optimizer: str
    faults: tuple[Fault, ...]
    options: StrategyOptions

    def strategy_options(self, sketch: TorchSketch | None, lr: float) -> StrategyOptions:
        """The options of one run: the workload's sketch, the run's learning rate."""
        return dataclasses.replace(self.options, sketch=sketch, lr=lr)


@dataclass(frozen=True)
class StepEvent:
    """What the progress callback hears after every step(-equivalent) of every run."""

    strategy: str
    seed: int
    lr: float
    step: int  # steps done in this run
    steps: int  # steps per run
    val_loss: float | None  # validation loss when this step was an evaluation point
    seconds: float  # wall seconds spent in this run's steps so far
    diverged_at: int | None = None  # the run's last event: it diverged, at ``RunResult.diverged_at``

    @property
    def diverged(self) -> bool:
        """This is a diverged run's last event (its steps are spent; it stops here)."""
        return self.diverged_at is not None


@dataclass
class RunContext:
    """What the runs of one seed share: evaluation batches, callbacks, saved files."""

    val: Batches  # validation batches of the seed
    test: Batches | None  # test batches (learning-rate tuning), else None
    untrained: float  # validation loss at θ_0
    progress: Callable[[StepEvent], None] = lambda event: None
    log_dir: Path | None = None  # per-step CSV files go here
    saved: list[str] = field(default_factory=list)  # gradient files written

    def open_log(self, strategy: str, seed: int, lr: float) -> _CsvLog:
        """A per-step CSV writer for one run (writes nothing without ``log_dir``); a context manager."""
        path = None if self.log_dir is None else self.log_dir / log_name(strategy, seed, lr)
        return _CsvLog(path)


def log_name(strategy: str, seed: int, lr: float) -> str:
    """The per-step CSV file name of one run (``NAME.csv``; ``NAME.partial.csv`` while it runs)."""
    return f"{strategy}-seed{seed}-lr{lr:g}.csv"


class Session(Protocol):
    """An engine opened for one experiment (a workload; the distributed engine: its processes too)."""

    workload: Workload
    jobs: int  # runs side by side (``naig.simulate.parallel``; 1 where that does not apply)

    def context(self, seed: int, progress: Callable[[StepEvent], None] | None) -> RunContext:
        """What the runs of ``seed`` share (``make_context`` on the session's workload)."""

    def run(self, rule: str, seed: int, lr: float, ctx: RunContext) -> RunResult:
        """Train one (rule, seed, lr) run to the end of its budget."""

    def partial(self) -> RunResult | None:
        """After Ctrl-C: the interrupted run, evaluated where it stopped (None if none is kept)."""

    def block(self) -> dict[str, Any] | None:
        """The engine's block of the result (the distributed engine's processes), else None."""


class _CsvLog:
    """One row per server update: step, simulated seconds (engines with a clock), train loss (mean
    over the update's gradients), val loss (at evaluation points), π_k (empty for workers not in it).

    Written as ``NAME.partial.csv`` and renamed to ``NAME.csv`` when the run's block ends without
    an exception: a run cut by Ctrl-C or an error leaves a file that says so (its header and whole
    rows; none when it was cut before its first row), and never replaces a finished run's log of the
    same name."""

    def __init__(self, path: Path | None) -> None:
        self.fh, self.path = None, path
        if path is not None:
            self.partial = path.with_name(f"{path.stem}.partial{path.suffix}")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self.fh = self.partial.open("w", newline="")
            except OSError as exc:
                raise DataError(f"cannot write {path.name} there ({exc.strerror or exc}); pass a directory "
                                "you can write to", field="log_dir", value=str(path.parent)) from None
            self.writer = csv.writer(self.fh)
        self.header = False

    def __enter__(self) -> _CsvLog:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        if self.fh is not None:
            self.fh.close()
            if kind is None:
                os.replace(self.partial, self.path)
            elif not self.header:  # cut before its first row (a stop as it began): nothing to keep
                self.partial.unlink(missing_ok=True)

    def __call__(self, run: Run, loss: float | None) -> None:
        last = run.history.last()
        if self.fh is None or run.t == 0 or last is None:
            return
        if not self.header:
            k = run.history.workers
            self.writer.writerow(["step", "time_s", "train_loss", "val_loss", *[f"pi_{w}" for w in range(k)]])
            self.header = True
        pis = ["" if math.isnan(p) else repr(p) for p in last.tolist()]
        seconds = repr(run.time) if run.clocked else ""
        self.writer.writerow([run.t, seconds, repr(run.train_loss), "" if loss is None else repr(loss), *pis])


def _timed(device: torch.device, fn: Callable[[], object]) -> float:
    """Wall seconds of ``fn()``, synchronising the GPU before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def evaluates(c: SimulateConfig, progress: int, before: int) -> bool:
    """True when progress (in steps) reached the end or crossed a multiple of ``eval_every``."""
    return progress >= c.steps or bool(c.eval_every and progress // c.eval_every > before // c.eval_every)


def evaluation_points(c: SimulateConfig) -> list[int]:
    """The steps (step-equivalents with a clock) at which a run is evaluated, 0 included."""
    every = list(range(c.eval_every, c.steps, c.eval_every)) if c.eval_every else []
    return [0, *every, c.steps]


def drive(config: SimulateConfig, workload: Workload, run: Run, ctx: RunContext) -> RunResult:
    """Step a simulated run to the end of its budget, evaluating and logging on the way.

    Args:
        config: the simulation (its budget and evaluation schedule).
        workload: the simulation's workload (evaluation).
        run: a run at step 0 (any simulated engine's).
        ctx: the seed's evaluation batches and callbacks; the files the run saved are added
            to ``ctx.saved``.

    Returns:
        The run's ``RunResult``.
    """
    c, elapsed, done, nan_at = config, 0.0, 0, None
    curve, seconds = [(0, ctx.untrained)], [0.0]
    marks = [run.communication()]  # (samples, bytes sent per worker) at each curve point
    with ctx.open_log(run.name, run.seed, run.lr) as log:
        while not run.done:
            elapsed += _timed(workload.device, run.step)
            if run.diverged_at is not None:
                break
            loss = None
            if run.progress > done and evaluates(c, run.progress, done):
                loss = workload.evaluate(run.theta, ctx.val)
                if not math.isfinite(loss):  # θ finite but its loss is not (logits overflowed): diverged
                    nan_at = run.t - 1
                    break
                curve.append((run.t, loss))
                seconds.append(run.time)
                marks.append(run.communication())
            log(run, loss)
            if run.progress > done:
                done = run.progress
                ctx.progress(StepEvent(run.name, run.seed, run.lr, done, c.steps, loss, elapsed))
    ctx.saved += run.saved
    diverged = run.diverged_at if run.diverged_at is not None else nan_at
    result = _result(c, workload, run, ctx, curve, seconds, elapsed, marks, diverged)
    if diverged is not None:  # its last event, once its result is made: the run ended before its budget
        ctx.progress(StepEvent(run.name, run.seed, run.lr, max(done, run.progress), c.steps, None, elapsed,
                               diverged_at=diverged))
    return result


def _result(c: SimulateConfig, workload: Workload, run: Run, ctx: RunContext, curve: list[tuple[int, float]],
            seconds: list[float], elapsed: float, marks: list[tuple[int, Any]],
            diverged: int | None) -> RunResult:
    if diverged is not None:  # NaN at the evaluation points that never came
        curve += [(run.updates_per_step * s, math.nan) for s in evaluation_points(c)[len(curve):]]
    updates = run.t if diverged is None else diverged + 1
    test = None
    if ctx.test is not None:
        test = workload.evaluate(run.theta, ctx.test) if diverged is None else math.nan
    _, sent = run.communication()
    fields = {"staleness": None, "correction": None, "local": None, **run.result_fields()}
    return RunResult(run.name, run.seed, curve[-1][1], tuple(curve),
                     ms_per_step=1000 * elapsed / max(updates, 1), diverged_at=diverged,
                     lr=run.lr, final_test_loss=test,
                     curve_seconds=tuple(seconds) if run.clocked else (), updates=run.t,
                     curve_samples=tuple(m[0] for m in marks),
                     curve_bytes=tuple(float(m[1].mean()) for m in marks),
                     bytes_per_worker=tuple(sent.tolist()),
                     **fields, **pi_stats(run.history.rows()))


def make_context(config: SimulateConfig, workload: Workload, seed: int,
                 progress: Callable[[StepEvent], None] | None) -> RunContext:
    """The seed's context: its validation (and, tuning, test) batches, θ_0's loss, the callbacks."""
    val = workload.val_batches(seed)
    test = workload.test_batches(seed) if config.tuning else None
    log_dir = Path(config.log_dir) if config.log_dir else None
    return RunContext(val, test, workload.evaluate(workload.init_params(seed), val),
                      progress or (lambda event: None), log_dir)
