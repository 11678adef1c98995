"""The server update: the one place where a simulation changes θ (docs/design.md §8).

Every engine (fixed lags, arrivals, the rounds of local updates, the real parameter
server) hands a ``Batch`` to ``ServerState.apply``, which does, in this order:

    faults active at this update  → the batch's rows change in place (what faulty workers send)
    update = rule.combine(batch)  → ĝ, π_k, lr_scale, correction
    record π and the correction   → a (K,) row of the weight history (NaN: sent nothing)
    optimizer step on ĝ at lr · lr_scale (none when lr_scale is 0: nothing survived)
    finiteness of θ               → ``diverged``

The engines decide *when* (which gradients, at which versions); the rule decides *how*
(``Batch → Update``); the optimizer is torch's, unchanged.

Example:
    >>> import torch
    >>> from naig.simulate.strategies import Batch, make_strategy
    >>> state = ServerState(torch.zeros(2), make_strategy("hogwild"), "sgd", lr=0.5, workers=2)
    >>> g = torch.tensor([[1.0, 0.0], [3.0, 2.0]])
    >>> _ = state.apply(Batch(g, torch.tensor([0, 1]), torch.tensor([0, 1]), state.theta.detach(),
    ...                       torch.zeros(2, 2)), step=0)
    >>> state.theta.detach().tolist(), state.history.rows().tolist(), state.diverged
    ([-1.0, -0.5], [[0.5, 0.5]], False)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from naig.simulate.faults import Fault, apply_faults
from naig.simulate.strategies.base import Batch, Update
from naig.simulate.workload import make_optimizer

__all__ = ["Rule", "ServerState", "WeightHistory", "Corrections", "record_weights", "finite"]


class Rule(Protocol):
    """Anything that combines a ``Batch`` into an ``Update`` (the strategies, pseudo-gradient rules)."""

    name: str

    def combine(self, batch: Batch) -> Update:
        """ĝ, π, lr scale and correction of one batch."""


class Corrections:
    """Running mean of ``Update.correction`` (‖g̃ − g‖/‖g‖ of the rules that correct gradients)."""

    def __init__(self) -> None:
        self.total, self.count = 0.0, 0

    def record(self, update: Update) -> None:
        """Add one update's correction (ignored when the rule has none or it is not finite)."""
        if update.correction is not None and math.isfinite(update.correction):
            self.total, self.count = self.total + update.correction, self.count + 1

    @property
    def mean(self) -> float | None:
        """The mean correction, or None when the rule corrects nothing."""
        return self.total / self.count if self.count else None


def record_weights(row: np.ndarray, workers: Any, weights: Any) -> None:
    """Write one update's coefficients into its (K,) row of a π history, in place.

    The row is NaN for workers that sent nothing; a worker that sent several gradients in
    one window gets the sum of their weights.

    Args:
        row: (K,) float64 array.
        workers: (B,) int64 worker of each gradient (tensor, array or list).
        weights: (B,) coefficient of each gradient (tensor, array or list).

    Example:
        >>> row = np.zeros(3)
        >>> record_weights(row, [2, 0, 2], [0.25, 0.5, 0.25]); row.tolist()
        [0.5, nan, 0.5]
    """
    if isinstance(weights, Tensor):
        weights = weights.detach().to(torch.float64).cpu().numpy()
    if isinstance(workers, Tensor):
        workers = workers.cpu().numpy()
    idx, w = np.asarray(workers, dtype=np.int64), np.asarray(weights, dtype=np.float64)
    row[:] = math.nan
    row[idx] = 0.0
    np.add.at(row, idx, w)


class WeightHistory:
    """The (updates, K) float64 history of π, grown one row per update (memory: what ran).

    Rows are NaN for workers that sent nothing in an update; an all-NaN row is a step
    without an update (fixed lags before any worker joined).
    """

    _CHUNK = 1024

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._data = np.full((0, workers), math.nan)
        self.count = 0

    def next_row(self) -> np.ndarray:
        """A new row, NaN everywhere, appended; returns it (a view to fill)."""
        if self.count == len(self._data):
            grown = np.full((max(self._CHUNK, 2 * len(self._data)), self.workers), math.nan)
            grown[:self.count] = self._data[:self.count]
            self._data = grown
        self.count += 1
        return self._data[self.count - 1]

    def record(self, workers: Any, weights: Any) -> None:
        """Append the row of one update (``record_weights``)."""
        record_weights(self.next_row(), workers, weights)

    def rows(self) -> np.ndarray:
        """(updates, K) float64, a view."""
        return self._data[:self.count]

    def last(self) -> np.ndarray | None:
        """The last row, or None before any."""
        return self._data[self.count - 1] if self.count else None


def finite(x: Tensor) -> bool:
    """True when every entry is finite: one reduction (a sum of finite float32 values only
    overflows past 3e38, itself a divergence)."""
    return bool(torch.isfinite(x.sum()))


class ServerState:
    """θ, its optimizer, the faults and the records of one run; ``apply`` is the only update.

    Args:
        theta0: (n,) initial parameters (copied into an ``nn.Parameter``).
        rule: the combination rule (``Batch → Update``).
        optimizer: a key of ``naig.simulate.workload.OPTIMIZERS``.
        lr: the base learning rate η (each step uses η · ``lr_scale``).
        workers: K, the width of the weight history.
        faults: injected faults, applied to each batch before the rule sees it.
        fault_generator: the generator of the faults' random draws (noise, random).
        **optimizer_options: passed to the optimizer (e.g. ``momentum``, ``nesterov``).

    Attributes:
        theta: (n,) the parameters (an ``nn.Parameter`` the optimizer owns).
        history: the π of every update. corrections: the mean correction of the rule.
        updates: optimizer steps made. diverged: True once θ is non-finite.
    """

    def __init__(self, theta0: Tensor, rule: Rule, optimizer: str, lr: float, workers: int,
                 faults: Sequence[Fault] = (), fault_generator: torch.Generator | None = None,
                 **optimizer_options: object) -> None:
        self.theta = nn.Parameter(theta0)
        self.rule, self.lr = rule, lr
        self.optimizer = make_optimizer(optimizer, [self.theta], lr, **optimizer_options)
        self.faults, self.fault_generator = tuple(faults), fault_generator
        self.history = WeightHistory(workers)
        self.corrections = Corrections()
        self.updates = 0
        self.diverged = False

    def apply(self, batch: Batch, step: int) -> Update:
        """Faults active at ``step`` → ``rule.combine`` → ``commit``; returns the update.

        Args:
            batch: the gradients of this update (their rows change in place under faults).
            step: the update's index for the faults' ``@STEP`` (the engine's clock).
        """
        if self.faults:
            apply_faults(self.faults, batch.grads, batch.workers, step, self.fault_generator)
        update = self.rule.combine(batch)
        self.corrections.record(update)
        self.commit(update, batch.workers)
        return update

    def commit(self, update: Update, workers: Any) -> None:
        """Record π and make one optimizer step on ĝ at lr · ``lr_scale`` (none at 0); check θ."""
        if update.lr_scale == 0.0:  # nothing survived: no step (Adam's moments stay)
            return
        self.history.record(workers, update.weights)
        self.theta.grad = update.grad
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr * update.lr_scale
        self.optimizer.step()
        self.updates += 1
        self.diverged = not finite(self.theta.detach())
