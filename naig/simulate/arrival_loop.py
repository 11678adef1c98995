"""Training on gradient arrivals: staleness that emerges from worker speeds (docs/design.md §11).

Each worker computes on the parameter version it holds; its gradient reaches the server
at a time drawn from the arrival process (``naig.arrivals.ArrivalClock``: compute times,
message delays, blocking or non-blocking protocol). The server waits for B arrivals
(the window: B = 1 is plain asynchronous SGD, B = K is K-batch-async), combines them
with the strategy and applies one update; the version advances once per window and the
staleness of each gradient is measured, not set:

    for each update u:
        for b = 1..B:   (worker w, pulled version v, staleness τ) = clock.next_arrival()
                        g_b = ∇L(θ_v; next batch of worker w)
        ĝ = strategy.combine(g, τ, workers, θ_u, θ_v)   → optimizer step (lr × lr_scale)
        clock.applied()                                  (version u → u + 1)

Every strategy of a seed sees the same arrival times (the clock's random streams depend
only on the seed) and the same minibatch streams, and gets the same gradient budget:
``steps × K`` gradients. ``sync`` instead runs ``steps`` synchronous rounds of K fresh
gradients, each costing the round time max_i C_i drawn from the same model.

Example:
    >>> from naig.simulate import Simulation, SimulateConfig
    >>> cfg = SimulateConfig(arrivals="exp:1,exp:2", steps=2, seeds=1, strategies=("hogwild",),
    ...                      data_bytes=50_000, eval_every=0, eval_batches=1)
    >>> run = Simulation(cfg).start("hogwild", seed=0)
    >>> run.step(); run.t, run.gradients, run.time > 0
    (1, 1, True)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from naig.arrivals import ArrivalClock, RoundClock
from naig.simulate.faults import apply_batch_faults
from naig.simulate.results import Corrections, record_weights
from naig.simulate.strategies import Batch, Strategy

if TYPE_CHECKING:
    from naig.simulate.loop import Simulation

__all__ = ["ArrivalRun", "SyncRoundClock"]


class ArrivalRun:
    """One (strategy, seed, lr) run driven by gradient arrivals; ``step()`` makes one update.

    Attributes:
        theta: (n,) server parameters (an ``nn.Parameter`` the optimizer owns).
        t: server updates applied (dropped windows do not count).
        gradients: gradients received so far (the budget is ``steps × K``).
        time: simulated seconds at the last arrival.
        pis: (max updates, K) float64 coefficient of each worker per update; NaN where a
            worker sent nothing in that window.
        staleness: (gradients,) int64 measured τ of every gradient received, in order.
        diverged_at: update index at which a gradient or θ became non-finite (None: finite).
    """

    def __init__(self, sim: Simulation, strategy: Strategy, seed: int, lr: float) -> None:
        c, k = sim.config, sim.config.workers
        self.sim, self.strategy, self.seed, self.lr = sim, strategy, seed, lr
        self.theta = nn.Parameter(sim.init_params(seed))
        self.optimizer = sim.make_optimizer(self.theta, lr)
        self.clock = ArrivalClock(sim.arrival_model, seed=seed)
        self.versions: dict[int, Tensor] = {0: self.theta.detach().clone()}  # θ_v still needed
        self.gens = [sim.generator(1_000_003 * seed + 7_919 * (w + 1)) for w in range(k)]
        self.budget = c.steps * k
        b = c.window
        self.grads = self.theta.detach().new_empty(b, self.theta.numel())  # (B, n)
        self.stale = self.theta.detach().new_empty(b, self.theta.numel())  # (B, n)
        self.pis = torch.full((-(-self.budget // b), k), math.nan, dtype=torch.float64)
        self.staleness = np.zeros(self.budget + b, dtype=np.int64)  # τ of every gradient received
        self.sender = np.zeros(self.budget + b, dtype=np.int64)  # and the worker that sent it
        self.losses = torch.zeros(b, device=sim.device)
        self.faults = c.fault_list
        self.fault_gen = sim.generator(1_000_003 * seed + 31_337)  # noise and random faults
        self.corrections = Corrections()
        self.t = self.gradients = self.windows = 0
        self.time = 0.0
        self.diverged_at: int | None = None

    @property
    def done(self) -> bool:
        """True once the gradient budget is spent (or the run diverged)."""
        return self.gradients >= self.budget or self.diverged_at is not None

    @property
    def train_loss(self) -> float:
        """Mean minibatch loss of the last window's gradients."""
        return float(self.losses.mean())

    def step(self) -> None:
        """Receive one window of B arrivals, combine them and apply one update.

        Injected faults change the gradients first; an update with ``lr_scale`` 0 applies
        nothing and the version stays; the run diverges when θ becomes non-finite.
        """
        workers, taus = self._receive()
        batch = Batch(self.grads, taus, workers, self.theta.detach(), self.stale)
        update = self.strategy.combine(apply_batch_faults(self.faults, batch, self.t, self.fault_gen))
        self.corrections.record(update)
        self.windows += 1
        if update.lr_scale == 0.0:  # nothing survived (e.g. drop-stale): no update, same version
            return
        record_weights(self.pis[self.t], workers, update.weights)
        self._apply(update.grad, update.lr_scale)
        if not bool(torch.isfinite(self.theta.detach().sum())):
            self.t, self.diverged_at = self.t + 1, self.t
            return
        self.t = self.clock.applied()
        self.versions[self.t] = self.theta.detach().clone()
        self._forget_versions()

    def _receive(self) -> tuple[Tensor, Tensor]:
        """The next B arrivals: gradients at the versions their workers held."""
        b = self.grads.shape[0]
        workers, taus = torch.empty(b, dtype=torch.long), torch.empty(b, dtype=torch.long)
        for i in range(b):
            a = self.clock.next_arrival()
            theta_v = self.versions[a.pulled]
            self.stale[i] = theta_v
            self.losses[i] = self.sim.worker_grad(theta_v, self.gens[a.worker], self.grads[i])
            workers[i], taus[i] = a.worker, a.staleness
            self.staleness[self.gradients], self.sender[self.gradients] = a.staleness, a.worker
            self.gradients += 1
        self.time = self.clock.time
        device = self.sim.device
        return workers.to(device), taus.to(device)

    def _apply(self, grad: Tensor, lr_scale: float) -> None:
        """One unchanged optimizer step on ĝ with the lr scaled by ``lr_scale`` for this step."""
        self.theta.grad = grad
        for g in self.optimizer.param_groups:
            g["lr"] = self.lr * lr_scale
        self.optimizer.step()

    def _forget_versions(self) -> None:
        """Drop the parameter versions no worker can still compute on."""
        needed = self.clock.needed_versions()
        for v in [v for v in self.versions if v not in needed]:
            del self.versions[v]

    @property
    def progress(self) -> int:
        """Step-equivalents done: gradients received // K (the lockstep mode's server steps)."""
        return self.gradients // self.sim.config.workers

    def staleness_summary(self) -> dict[str, object]:
        """Measured staleness of this run's gradients (see ``staleness_summary``)."""
        n = self.gradients
        return staleness_summary(self.staleness[:n], self.sim.config.workers, self.sender[:n])


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


class SyncRoundClock:
    """Simulated time for ``sync`` in arrival mode: each round costs max_i C_i (a fresh draw)."""

    def __init__(self, sim: Simulation, seed: int) -> None:
        self._clock = RoundClock(sim.arrival_model, seed=seed)
        self.time = 0.0

    def tick(self) -> float:
        """Advance by one synchronous round; returns the new simulated time (seconds)."""
        self.time += self._clock.next_round()
        return self.time
