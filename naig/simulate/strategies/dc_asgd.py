"""``dc-asgd``: delay-compensated gradients, then the mean (Zheng et al. 2017).

g̃_k = g_k + λ g_k ⊙ g_k ⊙ (θ_t − θ_{t−τ_k}),   ĝ = (1/K) Σ_k g̃_k,   λ = ``dc_lambda``.
"""

from __future__ import annotations

import torch

from naig.simulate.strategies.base import Batch, Strategy, Update, register, uniform_weights

__all__ = ["DCASGD"]


@register
class DCASGD(Strategy):
    """First-order Taylor compensation of the delay with the diagonal g⊙g Hessian proxy."""

    name = "dc-asgd"

    def combine(self, batch: Batch) -> Update:
        """ĝ = mean_k(g_k + λ g_k² (θ_t − θ_{t−τ_k})); π_k = 1/K; see ``Strategy.combine``."""
        grads = batch.grads
        drift = batch.theta.unsqueeze(0) - batch.theta_stale  # (K, n)
        drift.mul_(grads).mul_(grads)  # g ⊙ g ⊙ Δθ, in place: one (K, n) temporary in all
        corrected = torch.add(grads, drift, alpha=self.options.dc_lambda)
        return Update(corrected.mean(0), uniform_weights(grads))
