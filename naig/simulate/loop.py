"""Asynchronous training with stale workers, strategy by strategy (docs/design.md §8).

Protocol, for each seed and each strategy (same initialisation, same data
streams and same validation batches for every strategy of a seed):

    θ_0 = GPT-2 init (seeded);  ring buffer of the last min(max τ, steps−1)+1 versions θ_v
    for t = 0 .. steps−1:
        g_k = ∇L(θ_{max(t−τ_k, 0)}; batch from worker k's own generator)   k = 1..K
        ĝ, π = strategy.combine(g, τ, θ_t, θ_{t−τ})   (sync: every τ_k = 0)
        θ_{t+1} = optimizer.step(θ_t, ĝ)                (unchanged SGD or Adam)

Divergence: a run whose worker gradients or parameters become non-finite (NaN/Inf)
stops at that step t and is recorded as diverged (``RunResult.diverged_at = t``,
final loss NaN); the other runs go on.

Parameters live in one flat vector (n,); workers evaluate the model
functionally (``torch.func.functional_call``) at views of a stale flat vector,
so gradients land in a preallocated (K, n) buffer that the strategies and the
sketch use directly. All randomness comes from explicit ``torch.Generator``s.

Example:
    >>> cfg = SimulateConfig(steps=2, seeds=1, strategies=("hogwild",), data_bytes=50_000,
    ...                      eval_every=0, eval_batches=1)
    >>> sim = Simulation(cfg)
    >>> run = sim.start("hogwild", seed=0)
    >>> run.step(); run.t
    1
    >>> res = run_simulation(cfg)
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
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from naig.errors import UsageError
from naig.gibbs import reference_index
from naig.io import save_gradients
from naig.simulate.arrival_loop import ArrivalRun, SyncRoundClock
from naig.simulate.config import SimulateConfig, resolve_device
from naig.simulate.data import ByteData, load_bytes
from naig.simulate.faults import apply_batch_faults
from naig.simulate.local_loop import LocalRun, communication, is_local, start_local
from naig.simulate.model import GPT, get_preset, lm_loss
from naig.simulate.results import Corrections, RunResult, SimulateResult, pi_stats, record_weights, summarise
from naig.simulate.strategies import Batch, Strategy, make_strategy
from naig.sketch.core import SKETCH_DIM
from naig.sketch.torch_sketch import TorchSketch

__all__ = [
    "Simulation",
    "Run",
    "ROUTING_BYTES",
    "ring_rows",
    "allocate_ring",
    "run_simulation",
    "environment",
    "StepEvent",
    "RunContext",
]

ROUTING_BYTES = SKETCH_DIM * 4  # a worker's routing signal: 14 float32 values
_OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
}
Batches = list[tuple[Tensor, Tensor]]


class Simulation:
    """What every run of a simulation shares, built once: device, data, model layout, sketch.

    Args:
        config: the simulation (already validated by ``SimulateConfig``).

    Raises:
        UsageError: ``device`` cuda without a GPU.
        DataError: if the corpus is missing or too small.
    """

    def __init__(self, config: SimulateConfig) -> None:
        self.config = config
        self.device = torch.device(resolve_device(config.device))
        gcfg = get_preset(config.model)
        raw = load_bytes(config.data, config.data_bytes)
        self.data = ByteData.from_bytes(raw, self.device, test=config.tuning)
        self.data.check(gcfg.context)
        self.model = GPT(gcfg, generator=torch.Generator().manual_seed(0)).to(self.device)
        named = list(self.model.named_parameters())  # the layout only; values come per seed
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.sizes = [p.numel() for _, p in named]
        self.sketch = TorchSketch.build(list(zip(self.names, self.sizes, strict=True)),
                                        config.sketch_seed, self.device)
        n_bytes = 4 * self.n_params  # one float32 gradient or parameter message
        self.arrival_model = config.arrival_model(n_bytes, n_bytes) if config.asynchronous else None

    def make_optimizer(self, theta: nn.Parameter, lr: float) -> torch.optim.Optimizer:
        """The configured torch optimizer over θ, default settings besides ``lr``."""
        return _OPTIMIZERS[self.config.optimizer]([theta], lr=lr)

    @property
    def n_params(self) -> int:
        """n, the number of scalar parameters."""
        return sum(self.sizes)

    def params(self, flat: Tensor) -> dict[str, Tensor]:
        """{name: view of ``flat``} in the model's parameter shapes."""
        views = flat.split(self.sizes)
        return {n: v.view(s) for n, v, s in zip(self.names, views, self.shapes, strict=True)}

    def loss(self, flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """Next-byte loss of the model with parameters ``flat`` (n,) on one batch."""
        return lm_loss(functional_call(self.model, self.params(flat), (x,)), y)

    def init_params(self, seed: int) -> Tensor:
        """θ_0 for a seed: GPT-2 init from a CPU generator seeded with ``seed``, flat (n,)."""
        model = GPT(self.model.config, generator=torch.Generator().manual_seed(seed))
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).to(self.device)

    def generator(self, seed: int) -> torch.Generator:
        """A generator on the simulation's device seeded with ``seed``."""
        return torch.Generator(device=self.device).manual_seed(seed)

    def val_batches(self, seed: int) -> Batches:
        """Fixed validation batches of a seed (shared by every strategy)."""
        gen = self.generator(1_000_003 * seed + 99_991)
        c, ctx = self.config, self.model.config.context
        return [self.data.batch("val", 2 * c.batch_size, ctx, gen) for _ in range(c.eval_batches)]

    @torch.no_grad()
    def evaluate(self, flat: Tensor, batches: Batches) -> float:
        """Mean validation loss (nats/byte) of parameters ``flat`` over ``batches``."""
        return float(torch.stack([self.loss(flat, x, y) for x, y in batches]).mean())

    def worker_grad(self, theta: Tensor, gen: torch.Generator, out: Tensor) -> Tensor:
        """Write ∇L(θ; next batch of this worker's stream ``gen``) into ``out`` (n,).

        Returns:
            The minibatch loss L (a detached 0-d tensor on the device).
        """
        flat = theta.detach().clone().requires_grad_(True)
        x, y = self.data.batch("train", self.config.batch_size, self.model.config.context, gen)
        loss = self.loss(flat, x, y)
        (grad,) = torch.autograd.grad(loss, flat)
        out.copy_(grad)
        return loss.detach()

    def test_batches(self, seed: int) -> Batches:
        """Fixed test batches of a seed (only with a test split: learning-rate tuning)."""
        gen = self.generator(1_000_003 * seed + 104_729)
        c, ctx = self.config, self.model.config.context
        return [self.data.batch("test", 2 * c.batch_size, ctx, gen) for _ in range(c.eval_batches)]

    def strategy(self, name: str, lr: float | None = None) -> Strategy:
        """A fresh strategy object for one run at learning rate ``lr``, with the configured options."""
        return make_strategy(name, self.config.strategy_options(self.sketch, lr))

    def start(self, strategy: str | Strategy, seed: int,
              lr: float | None = None) -> Run | ArrivalRun | LocalRun:
        """A run at step 0: θ_0 of ``seed``, a fresh optimizer (``lr``: default the first
        configured), one data stream per worker.

        In arrival mode the run is an ``ArrivalRun`` (updates in arrival order), except for
        ``sync``, which runs synchronous rounds and pays each round's time. Local-update
        strategies (and naig in local mode) get a ``LocalRun`` (docs/design.md §13).
        """
        lr = self.config.lr[0] if lr is None else lr
        # Local updates (docs/design.md §13)
        if is_local(self.config, strategy if isinstance(strategy, str) else strategy.name):
            return start_local(self, strategy, seed, lr)
        strategy = self.strategy(strategy, lr) if isinstance(strategy, str) else strategy
        if self.config.asynchronous and strategy.uses_lags:
            return ArrivalRun(self, strategy, seed, lr)
        return Run(self, strategy, seed, lr)

    def run(self, strategy: str, seed: int, lr: float, ctx: RunContext) -> RunResult:
        """Train one (strategy, seed, lr) run to the end of its budget.

        Args:
            strategy, seed, lr: what to run.
            ctx: the seed's shared evaluation batches and the callbacks (progress, log).

        Returns:
            The ``RunResult``; the files it saved are appended to ``ctx.saved``.
        """
        run = self.start(strategy, seed, lr)
        curve, seconds = [(0, ctx.untrained)], [0.0]
        marks = [communication(run)]  # (samples, bytes sent per worker) at each curve point
        with ctx.open_log(strategy, seed, lr) as log:
            elapsed = self._steps(run, ctx, log, curve, seconds, marks)
        return self._result(run, ctx, curve, seconds, elapsed, marks)

    def _steps(self, run: Run | ArrivalRun | LocalRun, ctx: RunContext, log: _CsvLog,
               curve: list[tuple[int, float]], seconds: list[float], marks: list[tuple[int, Any]]) -> float:
        """Step a run to the end of its budget, evaluating, logging and saving on the way;
        returns the wall seconds spent in its steps (evaluations excluded)."""
        c, elapsed, done = self.config, 0.0, 0
        while not run.done:
            elapsed += _timed(self.device, run.step)
            if run.diverged_at is not None:
                break
            if isinstance(run, Run) and run.t - 1 in c.save_at:
                ctx.saved += run.save_gradients(Path(c.save_grads or "."))
            loss = None
            if run.progress > done and _evaluates(c, run.progress, done):
                loss = self.evaluate(run.theta.detach(), ctx.val)
                curve.append((run.t, loss))
                seconds.append(run.time)
                marks.append(communication(run))
            log(run, loss)
            if run.progress > done:
                done = run.progress
                ctx.progress(StepEvent(run.strategy.name, run.seed, run.lr, done, c.steps, loss, elapsed))
        return elapsed

    def _result(self, run: Run | ArrivalRun | LocalRun, ctx: RunContext, curve: list[tuple[int, float]],
                seconds: list[float], elapsed: float, marks: list[tuple[int, Any]]) -> RunResult:
        c = self.config
        if run.diverged_at is not None:  # NaN at the evaluation points that never came
            per_step = c.workers // c.window if isinstance(run, ArrivalRun) else 1  # updates per step
            curve += [(per_step * s, math.nan) for s in _remaining_evaluations(c, len(curve))]
        updates = run.t if run.diverged_at is None else run.diverged_at + 1
        test = None
        if ctx.test is not None:
            test = self.evaluate(run.theta.detach(), ctx.test) if run.diverged_at is None else math.nan
        staleness = run.staleness_summary() if isinstance(run, ArrivalRun) else None
        return RunResult(run.strategy.name, run.seed, curve[-1][1], tuple(curve),
                         ms_per_step=1000 * elapsed / max(updates, 1), diverged_at=run.diverged_at,
                         lr=run.lr, final_test_loss=test,
                         curve_seconds=tuple(seconds) if c.asynchronous else (),
                         updates=run.t, staleness=staleness,
                         correction=run.corrections.mean if hasattr(run, "corrections") else None,
                         **pi_stats(run.pis[:run.t].cpu().numpy()), **_communication_fields(run, marks))


