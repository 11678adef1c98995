"""``hogwild``: the uniform mean of the stale gradients, ĝ = (1/K) Σ_k g_k (Recht et al. 2011)."""

from __future__ import annotations

from torch import Tensor

from naig.strategies.base import Strategy, register, uniform_weights

__all__ = ["Hogwild"]


@register
class Hogwild(Strategy):
    """ĝ = (1/K) Σ_k g_k with π_k = 1/K, lags ignored by the rule (but not by the workers)."""

    name = "hogwild"

    def combine(
        self, grads: Tensor, lags: Tensor, theta_now: Tensor, theta_stale: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Uniform mean; see ``Strategy.combine``."""
        return grads.mean(0), uniform_weights(grads)
