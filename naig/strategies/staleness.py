"""``staleness``: staleness-aware averaging, ĝ = (1/K) Σ_k g_k / max(1, τ_k) (Zhang et al. 2016)."""

from __future__ import annotations

from torch import Tensor

from naig.gibbs import combine
from naig.strategies.base import Strategy, register

__all__ = ["Staleness"]


@register
class Staleness(Strategy):
    """π_k = 1 / (K max(1, τ_k)); the coefficients do not sum to 1 (stale steps shrink)."""

    name = "staleness"

    def combine(
        self, grads: Tensor, lags: Tensor, theta_now: Tensor, theta_stale: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Scale each gradient by 1/max(1, τ_k), then take the mean; see ``Strategy.combine``."""
        pi = 1.0 / (grads.shape[0] * lags.clamp(min=1).to(grads.dtype))
        return combine(pi, grads), pi
