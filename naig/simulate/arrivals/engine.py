"""Gradient arrivals: staleness that emerges from worker speeds (docs/design.md §11).

Each worker computes on the parameter version it holds; its gradient reaches the server
at a time drawn from the arrival process (``naig.arrivals.ArrivalClock``: compute times,
message delays, blocking or non-blocking protocol). The server waits for B arrivals
(the window: B = 1 is plain asynchronous SGD, B = K is K-batch-async), and applies one
``ServerState.apply``; the version advances once per window and the staleness of each
gradient is measured, not set:

    for each update u:
        for b = 1..B:   (worker w, pulled version v, staleness τ) = clock.next_arrival()
                        g_b = ∇L(θ_v; next batch of worker w)
        ServerState.apply(g, τ, workers, θ_u, θ_v)       (faults → rule → step at lr × lr_scale)
        clock.applied()                                  (version u → u + 1)

Every rule of a seed sees the same arrival times (the clock's random streams depend
only on the seed) and the same minibatch streams, and gets the same gradient budget:
``steps × K`` gradients. ``sync`` instead runs ``steps`` synchronous rounds of K fresh
gradients (``SyncRoundsRun``), each costing the round time max_i C_i drawn from the same model.

Example:
    >>> from naig.simulate.config import SimulateConfig
    >>> from naig.simulate.workload import Workload
    >>> cfg = SimulateConfig.from_options(arrivals="exp:1,exp:2", steps=2, seeds=1, strategies=("hogwild",),
    ...                                   data_bytes=50_000, eval_every=0, eval_batches=1)
    >>> run = ArrivalsEngine.start(Workload(cfg), cfg.setting, cfg.run_rules, "hogwild", seed=0, lr=1e-3)
    >>> run.step(); run.t, run.gradients, run.time > 0
    (1, 1, True)
"""

from __future__ import annotations

import math
from array import array
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from naig.arrivals import ArrivalClock, ArrivalModel, RoundClock
from naig.simulate.arrivals.setting import ArrivalsSetting
from naig.simulate.engines.base import OnServer
from naig.simulate.faults import GRADIENT_FAULTS
from naig.simulate.lags.engine import LagsRun
from naig.simulate.runs import RunRules
from naig.simulate.server import ServerState
from naig.simulate.strategies import Batch, Strategy, make_strategy
from naig.simulate.workload import Workload

__all__ = ["ArrivalsEngine", "ArrivalRun", "SyncRoundsRun", "arrival_model", "staleness_summary"]


def arrival_model(workload: Workload, setting: ArrivalsSetting) -> ArrivalModel:
    """The setting's arrival process, messages of 4n bytes (one float32 gradient or θ)."""
    n_bytes = 4 * workload.n_params
    return setting.arrival_model(n_bytes, n_bytes)


