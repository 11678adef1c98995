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

import csv
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from naig.errors import DataError
from naig.simulate.results import RunResult, SimulateResult, pi_stats, summarise
from naig.simulate.workload import Batches, Workload
from naig.sketch.core import SKETCH_DIM
from naig.threads import torch_threads

if TYPE_CHECKING:
    from naig.simulate.config import SimulateConfig
    from naig.simulate.engines.base import Run

__all__ = ["run_experiment", "drive", "Session", "StepEvent", "RunContext", "ROUTING_BYTES", "environment",
           "evaluation_points", "evaluates"]

ROUTING_BYTES = SKETCH_DIM * 4  # a worker's routing signal: 14 float32 values


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
        path = None if self.log_dir is None else self.log_dir / f"{strategy}-seed{seed}-lr{lr:g}.csv"
        return _CsvLog(path)


class Session(Protocol):
    """An engine opened for one experiment (a workload; the distributed engine: its processes too)."""

    workload: Workload

    def run(self, rule: str, seed: int, lr: float, ctx: RunContext) -> RunResult:
        """Train one (rule, seed, lr) run to the end of its budget."""

    def partial(self) -> RunResult | None:
        """After Ctrl-C: the interrupted run, evaluated where it stopped (None if none is kept)."""

    def block(self) -> dict[str, Any] | None:
        """The engine's block of the result (the distributed engine's processes), else None."""


class _CsvLog:
    """One row per server update: step, simulated seconds (engines with a clock), train loss (mean
    over the update's gradients), val loss (at evaluation points), π_k (empty for workers not in it)."""

    def __init__(self, path: Path | None) -> None:
        self.fh = None
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self.fh = path.open("w", newline="")
            except OSError as exc:
                raise DataError(f"cannot write {path.name} there ({exc.strerror or exc}); pass a directory "
                                "you can write to", field="log_dir", value=str(path.parent)) from None
            self.writer = csv.writer(self.fh)
        self.header = False

    def __enter__(self) -> _CsvLog:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fh is not None:
            self.fh.close()

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


def drive(workload: Workload, run: Run, ctx: RunContext) -> RunResult:
    """Step a simulated run to the end of its budget, evaluating and logging on the way.

    Args:
        workload: the simulation's workload (evaluation).
        run: a run at step 0 (any simulated engine's).
        ctx: the seed's evaluation batches and callbacks; the files the run saved are added
            to ``ctx.saved``.

    Returns:
        The run's ``RunResult``.
    """
    c, elapsed, done, nan_at = workload.config, 0.0, 0, None
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
    return _result(workload, run, ctx, curve, seconds, elapsed, marks, diverged)


def _result(workload: Workload, run: Run, ctx: RunContext, curve: list[tuple[int, float]],
            seconds: list[float], elapsed: float, marks: list[tuple[int, Any]],
            diverged: int | None) -> RunResult:
    c = workload.config
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


class SimulatedSession:
    """The simulated engines in this process: one workload, each rule on its engine."""

    def __init__(self, config: SimulateConfig) -> None:
        from naig.simulate.engines import buffer_rows
        from naig.simulate.parallel import resolve_jobs

        self.workload = Workload(config)
        rows, option = buffer_rows(config)
        jobs = resolve_jobs(config, config.seeds * len(config.strategies) * len(config.lr),
                            self.workload.device.type)  # each process side by side holds its own
        self.workload.check_memory(rows * jobs, option)  # before any run: refused, not attempted

    def run(self, rule: str, seed: int, lr: float, ctx: RunContext) -> RunResult:
        """Start the rule's run on its engine (``engines.select``) and drive it."""
        from naig.simulate.engines import start

        return drive(self.workload, start(self.workload, rule, seed, lr), ctx)

    def partial(self) -> RunResult | None:
        """A simulated run interrupted mid-way is not kept."""
        return None

    def block(self) -> dict[str, Any] | None:
        """Nothing beyond the runs."""
        return None

    def __enter__(self) -> SimulatedSession:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


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
    from naig.simulate.engines import open_session

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
        with session:
            try:
                jobs = _jobs(session, config, len(planned))
                if jobs > 1:
                    from naig.simulate.parallel import run_parallel

                    run_parallel(session, planned, jobs, progress, runs, untrained, saved)
                else:
                    _run_all(session, planned, progress, runs, untrained, saved)
            except KeyboardInterrupt:
                interrupted = True
                partial = session.partial()
                runs += [partial] if partial is not None else []
    except KeyboardInterrupt:  # while the engine started (the rendezvous) or stopped
        interrupted = True
    done = {(r.seed, r.strategy, r.lr) for r in runs}
    not_run = () if interrupted else tuple(f"{n} seed {s} lr {lr:g}" for s, n, lr in planned
                                           if (s, n, lr) not in done)
    w = session.workload
    summaries, best = summarise(runs, config.strategies, "arrivals" if config.asynchronous else "lockstep")
    untrained_mean = statistics.fmean(untrained) if untrained else math.nan
    return SimulateResult(config, str(w.device), w.n_params, untrained_mean, ROUTING_BYTES, 4 * w.n_params,
                          tuple(runs), summaries, tuple(saved), environment(str(w.device)), interrupted, best,
                          distributed=session.block(), not_run=not_run)


def _jobs(session: Session, config: SimulateConfig, runs: int) -> int:
    """Processes for the runs (``naig.simulate.parallel.resolve_jobs``); 1 for the distributed engine."""
    from naig.simulate.parallel import resolve_jobs

    if not isinstance(session, SimulatedSession):
        return resolve_jobs(config, runs, "cpu")  # refuses an explicit jobs > 1 there; else 1
    return resolve_jobs(config, runs, session.workload.device.type)


def _run_all(session: Session, planned: list[tuple[int, str, float]],
             progress: Callable[[StepEvent], None] | None, runs: list[RunResult], untrained: list[float],
             saved: list[str]) -> None:
    """The planned (seed, rule, lr) runs in order, one context per seed; stops when the engine has
    no worker left (the rest are reported as not run)."""
    from naig.simulate.engines.base import NoWorkerLeft

    ctx, current = None, -1
    for seed, name, lr in planned:
        if seed != current:
            saved += ctx.saved if ctx is not None else []
            ctx, current = _context(session.workload, seed, progress), seed
            untrained.append(ctx.untrained)
        try:
            runs.append(session.run(name, seed, lr, ctx))
        except NoWorkerLeft:
            break
    saved += ctx.saved if ctx is not None else []


def _context(workload: Workload, seed: int, progress: Callable[[StepEvent], None] | None) -> RunContext:
    val = workload.val_batches(seed)
    test = workload.test_batches(seed) if workload.config.tuning else None
    log_dir = Path(workload.config.log_dir) if workload.config.log_dir else None
    return RunContext(val, test, workload.evaluate(workload.init_params(seed), val),
                      progress or (lambda event: None), log_dir)


def environment(device: str) -> dict[str, object]:
    """Versions and resources a reader needs to reproduce a run (recorded in the JSON)."""
    import platform

    import numpy

    from naig import __version__

    return {"naig": __version__, "torch": torch.__version__, "numpy": numpy.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "threads": torch.get_num_threads(), "device": device}
