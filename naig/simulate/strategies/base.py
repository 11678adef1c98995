"""The strategy interface: combine a batch of worker gradients into one update.

At each server update a strategy sees a ``Batch``: the B gradients g_k (B, n) to apply
together, their staleness τ_k, the workers that sent them, the current parameters θ_t
and the (stale) parameters each gradient was computed at. It returns an ``Update``:
the combined gradient ĝ (n,), handed to an unchanged torch optimizer, the coefficient
π_k of each gradient (ĝ = Σ_k π_k g̃_k, with g̃_k = g_k unless the rule corrects it),
and a factor on the optimizer's learning rate for this update (1 for most rules).

A strategy object lives for one run, so a rule may keep state across updates
(an EMA, a previous update, per-worker statistics).

Adding a rule is one file: subclass ``Strategy``, set ``name``, implement
``combine`` and decorate the class with ``@register``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor

from naig.errors import UsageError

if TYPE_CHECKING:
    from naig.sketch.torch_sketch import TorchSketch

__all__ = [
    "Batch",
    "Update",
    "StrategyOptions",
    "Strategy",
    "STRATEGIES",
    "register",
    "make_strategy",
    "uniform_weights",
]


@dataclass(frozen=True)
class Batch:
    """The gradients one server update combines.

    Attributes:
        grads: (B, n) float gradients; row k was computed at ``theta_stale[k]``.
        staleness: (B,) int64 τ_k, server versions between ``theta_stale[k]`` and θ_t.
        workers: (B,) int64 index of the worker that sent each row.
        theta: (n,) the current parameters θ_t.
        theta_stale: (B, n) the parameters each gradient was computed at.
    """

    grads: Tensor
    staleness: Tensor
    workers: Tensor
    theta: Tensor
    theta_stale: Tensor


@dataclass(frozen=True)
class Update:
    """What a strategy hands the optimizer.

    Attributes:
        grad: (n,) combined gradient ĝ, in the dtype of the batch's gradients.
        weights: (B,) coefficient π_k of each gradient, on the gradients' device.
        lr_scale: factor on the optimizer's learning rate for this update.
    """

    grad: Tensor
    weights: Tensor
    lr_scale: float = 1.0


@dataclass(frozen=True)
class StrategyOptions:
    """Options shared by all strategies (each uses the ones it needs)."""

    beta: float | str = "auto"  # Gibbs inverse temperature (naig, naig-exact): float ≥ 0 or "auto"
    dc_lambda: float = 0.04  # DC-ASGD variance-control λ
    line: tuple[int, int, int] = (1, 2, 4)  # oriented Fano line ℓ of the metric Ψ_ℓ
    sketch: TorchSketch | None = None  # precomputed sketch of the flat layout (naig)


class Strategy(ABC):
    """Base class of a gradient-combination rule.

    Attributes:
        name: registry name (the spelling users list in ``strategies``).
        uses_lags: False when the rule is the synchronous ideal (all gradients at θ_t).
    """

    name: ClassVar[str]
    uses_lags: ClassVar[bool] = True

    def __init__(self, options: StrategyOptions) -> None:
        self.options = options

    @abstractmethod
    def combine(self, batch: Batch) -> Update:
        """Combine the batch's gradients into one update (see ``Batch`` and ``Update``)."""


def uniform_weights(grads: Tensor) -> Tensor:
    """π_k = 1/B for the B rows of ``grads`` (B, n): (B,) float32 on their device."""
    k = grads.shape[0]
    return torch.full((k,), 1.0 / k, device=grads.device)


STRATEGIES: dict[str, type[Strategy]] = {}


def register(cls: type[Strategy]) -> type[Strategy]:
    """Class decorator adding a strategy to ``STRATEGIES`` under ``cls.name``."""
    STRATEGIES[cls.name] = cls
    return cls


def make_strategy(name: str, options: StrategyOptions | None = None) -> Strategy:
    """Instantiate a registered strategy.

    Raises:
        UsageError: for an unknown name (the message lists the known ones).
    """
    if name not in STRATEGIES:
        raise UsageError(f"unknown strategy; use a comma list of {', '.join(STRATEGIES)}",
                         field="strategies", value=name)
    return STRATEGIES[name](options or StrategyOptions())