class ArrivalRun(OnServer):
    """One (rule, seed, lr) run driven by gradient arrivals; ``step()`` makes one update.

    Attributes:
        state: the server (θ, optimizer, π history).
        t: server updates applied (windows the rule dropped do not count).
        gradients: gradients received so far (the budget is ``steps × K``).
        time: simulated seconds at the last arrival.
        staleness, sender: int64 arrays of the measured τ and the worker of every gradient received.
        diverged_at: update index at which θ became non-finite (None: finite).
    """

    clocked: ClassVar[bool] = True

    def __init__(self, workload: Workload, setting: ArrivalsSetting, rules: RunRules, rule: Strategy,
                 seed: int, lr: float) -> None:
        k = self.k = setting.workers
        self.workload, self.rule, self.name, self.seed, self.lr = workload, rule, rule.name, seed, lr
        self.state = ServerState(workload.init_params(seed), rule, rules.optimizer, lr, k, rules.faults,
                                 workload.fault_generator(seed))
        self.history = self.state.history
        self.clock = ArrivalClock(arrival_model(workload, setting), seed=seed)
        self.versions: dict[int, Tensor] = {0: self.theta.clone()}  # θ_v still needed
        self.gens = workload.worker_streams(seed, k)
        self.budget, b = rules.steps * k, setting.window
        self.window = b
        self.grads = self.theta.new_empty(b, self.theta.numel())  # (B, n)
        self.stale = self.theta.new_empty(b, self.theta.numel())  # (B, n)
        self.staleness = array("q")  # τ of every gradient received (memory: what ran, not the budget)
        self.sender = array("q")  # and the worker that sent it
        self.losses = torch.zeros(b, device=workload.device)
        self.t = self.gradients = self.windows = 0
        self.time = 0.0
        self.diverged_at: int | None = None
        self.saved: list[str] = []

    @property
    def train_loss(self) -> float:
        """Mean minibatch loss of the last window's gradients."""
        return float(self.losses.mean())

    @property
    def progress(self) -> int:
        """Step-equivalents done: gradients received // K (the fixed-lag engine's server steps)."""
        return self.gradients // self.k

    @property
    def updates_per_step(self) -> int:
        """K // B updates per step-equivalent."""
        return self.k // self.window

    def step(self) -> None:
        """Receive one window of B arrivals and apply it (no new version when the rule drops it)."""
        workers, taus = self._receive()
        update = self.state.apply(Batch(self.grads, taus, workers, self.theta, self.stale), step=self.t)
        self.windows += 1
        if update.lr_scale == 0.0:  # nothing survived (e.g. drop-stale): no update, same version
            return
        if self.state.diverged:
            self.t, self.diverged_at = self.t + 1, self.t
            return
        self.t = self.clock.applied()
        self.versions[self.t] = self.theta.clone()
        needed = self.clock.needed_versions()  # drop the versions no worker can still compute on
        for v in [v for v in self.versions if v not in needed]:
            del self.versions[v]

    def _receive(self) -> tuple[Tensor, Tensor]:
        """The next B arrivals: gradients at the versions their workers held."""
        b = self.grads.shape[0]
        workers, taus = torch.empty(b, dtype=torch.long), torch.empty(b, dtype=torch.long)
        for i in range(b):
            a = self.clock.next_arrival()
            theta_v = self.versions[a.pulled]
            self.stale[i] = theta_v
            self.losses[i] = self.workload.worker_grad(theta_v, self.gens[a.worker], self.grads[i])
            workers[i], taus[i] = a.worker, a.staleness
            self.staleness.append(a.staleness)
            self.sender.append(a.worker)
            self.gradients += 1
        self.time = self.clock.time
        device = self.workload.device
        return workers.to(device), taus.to(device)

    def communication(self) -> tuple[int, np.ndarray]:
        """Sequences consumed and bytes sent per worker: one 4n-byte gradient per arrival."""
        per = np.bincount(np.frombuffer(self.sender, dtype=np.int64), minlength=self.k)
        return int(per.sum()) * self.workload.config.batch_size, per * 4.0 * self.workload.n_params

    def result_fields(self) -> dict[str, Any]:
        """Measured staleness and the rule's mean correction."""
        tau, who = (np.frombuffer(a, dtype=np.int64) for a in (self.staleness, self.sender))
        return {"staleness": staleness_summary(tau, self.k, who),
                "correction": self.state.corrections.mean}


def staleness_summary(tau: np.ndarray, k: int, workers: np.ndarray) -> dict[str, object]:
    """Mean τ (and τ + 1), per-worker means, P(τ = 0) and max of measured staleness values.

    Args:
        tau: (N,) int64 staleness of each gradient.
        k: number of workers.
        workers: (N,) int64 the worker of each gradient.
    """
    if tau.size == 0:
        return {"mean": math.nan, "mean_plus_one": math.nan, "per_worker": [math.nan] * k,
                "p_zero": math.nan, "max": None}
    per = [float(tau[workers == w].mean()) if (workers == w).any() else math.nan for w in range(k)]
    return {"mean": float(tau.mean()), "mean_plus_one": float(tau.mean()) + 1.0, "per_worker": per,
            "p_zero": float((tau == 0).mean()), "max": int(tau.max())}


class SyncRoundsRun(LagsRun):
    """``sync`` on the arrival clock: ``steps`` rounds of K fresh gradients, each costing
    max_i C_i (a fresh draw of every worker's compute time)."""

    clocked: ClassVar[bool] = True

    def __init__(self, workload: Workload, setting: ArrivalsSetting, rules: RunRules, rule: Strategy,
                 seed: int, lr: float) -> None:
        super().__init__(workload, rules, rule, seed, lr, (0,) * setting.workers)
        self.rounds = RoundClock(arrival_model(workload, setting), seed=seed)

    def _advance(self) -> None:
        self.time += self.rounds.next_round()
        super()._advance()


class ArrivalsEngine:
    """Gradient arrivals: the rules defined in arrivals mode; ``sync`` as timed rounds."""

    NAME: ClassVar[str] = "arrivals"
    FAULT_KINDS: ClassVar[frozenset[str]] = GRADIENT_FAULTS

    @staticmethod
    def start(workload: Workload, setting: ArrivalsSetting, rules: RunRules, rule: str, seed: int,
              lr: float) -> ArrivalRun | SyncRoundsRun:
        """A run at its first arrival (``sync``: its first round)."""
        strategy = make_strategy(rule, rules.strategy_options(workload.sketch, lr))
        run = SyncRoundsRun if not strategy.uses_lags else ArrivalRun
        return run(workload, setting, rules, strategy, seed, lr)
