"""``staleness``: staleness-aware averaging, ĝ = (1/K) Σ_k g_k / max(1, τ_k) (Zhang et al. 2016)."""

from __future__ import annotations

from naig.gibbs import combine
from naig.simulate.strategies.base import Batch, Strategy, Update, register

__all__ = ["Staleness"]


@register
class Staleness(Strategy):
    """π_k = 1 / (K max(1, τ_k)); the coefficients do not sum to 1 (stale steps shrink)."""

    name = "staleness"

    def combine(self, batch: Batch) -> Update:
        """Scale each gradient by 1/max(1, τ_k), then take the mean; see ``Strategy.combine``."""
        g = batch.grads
        pi = 1.0 / (g.shape[0] * batch.staleness.clamp(min=1).to(g.dtype))
        return Update(combine(pi, g), pi)
