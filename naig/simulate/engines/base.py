"""The engine interface: how a simulated run is started and stepped (docs/design.md §8).

An *engine* is one way of producing the gradients a server update combines: fixed lags
(``naig.simulate.lags``), gradient arrivals (``arrivals.engine``, with ``sync`` as timed
rounds), the rounds and gossip of local updates (``arrivals.local``, ``arrivals.gossip``), or
real processes (``naig.simulate.distributed``): each lives in its setting's package. Each
simulated engine is one module with one ``start(workload, setting, rules, rule, seed, lr) → Run``
(its own setting and the ``RunRules``, never the whole config tree); which
engine runs a rule is decided in one place, ``naig.simulate.engines.select``. Every
update goes through ``naig.simulate.server.ServerState.apply``.

A ``Run`` is advanced by ``step()`` until ``done``; ``naig.simulate.experiment`` drives
it (evaluations, logs, the result) without asking which engine made it.

Each engine declares the fault kinds it applies (``FAULT_KINDS``) and the rules it runs;
``check`` refuses the rest with a one-line ``UsageError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
from torch import Tensor

if TYPE_CHECKING:
    from naig.simulate.server import ServerState, WeightHistory

__all__ = ["Run", "Engine", "NoWorkerLeft", "OnServer"]


class Run(Protocol):
    """One (rule, seed, lr) run of a simulated engine, advanced one update (or event) at a time.

    Attributes:
        name: the rule's name. seed, lr: the run's seed and learning rate.
        t: server updates (outer steps) done.
        time: simulated seconds so far (0.0 for engines without a clock).
        clocked: True when the engine has a simulated clock (curves get seconds).
        diverged_at: the update at which θ became non-finite (None: finite).
        history: the π of every update. saved: gradient files written.
    """

    name: str
    seed: int
    lr: float
    t: int
    time: float
    clocked: ClassVar[bool]
    diverged_at: int | None
    history: WeightHistory
    saved: list[str]

    @property
    def done(self) -> bool:
        """True once the budget is spent (or the run diverged)."""

    @property
    def progress(self) -> int:
        """Step-equivalents done (server steps; gradients // K with a clock)."""

    @property
    def theta(self) -> Tensor:
        """(n,) the parameters evaluated."""

    @property
    def train_loss(self) -> float:
        """Mean minibatch loss of the last update's gradients."""

    @property
    def updates_per_step(self) -> int:
        """Server updates per step-equivalent (where a diverged run's missing points would lie)."""

    def step(self) -> None:
        """Advance by one update (or event)."""

    def communication(self) -> tuple[int, np.ndarray]:
        """Sequences consumed and (K,) float64 bytes sent per worker so far."""

    def result_fields(self) -> dict[str, Any]:
        """The engine's own ``RunResult`` fields (staleness, correction, local method)."""


class Engine(Protocol):
    """A simulated engine module's interface (``naig.simulate.lags.engine`` and its siblings)."""

    NAME: ClassVar[str]
    FAULT_KINDS: ClassVar[frozenset[str]]

    def start(self, workload: Any, setting: Any, rules: Any, rule: str, seed: int, lr: float) -> Run:
        """A run of ``rule`` at step 0 from the workload, this engine's setting (``naig.simulate.settings``)
        and the ``naig.simulate.runs.RunRules``: never the whole config tree."""


class NoWorkerLeft(Exception):
    """An engine with worker processes has none left: the runs not started cannot run."""


class OnServer:
    """A run whose θ lives in a ``ServerState`` (every engine but gasloc's gossip).

    Attributes:
        state: θ, the optimizer, the faults and the π history.
        gradients, budget: minibatch gradients consumed, and the run's budget (steps × K).
        diverged_at: the update at which θ became non-finite.
    """

    state: ServerState
    gradients: int
    budget: int
    diverged_at: int | None

    @property
    def theta(self) -> Tensor:
        """(n,) the server's parameters."""
        return self.state.theta.detach()

    @property
    def done(self) -> bool:
        """True once the gradient budget is spent (or the run diverged)."""
        return self.gradients >= self.budget or self.diverged_at is not None