# Local updates (docs/design.md §13)
def _communication_fields(run: Run | ArrivalRun | LocalRun, marks: list[tuple[int, Any]]) -> dict[str, Any]:
    """RunResult fields: samples and mean bytes sent per worker at each curve point, bytes per
    worker at the end, and a local-update run's method (H, outer optimizer, busy fractions)."""
    final = communication(run)[1]
    return dict(curve_samples=tuple(m[0] for m in marks),
                curve_bytes=tuple(float(m[1].mean()) for m in marks),
                bytes_per_worker=tuple(final.tolist()),
                local=run.describe() if isinstance(run, LocalRun) else None)


@dataclass(frozen=True)
class StepEvent:
    """What the progress callback hears after every server step of every run."""

    strategy: str
    seed: int
    lr: float
    step: int  # server steps done in this run
    steps: int  # server steps per run
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


class _CsvLog:
    """One row per server update: step, simulated seconds (arrival mode), train loss (mean over the
    update's gradients), val loss (at evaluation points), π_k (empty for workers not in it)."""

    def __init__(self, path: Path | None) -> None:
        self.fh = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.fh = path.open("w", newline="")
            self.writer = csv.writer(self.fh)
        self.header = False

    def __enter__(self) -> _CsvLog:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fh is not None:
            self.fh.close()

    def __call__(self, run: Run | ArrivalRun | LocalRun, loss: float | None) -> None:
        if self.fh is None or run.t == 0:
            return
        if not self.header:
            k = run.pis.shape[1]
            self.writer.writerow(["step", "time_s", "train_loss", "val_loss", *[f"pi_{w}" for w in range(k)]])
            self.header = True
        pis = ["" if math.isnan(p) else repr(p) for p in run.pis[run.t - 1].tolist()]
        seconds = repr(run.time) if run.sim.config.asynchronous else ""
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


