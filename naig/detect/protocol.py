"""The protocol of ``naig detect``: real gradients of K ranks, a fault per kind on a copy, every score.

K ranks compute gradients of the small GPT (``naig.simulate``: its model, byte-level text and
per-worker minibatch streams) on their own streams at a shared θ. θ trains synchronously
(Adam) on the *clean* mean, so a fault never changes the trajectory and every detector sees
the same steps. The first ``warmup`` steps only train and fill the individual histories;
at each later step

- the clean step is scored (every rank is clean: these scores calibrate the thresholds and
  measure the false alarms);
- for each fault cell (kind × magnitude) one rank drawn at random sends the faulty gradient
  instead of its own (a copy of the clean gradients with that row replaced; stale and
  bad-data gradients are computed at θ_{t−τ} or on the corrupted batch) and every detector
  scores every rank.

Seeds 0..N−1 are split in order into calibration seeds (clean steps only: the thresholds),
validation seeds (choosing the default detector) and test seeds (the reported figures). Each
seed s has its own initialisation, minibatch streams (``stream_seed``) and fault draws
(``fault_seed``), as ``naig simulate``'s.

Example:
    >>> cfg = DetectConfig(ranks=3, steps=2, warmup=3, window=3, calibration=1, validation=0, test=1,
    ...                    faults=("scale",), false_alarm=0.2, batch_size=2, context=16, data_bytes=50_000)
    >>> runs = run_protocol(cfg)
    >>> [(r.role, r.clean.shape, r.faulted.shape) for r in runs]
    [('calibration', (2, 10, 3), (0, 2, 10, 3)), ('test', (2, 10, 3), (7, 2, 10, 3))]
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from naig.detect.faults import (
    DEFAULT_MAGNITUDES,
    FaultCell,
    apply_gradient_fault,
    catalogue,
    corrupt_batch,
    parse_kinds,
)
from naig.detect.scores import BLOCKS, DETECTORS, Scorer, StepStats
from naig.errors import DataError, UsageError
from naig.monitor.signals import MonitorSketch
from naig.simulate.model import get_preset
from naig.simulate.workload import Workload, WorkloadConfig, fault_seed, make_optimizer
from naig.sketch.core import check_seed
from naig.threads import check_threads

__all__ = ["DetectConfig", "SeedRun", "ROLES", "run_protocol", "run_seed", "build_workload", "faulty_grad"]

ROLES = ("calibration", "validation", "test")
MAX_SEEDS = 10_000
MAX_PROTOCOL_STEPS = 1_000_000  # scored steps (warm-up + steps) of one per-step protocol run
REPLICA_SEED = 1_000_000  # the other initialisation of seed s (``replica``) is that of seed s + this


@dataclass(frozen=True)
class DetectConfig:
    """Everything that determines a ``naig detect`` run (defaults: a few minutes on 2 CPU cores).

    Raises:
        UsageError: naming the bad field and the fix (on construction).
    """

    ranks: int = 8  # K data-parallel ranks
    steps: int = 40  # scored steps per seed (after the warm-up)
    warmup: int = 20  # training steps before scoring (fill the individual histories; ≥ window, ≥ max τ)
    calibration: int = 6  # calibration seeds (clean steps: the thresholds)
    validation: int = 2  # validation seeds (the default detector)
    test: int = 3  # test seeds (the reported figures)
    faults: tuple[str, ...] | str | None = None  # fault kinds (None: every kind but replica)
    false_alarm: float = 1e-3  # per rank-step, the rate every threshold is calibrated to
    window: int = 16  # clean steps in the individual histories
    batch_size: int = 8  # sequences per rank minibatch
    context: int = 64  # bytes per sequence (≤ the model's context)
    lr: float = 1e-3  # Adam learning rate of the clean training
    model: str = "gpt-nano"  # model preset
    data: str | None = None  # text file (None: the stdlib's .py files)
    data_bytes: int = 1_000_000  # the first this many bytes of the text
    sketch_seed: int = 0  # the monitor sketch's seed (blocks seed … seed + 3)
    threads: int = 1  # torch CPU threads (the model is small: more threads only contend on shared cores)

    def __post_init__(self) -> None:
        object.__setattr__(self, "faults", parse_kinds(self.faults))
        ints = {"ranks": 3, "steps": 1, "warmup": 0, "calibration": 1, "validation": 0, "test": 1,
                "window": 3, "batch_size": 1, "context": 2, "data_bytes": 1}
        for name, low in ints.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise UsageError(f"must be an int >= {low}", field=name, value=v)
        check_threads(self.threads)
        seeds = self.calibration + self.validation + self.test
        if seeds > MAX_SEEDS:
            role = max(ROLES, key=lambda r: getattr(self, r))
            raise UsageError(f"too many seeds: `calibration` + `validation` + `test` = {seeds:,}, at most "
                             f"{MAX_SEEDS:,}; use a smaller `{role}`", field=role, value=getattr(self, role))
        if self.steps + self.warmup > MAX_PROTOCOL_STEPS:
            name = "steps" if self.steps >= self.warmup else "warmup"
            raise UsageError(f"too many steps: `warmup` + `steps` = {self.steps + self.warmup:,}, at most "
                             f"{MAX_PROTOCOL_STEPS:,}; use a smaller `{name}`", field=name,
                             value=getattr(self, name))
        fa = self.false_alarm
        if isinstance(fa, bool) or not isinstance(fa, int | float) or not 0 < fa < 0.5:
            raise UsageError("must be a rate in (0, 0.5), e.g. 0.001", field="false_alarm", value=fa)
        if isinstance(self.lr, bool) or not isinstance(self.lr, int | float) or not (
                math.isfinite(self.lr) and self.lr > 0):
            raise UsageError("must be a finite float > 0, e.g. 1e-3", field="lr", value=self.lr)
        ctx = get_preset(self.model).context
        if self.context > ctx:
            raise UsageError(f"at most the model's context {ctx}", field="context", value=self.context)
        self._check_warmup()
        check_seed(self.sketch_seed, "sketch_seed")
        check_seed(self.sketch_seed + BLOCKS - 1, "sketch_seed")
        if self.calibration_samples * self.false_alarm < 1:
            need = math.ceil(1 / (self.false_alarm * self.ranks * self.steps))
            head = (f"{self.calibration_samples:,} clean rank-steps cannot set a threshold at a false-alarm "
                    f"rate of {self.false_alarm:g}")
            room = MAX_SEEDS - self.validation - self.test  # the most calibration seeds allowed
            if need <= room:
                raise UsageError(f"{head}; use at least {need} calibration seeds (or more `steps`, or a "
                                 "larger `false_alarm`)", field="calibration", value=self.calibration)
            rate = 1 / self.calibration_samples
            raise UsageError(f"{head}: that needs {need:,} calibration seeds at `steps` {self.steps} and "
                             f"`ranks` {self.ranks}, more than the {MAX_SEEDS:,} seeds allowed in all; use a "
                             f"`false_alarm` of at least {rate:.2g}, or more `steps` (`calibration` × "
                             f"`steps` × `ranks` must reach 1/`false_alarm` = {1 / self.false_alarm:,.0f})",
                             field="calibration", value=self.calibration)

    def _check_warmup(self) -> None:
        need = max(self.window, self.max_tau)
        if self.warmup < need:
            why = f"the individual `window` ({self.window})" + (
                f" and the largest stale τ of `faults` ({self.max_tau})" if self.max_tau else "")
            verb = "need" if self.max_tau else "needs"
            raise UsageError(f"must be at least {need}: {why} {verb} that many steps of history",
                             field="warmup", value=self.warmup)

    @property
    def max_tau(self) -> int:
        """The largest staleness of the catalogue's ``stale`` cells (0 without them)."""
        return int(max(DEFAULT_MAGNITUDES["stale"])) if "stale" in self.faults else 0

    @property
    def calibration_samples(self) -> int:
        """Clean rank-steps behind each threshold."""
        return self.calibration * self.steps * self.ranks

    def score_bytes(self) -> int:
        """Memory of the scores kept for the report: every seed's clean and faulted (D, K) rows, float64."""
        per_step = len(DETECTORS) * self.ranks * 8
        scored = self.validation + self.test
        return self.steps * per_step * (self.calibration + scored * (1 + len(self.cells)))

    @property
    def cells(self) -> tuple[FaultCell, ...]:
        """Every fault cell of the run."""
        return catalogue(self.faults)

    def seeds(self, role: str) -> range:
        """The seeds of a role (calibration first, then validation, then test)."""
        c, v = self.calibration, self.validation
        return {"calibration": range(c), "validation": range(c, c + v),
                "test": range(c + v, c + v + self.test)}[role]

    def to_dict(self) -> dict:
        """Plain values (faults as a list)."""
        d = dataclasses.asdict(self)
        d["faults"] = list(self.faults)
        return d


