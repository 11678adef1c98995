"""The strategy interface: combine K worker gradients into one update direction.

A strategy sees, at server step t, the stacked flat gradients g_k (K, n), the
lags τ_k, the current parameters θ_t and the stale parameters θ_{t−τ_k} at which
the gradients were taken, and returns the combined gradient ĝ (n,) — handed to
an unchanged torch optimizer — and the coefficients π (K,) with ĝ = Σ_k π_k g_k
(for ``dc-asgd`` the corrected gradients are what π weights).

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
    from naig.sketch_torch import TorchSketch

__all__ = ["StrategyOptions", "Strategy", "STRATEGIES", "register", "make_strategy", "uniform_weights"]


@dataclass(frozen=True)
class StrategyOptions:
    """Options shared by all strategies (each uses the ones it needs)."""

    beta: float | str = "auto"  # Gibbs inverse temperature (naig, naig-exact): float ≥ 0 or "auto"
    dc_lambda: float = 0.04  # DC-ASGD variance-control λ
    line: tuple[int, int, int] = (1, 2, 4)  # oriented Fano line ℓ of the metric Ψ_ℓ
    sketch: TorchSketch | None = None  # precomputed SPEC §2.5 sketch of the flat layout (naig)


class Strategy(ABC):
    """Base class of a gradient-combination rule.

    Attributes:
        name: registry name (the ``--strategies`` spelling).
        uses_lags: False when the rule is the synchronous ideal (all gradients at θ_t).
    """

    name: ClassVar[str]
    uses_lags: ClassVar[bool] = True

    def __init__(self, options: StrategyOptions) -> None:
        self.options = options

    @abstractmethod
    def combine(
        self, grads: Tensor, lags: Tensor, theta_now: Tensor, theta_stale: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Combine worker gradients.

        Args:
            grads: (K, n) float gradients, row k taken at θ_{t−τ_k}.
            lags: (K,) int64 lags τ_k (zeros for ``sync``).
            theta_now: (n,) current parameters θ_t.
            theta_stale: (K, n) parameters θ_{t−τ_k} (clamped at θ_0).

        Returns:
            ``(g_hat, pi)``: (n,) combined gradient in the dtype of ``grads`` and
            (K,) coefficients π on the same device.
        """


def uniform_weights(grads: Tensor) -> Tensor:
    """π_k = 1/K for the K rows of ``grads`` (K, n): (K,) float32 on their device."""
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
        raise UsageError(
            f"--strategies: unknown strategy {name!r}; use a comma list of {', '.join(STRATEGIES)}"
        )
    return STRATEGIES[name](options or StrategyOptions())
