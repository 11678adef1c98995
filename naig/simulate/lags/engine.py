"""Fixed lags: worker k's gradient is always τ_k server steps old (docs/design.md §8).

For each seed and rule (same θ_0, data streams and validation batches for every rule):

    θ_0 = GPT-2 init (seeded);  ring buffer of the last min(max τ, steps−1)+1 versions θ_v
    for t = 0 .. steps−1:
        g_k = ∇L(θ_{max(t−τ_k, 0)}; batch from worker k's own stream)   k = the joined workers
        ServerState.apply(g, τ, θ_t, θ_{t−τ})    (faults → rule → optimizer step; sync: every τ_k = 0)

A lag-τ worker joins at step τ (``warmup_theta0``: every worker from step 0, early
gradients at θ_0). The run diverges at the step where θ becomes non-finite.

Example:
    >>> from naig.simulate.config import SimulateConfig
    >>> from naig.simulate.workload import Workload
    >>> cfg = SimulateConfig.from_options(steps=2, seeds=1, strategies=("hogwild",), data_bytes=50_000,
    ...                                   eval_every=0, eval_batches=1)
    >>> run = LagsEngine.start(Workload(cfg), cfg.setting, cfg.run_rules, "hogwild", seed=0, lr=1e-3)
    >>> run.step(); run.t
    1
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from naig.errors import DataError, UsageError
from naig.gibbs import reference_index
from naig.io import save_gradients
from naig.simulate.engines.base import OnServer
from naig.simulate.faults import GRADIENT_FAULTS
from naig.simulate.lags.setting import LagsSetting, grads_folder
from naig.simulate.runs import RunRules
from naig.simulate.server import ServerState
from naig.simulate.strategies import Batch, Strategy, make_strategy
from naig.simulate.workload import Workload

__all__ = ["LagsEngine", "LagsRun", "ring_rows", "allocate_ring"]


class LagsRun(OnServer):
    """One (rule, seed, lr) run at fixed lags, advanced one server step at a time by ``step()``.

    Attributes:
        state: the server (θ, optimizer, π history).
        t: server steps done (steps before any worker joined included).
        ring: (R, n) parameter versions, version v at row v mod R (``ring_rows``).
        lags: (K,) int64 effective lags (zeros for rules that do not use lags, e.g. ``sync``).
        grads: (K, n) the last step's worker gradients.
    """

    clocked: ClassVar[bool] = False

    def __init__(self, workload: Workload, rules: RunRules, rule: Strategy, seed: int, lr: float,
                 lags: tuple[int, ...], warmup: bool = False,
                 save: tuple[str | None, tuple[int, ...]] = (None, ())) -> None:
        k, steps = len(lags), rules.steps
        self.workload, self.rule, self.name, self.seed, self.lr = workload, rule, rule.name, seed, lr
        self.steps, self.warmup, (self.save_dir, self.save_at) = steps, warmup, save
        self.state = ServerState(workload.init_params(seed), rule, rules.optimizer, lr, k, rules.faults,
                                 workload.fault_generator(seed))
        self.history = self.state.history
        theta = self.state.theta.detach()
        self.ring = allocate_ring(theta, ring_rows(lags, steps))
        self.ring[0] = theta
        effective = lags if rule.uses_lags else (0,) * k
        self.lags = torch.tensor(effective, dtype=torch.long, device=workload.device)
        self.workers = torch.arange(k, device=workload.device)
        self.gens = workload.worker_streams(seed, k)
        self.grads = theta.new_empty(k, theta.numel())
        self.losses = torch.zeros(k, device=workload.device)  # (K,) last minibatch loss per worker
        self.active_now = torch.zeros(k, dtype=torch.bool, device=workload.device)
        self.t, self.time = 0, 0.0
        self.diverged_at: int | None = None
        self.saved: list[str] = []

    @property
    def done(self) -> bool:
        """True after ``steps`` server steps (or once the run diverged)."""
        return self.t >= self.steps or self.diverged_at is not None

    @property
    def progress(self) -> int:
        """Server steps done."""
        return self.t

    @property
    def updates_per_step(self) -> int:
        """One update per server step."""
        return 1

    def active(self) -> Tensor:
        """(K,) bool: the workers that have joined by step t (a lag-τ worker joins at step τ)."""
        if self.warmup:
            return torch.ones_like(self.lags, dtype=torch.bool)
        return self.lags <= self.t

    def stale_params(self) -> Tensor:
        """θ_{t−τ_k} of every worker at the current step, clamped at θ_0: (K, n)."""
        rows = self.t - self.lags
        return self.ring[rows.clamp(min=0) % self.ring.shape[0]]

    def step(self) -> None:
        """One server step: the joined workers' gradients, one ``ServerState.apply``.

        A step with no joined worker (t < min τ) changes nothing but t.
        """
        t, active = self.t, self.active()
        if not bool(active.any()):
            self.history.next_row()  # no update: a NaN row
            self._advance()
            return
        self.state.apply(self._gradients(active), step=t)
        if self.state.diverged:
            self.t, self.diverged_at = t + 1, t
            return
        self._advance()

    def _gradients(self, active: Tensor) -> Batch:
        """The active workers' gradients at their stale parameters, as one ``Batch``."""
        stale = self.stale_params()  # (K, n)
        every = bool(active.all())
        rows = self.workers if every else self.workers[active]
        for w in rows.tolist():
            self.losses[w] = self.workload.worker_grad(stale[w], self.gens[w], self.grads[w])
        self.active_now = active
        if every:  # the common case: no (K, n) copies
            return Batch(self.grads, self.lags, self.workers, self.theta, stale)
        return Batch(self.grads[rows], self.lags[rows], rows, self.theta, stale[rows])

    def _advance(self) -> None:
        """t ← t + 1, and θ_{t+1} into the ring buffer."""
        self.t += 1
        self.ring[self.t % self.ring.shape[0]] = self.theta
        self._maybe_save()

    @property
    def train_loss(self) -> float:
        """Mean minibatch loss of the workers of the last step (NaN before any step)."""
        return float(self.losses[self.active_now].mean()) if bool(self.active_now.any()) else math.nan

    def communication(self) -> tuple[int, np.ndarray]:
        """Sequences consumed and bytes sent per worker: worker k sent at steps τ_k .. t − 1."""
        c = self.workload.config
        if self.warmup:
            per = np.full(len(self.lags), self.t)
        else:
            per = np.clip(self.t - self.lags.cpu().numpy(), 0, None)
        return int(per.sum()) * c.batch_size, per * 4.0 * self.workload.n_params

    def result_fields(self) -> dict[str, Any]:
        """The rule's mean correction (dc-asgd, gap-aware), else None."""
        return {"correction": self.state.corrections.mean}

    def _maybe_save(self) -> None:
        if self.save_dir is not None and self.t - 1 in self.save_at:
            self.saved += self.save_gradients(Path(self.save_dir))

    def save_gradients(self, root: Path) -> list[str]:
        """Write ref.safetensors (the least stale worker) and worker<k>.safetensors of the last
        step, for the workers that were active in it, as one folder: written into a new hidden
        folder of its own (``.RULE-seedK-stepT.XXXXXXXX.partial``) and renamed whole, so a run
        stopped mid-write (Ctrl-C, a full disk) never leaves a folder under the step's name with
        some workers' files missing (``naig audit`` would read it as the whole step); it leaves the
        hidden folder, which no later run touches.

        Raises:
            DataError: the step's folder could not take the rename (it appeared, or was filled,
                during the run); the hidden folder is removed.
        """
        t = self.t - 1
        name = grads_folder(self.name, self.seed, t)
        folder = root / name
        root.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=root))
        lags = self.lags.tolist()
        joined = [w for w in range(len(lags)) if self.warmup or lags[w] <= t]
        ref = joined[reference_index([lags[w] for w in joined])]
        files = []
        for w, file in [(ref, "ref")] + [(w, f"worker{w}") for w in joined]:
            tensors = self.workload.params(self.grads[w].clone())
            meta = dict(lag=lags[w], step=t, worker=w, strategy=self.name, seed=self.seed)
            files.append(save_gradients(partial / f"{file}.safetensors", tensors, **meta).name)
        try:
            os.replace(partial, folder)  # onto a missing or empty folder (LagsSetting.check_outputs)
        except OSError as exc:
            shutil.rmtree(partial, ignore_errors=True)
            raise DataError(f"{folder}: the step's gradient files could not be put there ({exc.strerror}); "
                            "it must be missing or an empty folder: remove it or give `save_grads` "
                            "another folder") from None
        return [str(folder / f) for f in files]


