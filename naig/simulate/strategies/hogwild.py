"""``hogwild``: the uniform mean of the stale gradients, ĝ = (1/K) Σ_k g_k (Recht et al. 2011)."""

from __future__ import annotations

from naig.simulate.strategies.base import Batch, Strategy, Update, register, uniform_weights

__all__ = ["Hogwild"]


@register
class Hogwild(Strategy):
    """ĝ = (1/K) Σ_k g_k with π_k = 1/K, lags ignored by the rule (but not by the workers)."""

    name = "hogwild"

    def combine(self, batch: Batch) -> Update:
        """Uniform mean; see ``Strategy.combine``."""
        return Update(batch.grads.mean(0), uniform_weights(batch.grads))