def _evaluates(c: SimulateConfig, progress: int, before: int) -> bool:
    """True when progress (in steps) reached the end or crossed a multiple of ``eval_every``."""
    return progress >= c.steps or bool(c.eval_every and progress // c.eval_every > before // c.eval_every)


def _evaluation_points(c: SimulateConfig) -> list[int]:
    """The steps (step-equivalents in arrival mode) at which a run is evaluated, 0 included."""
    every = [s for s in range(c.eval_every, c.steps, c.eval_every)] if c.eval_every else []
    return [0, *every, c.steps]


def _remaining_evaluations(c: SimulateConfig, done: int) -> list[int]:
    """Evaluation points (as steps) a diverged run did not reach: ``done`` of them were."""
    return _evaluation_points(c)[done:]


class Run:
    """One (strategy, seed) run, advanced one server step at a time by ``step()``.

    Attributes:
        theta: (n,) server parameters θ_t (an ``nn.Parameter`` the optimizer owns).
        t: server steps done.
        ring: (R, n) parameter versions, version v at row v mod R (``ring_rows``).
        lags: (K,) int64 effective lags (zeros for ``sync``).
        grads: (K, n) the last step's worker gradients.
        pis: (steps, K) float64 coefficient history; rows ``:t`` are filled, NaN where a
            worker had not joined yet.
        diverged_at: step at which a gradient or θ became non-finite (None: finite).
    """

    def __init__(self, sim: Simulation, strategy: Strategy, seed: int, lr: float) -> None:
        c, k = sim.config, sim.config.workers
        self.sim, self.strategy, self.seed, self.lr = sim, strategy, seed, lr
        self.theta = nn.Parameter(sim.init_params(seed))
        self.optimizer = sim.make_optimizer(self.theta, lr)
        self.ring = allocate_ring(self.theta.detach(), ring_rows(c.lags, c.steps))
        self.ring[0] = self.theta.detach()
        lags = c.lags if strategy.uses_lags else (0,) * k
        self.lags = torch.tensor(lags, dtype=torch.long, device=sim.device)
        self.workers = torch.arange(k, device=sim.device)
        self.gens = [sim.generator(1_000_003 * seed + 7_919 * (w + 1)) for w in range(k)]
        self.grads = self.theta.detach().new_empty(k, self.theta.numel())
        self.pis = torch.full((c.steps, k), math.nan, dtype=torch.float64, device=sim.device)
        self.t = 0
        self.diverged_at: int | None = None
        self.losses = torch.zeros(k, device=sim.device)  # (K,) last minibatch loss per worker
        self.active_now = torch.zeros(k, dtype=torch.bool, device=sim.device)
        self.rounds = SyncRoundClock(sim, seed) if c.asynchronous else None  # sync pays round times
        self.faults = c.fault_list
        self.fault_gen = sim.generator(1_000_003 * seed + 31_337)  # noise and random faults
        self.corrections = Corrections()  # mean ‖g̃ − g‖/‖g‖ of correcting rules
        self.time = 0.0  # simulated seconds (arrival mode's sync only)

    @property
    def done(self) -> bool:
        """True after ``steps`` server steps (or once the run diverged)."""
        return self.t >= self.sim.config.steps or self.diverged_at is not None

    @property
    def progress(self) -> int:
        """Server steps done."""
        return self.t

    def active(self) -> Tensor:
        """(K,) bool: the workers that have joined by step t (a lag-τ worker joins at step τ).

        With ``warmup_theta0`` every worker is active from step 0 (its early gradients are
        taken at θ_0, the old protocol).
        """
        if self.sim.config.warmup_theta0:
            return torch.ones_like(self.lags, dtype=torch.bool)
        return self.lags <= self.t

    def stale_params(self) -> Tensor:
        """θ_{t−τ_k} of every worker at the current step, clamped at θ_0: (K, n)."""
        rows = self.t - self.lags
        return self.ring[rows.clamp(min=0) % self.ring.shape[0]]

    def step(self) -> None:
        """One server step: the active workers' gradients, the strategy's combine, one update.

        A step with no active worker (t < min τ) changes nothing but t. Injected faults
        change the gradients before the strategy sees them. An update with ``lr_scale`` 0
        makes no optimizer step. The run diverges (``diverged_at``) when θ_{t+1} is
        non-finite (SPEC: a non-finite gradient a rule leaves out is not a divergence).
        """
        t, active = self.t, self.active()
        self.pis[t] = math.nan  # inactive workers have no coefficient
        if not bool(active.any()):
            self._advance()
            return
        batch = self._gradients(active)
        update = self.strategy.combine(apply_batch_faults(self.faults, batch, t, self.fault_gen))
        record_weights(self.pis[t], batch.workers, update.weights)
        self.corrections.record(update)
        if update.lr_scale != 0.0:
            self._apply(update.grad, update.lr_scale)
        if not _finite(self.theta.detach()):
            self.t, self.diverged_at = t + 1, t
            return
        self._advance()

    def _gradients(self, active: Tensor) -> Batch:
        """The active workers' gradients at their stale parameters, as one ``Batch``."""
        stale = self.stale_params()  # (K, n)
        every = bool(active.all())
        rows = self.workers if every else self.workers[active]
        for w in rows.tolist():
            self.losses[w] = self.sim.worker_grad(stale[w], self.gens[w], self.grads[w])
        self.active_now = active
        if every:  # the common case: no (K, n) copies
            return Batch(self.grads, self.lags, self.workers, self.theta.detach(), stale)
        return Batch(self.grads[rows], self.lags[rows], rows, self.theta.detach(), stale[rows])

    def _advance(self) -> None:
        """t ← t + 1, and θ_{t+1} into the ring buffer (and a round's time for sync in arrival mode)."""
        self.t += 1
        if self.rounds is not None:
            self.time = self.rounds.tick()
        self.ring[self.t % self.ring.shape[0]] = self.theta.detach()

    def _apply(self, grad: Tensor, lr_scale: float) -> None:
        """One unchanged optimizer step on ĝ, its lr scaled by ``lr_scale`` for this step only."""
        self.theta.grad = grad
        if lr_scale == 1.0:
            self.optimizer.step()
            return
        groups = self.optimizer.param_groups
        lrs = [g["lr"] for g in groups]
        for g in groups:
            g["lr"] = g["lr"] * lr_scale
        self.optimizer.step()
        for g, lr in zip(groups, lrs, strict=True):
            g["lr"] = lr

    @property
    def train_loss(self) -> float:
        """Mean minibatch loss of the workers of the last step (NaN before any step)."""
        return float(self.losses[self.active_now].mean()) if bool(self.active_now.any()) else math.nan

    def save_gradients(self, root: Path) -> list[str]:
        """Write ref.safetensors (the least stale worker) and worker<k>.safetensors of the last
        step, for the workers that were active in it."""
        t = self.t - 1
        folder = root / f"{self.strategy.name}-seed{self.seed}-step{t}"
        lags = self.lags.tolist()
        joined = [w for w in range(len(lags)) if self.sim.config.warmup_theta0 or lags[w] <= t]
        ref = joined[reference_index([lags[w] for w in joined])]
        paths = []
        for w, name in [(ref, "ref")] + [(w, f"worker{w}") for w in joined]:
            tensors = self.sim.params(self.grads[w].clone())
            meta = dict(lag=lags[w], step=t, worker=w, strategy=self.strategy.name, seed=self.seed)
            paths.append(str(save_gradients(folder / f"{name}.safetensors", tensors, **meta)))
        return paths


def ring_rows(lags: tuple[int, ...], steps: int) -> int:
    """Parameter versions the ring buffer must hold: min(max τ, steps − 1) + 1.

    Step t reads θ_{max(t−τ_k, 0)} for t ≤ steps − 1, then writes θ_{t+1}. With R rows
    (version v at row v mod R) a version is overwritten R steps after it was written.
    For R = max τ + 1 every version read at step t lies in [t − max τ, t]: none is
    overwritten yet, and θ_0 (row 0) is overwritten at step max τ, after the last step
    that clamps to it (t < τ ≤ max τ). For max τ ≥ steps − 1, R = steps holds θ_0 ..
    θ_{steps−1} in distinct rows; only θ_steps, never read, lands on θ_0's row.
    """
    return min(max(lags), steps - 1) + 1


def allocate_ring(theta: Tensor, rows: int) -> Tensor:
    """An empty (rows, n) buffer like ``theta``.

    Raises:
        UsageError: (field ``lags``) when the memory cannot be allocated.
    """
    try:
        return theta.new_empty(rows, theta.numel())
    except (RuntimeError, MemoryError) as exc:  # torch's OutOfMemoryError is a RuntimeError
        gib = rows * theta.numel() * theta.element_size() / 2**30
        raise UsageError(
            f"the ring buffer of {rows:,} parameter versions needs {gib:,.1f} GiB and cannot be "
            f"allocated on {theta.device}; use smaller lags or fewer `steps`", field="lags",
        ) from exc


def _finite(x: Tensor) -> bool:
    """True when every entry is finite: one reduction (a sum of finite float32 values only
    overflows past 3e38, itself a divergence)."""
    return bool(torch.isfinite(x.sum()))


def run_simulation(config: SimulateConfig,
                   progress: Callable[[StepEvent], None] | None = None) -> SimulateResult:
    """Run every strategy on every seed (and every lr) and summarise (docs/design.md §8).

    Args:
        config: the simulation (validated on construction).
        progress: called after every server step of every run with a ``StepEvent``.

    Returns:
        A ``SimulateResult`` with one ``RunResult`` per (seed, strategy, lr) and one
        ``StrategySummary`` per strategy, in ``config.strategies`` order. A run that
        diverges stops there (``RunResult.diverged_at``, NaN loss); the others continue
        and nothing is raised (``SimulateResult.diverged`` lists them). Ctrl-C stops the
        simulation: the runs that finished are kept and ``interrupted`` is True.

    Raises:
        UsageError: ``device`` cuda without a GPU, or a ring buffer that does not fit.
        DataError: if the corpus is missing or too small.
    """
    sim = Simulation(config)
    runs: list[RunResult] = []
    untrained: list[float] = []
    saved: list[str] = []
    interrupted = False
    try:
        for seed in range(config.seeds):
            ctx = _context(sim, seed, progress)
            untrained.append(ctx.untrained)
            for name in config.strategies:
                runs += [sim.run(name, seed, lr, ctx) for lr in config.lr]
            saved += ctx.saved
    except KeyboardInterrupt:
        interrupted = True
    n = sim.n_params
    summaries, best = summarise(runs, config.strategies, "arrivals" if config.asynchronous else "lockstep")
    return SimulateResult(config, str(sim.device), n, statistics.fmean(untrained) if untrained else math.nan,
                          ROUTING_BYTES, n * 4, tuple(runs), summaries, tuple(saved),
                          environment(str(sim.device)), interrupted, best)


def _context(sim: Simulation, seed: int, progress: Callable[[StepEvent], None] | None) -> RunContext:
    val = sim.val_batches(seed)
    test = sim.test_batches(seed) if sim.config.tuning else None
    log_dir = Path(sim.config.log_dir) if sim.config.log_dir else None
    return RunContext(val, test, sim.evaluate(sim.init_params(seed), val),
                      progress or (lambda event: None), log_dir)


def environment(device: str) -> dict[str, object]:
    """Versions and resources a reader needs to reproduce a run (recorded in the JSON)."""
    import platform

    import numpy

    from naig import __version__

    return {"naig": __version__, "torch": torch.__version__, "numpy": numpy.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "threads": torch.get_num_threads(), "device": device}