class LagsEngine:
    """Fixed lags: every rule of ``naig.simulate.strategies`` defined in lockstep mode."""

    NAME: ClassVar[str] = "lags"
    FAULT_KINDS: ClassVar[frozenset[str]] = GRADIENT_FAULTS

    @staticmethod
    def start(workload: Workload, setting: LagsSetting, rules: RunRules, rule: str, seed: int,
              lr: float) -> LagsRun:
        """A fixed-lag run at step 0 (θ_0 of ``seed``, a fresh optimizer at ``lr``)."""
        s = setting
        strategy = make_strategy(rule, rules.strategy_options(workload.sketch, lr))
        return LagsRun(workload, rules, strategy, seed, lr, s.lags, s.warmup_theta0,
                       (s.save_grads, s.save_at))


def ring_rows(lags: tuple[int, ...], steps: int) -> int:
    """Parameter versions the ring buffer must hold: min(max τ, steps − 1) + 1.

    Step t reads θ_{max(t−τ_k, 0)} for t ≤ steps − 1, then writes θ_{t+1}. With R rows
    (version v at row v mod R) a version is overwritten R steps after it was written.
    For R = max τ + 1 every version read at step t lies in [t − max τ, t]: none is
    overwritten yet, and θ_0 (row 0) is overwritten at step max τ, after the last step
    that clamps to it (t < τ ≤ max τ). For max τ ≥ steps − 1, R = steps holds θ_0 ..
    θ_{steps−1} in distinct rows; only θ_steps, never read, lands on θ_0's row.

    Example:
        >>> ring_rows((0, 10, 20, 35), steps=150), ring_rows((0, 500), steps=150)
        (36, 150)
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