@dataclass(frozen=True, eq=False)
class SeedRun:
    """The scores of one seed.

    Attributes:
        seed: the run seed.
        role: ``calibration``, ``validation`` or ``test``.
        clean: (steps, D, K) float64, each detector's score per rank at each clean step.
        faulted: (C, steps, D, K) float64, the same with cell c's fault on rank ``ranks[c, t]``
            (C = 0 for calibration seeds).
        ranks: (C, steps) int64, the faulty rank of each cell and step.
        rel_change: (C, steps) float64 ‖g' − g‖/‖g‖ of the faulty rank (float64; inf/NaN kept).
    """

    seed: int
    role: str
    clean: np.ndarray
    faulted: np.ndarray
    ranks: np.ndarray
    rel_change: np.ndarray


class _Context:
    """What every seed of a run shares: the workload (data, model layout) and the monitor sketch."""

    def __init__(self, cfg: DetectConfig) -> None:
        self.cfg = cfg
        _check_score_memory(cfg)
        self.wl = build_workload(cfg)
        rows = 3 * cfg.ranks + cfg.max_tau + 6  # float32 grads, float64 copy, θ history, Adam, faults
        self.wl.check_memory(rows, "ranks")
        layout = list(zip(self.wl.names, self.wl.sizes, strict=True))
        self.sketch = MonitorSketch.build(layout, cfg.sketch_seed, BLOCKS)

    def grad(self, theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """∇L(θ; x, y) (n,) float32."""
        flat = theta.detach().clone().requires_grad_(True)
        (g,) = torch.autograd.grad(self.wl.loss(flat, x, y), flat)
        return g


def _check_score_memory(cfg: DetectConfig) -> None:
    """Refuse a run whose kept scores would not fit in memory (naming ``steps``).

    Raises:
        UsageError: when ``score_bytes`` exceeds the memory available.
    """
    from naig.arrivals.engine import available_bytes

    need, free = cfg.score_bytes(), available_bytes()
    if free is not None and need > free:
        default = DetectConfig.__dataclass_fields__
        sizes = ("ranks", "steps", *ROLES)  # blame the option furthest above its default
        name = max(sizes, key=lambda f: getattr(cfg, f) / max(1, default[f].default))
        seeds = cfg.calibration + cfg.validation + cfg.test
        role = f" (`{name}` {getattr(cfg, name)})" if name in ROLES else ""
        raise UsageError(f"`ranks` {cfg.ranks} × `steps` {cfg.steps} × {seeds:,} seeds{role} × "
                         f"{len(cfg.cells)} fault cells: the scores of the run need {need / 2**30:,.1f} GiB, "
                         f"more than the {free / 2**30:,.1f} GiB available; use a smaller `{name}` (or fewer "
                         "seeds or `faults`)")


def build_workload(cfg: DetectConfig) -> Workload:
    """The simulator's workload (text, model layout) for a detect run.

    Raises:
        DataError: a missing or too small text.
    """
    return Workload(WorkloadConfig(model=cfg.model, data=cfg.data, data_bytes=cfg.data_bytes,
                                   batch_size=cfg.batch_size, eval_batches=1, sketch_seed=cfg.sketch_seed))


def run_protocol(cfg: DetectConfig, advance: Callable[[int], None] | None = None) -> list[SeedRun]:
    """Every seed of every role, in seed order.

    Args:
        cfg: the run.
        advance: called with 1 after each step of each seed (a progress bar).
    """
    before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        ctx = _Context(cfg)
        return [run_seed(ctx, seed, role, advance) for role in ROLES for seed in cfg.seeds(role)]
    finally:
        torch.set_num_threads(before)


def run_seed(ctx: _Context, seed: int, role: str, advance: Callable[[int], None] | None = None) -> SeedRun:
    """One seed: warm-up, then clean and faulted scores at each step (see the module)."""
    cfg, wl = ctx.cfg, ctx.wl
    cells = () if role == "calibration" else cfg.cells
    k, steps = cfg.ranks, cfg.steps
    theta = torch.nn.Parameter(wl.init_params(seed))
    opt = make_optimizer("adam", [theta], cfg.lr)
    streams = wl.worker_streams(seed, k)
    gen = torch.Generator().manual_seed(fault_seed(seed))
    rng = np.random.default_rng(fault_seed(seed))
    past: deque[Tensor] = deque(maxlen=cfg.max_tau + 1)
    offset = wl.init_params(REPLICA_SEED + seed) - theta.detach() if "replica" in cfg.faults else None
    scorer = Scorer(k, cfg.window)
    clean = np.zeros((steps, len(DETECTORS), k))
    faulted = np.zeros((len(cells), steps, len(DETECTORS), k))
    ranks = np.zeros((len(cells), steps), dtype=np.int64)
    change = np.zeros((len(cells), steps))
    for t in range(cfg.warmup + steps):
        past.append(theta.detach().clone())
        batches = [wl.data.batch("train", cfg.batch_size, cfg.context, s) for s in streams]
        grads = torch.stack([ctx.grad(theta, x, y) for x, y in batches])
        stats = StepStats.of(grads, ctx.sketch)
        i = t - cfg.warmup
        for c, cell in enumerate(cells if i >= 0 else ()):
            r = int(rng.integers(k))
            bad = faulty_grad(ctx, cell, grads[r], batches[r], past, gen, offset)
            ranks[c, i] = r
            change[c, i] = _rel_change(bad, grads[r])
            faulted[c, i] = scorer.scores(stats.with_row(r, bad, ctx.sketch))
        scores = scorer.scores(stats, commit=True)
        if i >= 0:
            clean[i] = scores
        theta.grad = grads.mean(0)
        if not bool(torch.isfinite(theta.grad).all()):  # no detector result is true of a diverged run
            raise DataError(f"the clean training diverged (non-finite gradients at step {t + 1} of seed "
                            f"{seed}); lower the learning rate, e.g. 1e-3", field="lr", value=cfg.lr)
        opt.step()
        if advance is not None:
            advance(1)
    return SeedRun(seed, role, clean, faulted, ranks, change)


def faulty_grad(ctx: _Context, cell: FaultCell, grad: Tensor, batch: tuple[Tensor, Tensor],
                 past: deque[Tensor], gen: torch.Generator, offset: Tensor | None = None) -> Tensor:
    """What the faulty rank sends at this step instead of ``grad`` (n,).

    Args:
        ctx: the run's context (its ``grad(θ, x, y)`` and text).
        cell: the fault.
        grad: the rank's clean gradient at the current θ.
        batch: the rank's (x, y) of this step.
        past: θ of the last steps, ``past[-1]`` the current one (``stale`` reads ``past[-1 − τ]``).
        gen: the generator of the fault's draws.
        offset: θ₀′ − θ₀ (n,), another initialisation minus this seed's (``replica`` only).
    """
    if cell.kind == "stale":
        return ctx.grad(past[-1 - int(cell.magnitude)], *batch)
    if cell.kind == "replica":
        return ctx.grad(past[-1] + cell.magnitude * offset, *batch)
    if cell.kind.startswith("data-"):
        x, y = corrupt_batch(cell, *batch, ctx.wl.data.train, gen)
        return ctx.grad(past[-1], x, y)
    return apply_gradient_fault(cell, grad, gen, ctx.wl.sizes)


def _rel_change(bad: Tensor, grad: Tensor) -> float:
    """‖g' − g‖ / ‖g‖ in float64 (inf or NaN for a non-finite g')."""
    b, g = bad.to(torch.float64), grad.to(torch.float64)
    norm = float(torch.linalg.vector_norm(g))
    return float(torch.linalg.vector_norm(b - g)) / norm if norm > 0 else math.nan
