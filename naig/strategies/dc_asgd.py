"""``dc-asgd``: delay-compensated gradients, then the mean (Zheng et al. 2017).

g̃_k = g_k + λ g_k ⊙ g_k ⊙ (θ_t − θ_{t−τ_k}),   ĝ = (1/K) Σ_k g̃_k,   λ = ``--dc-lambda``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from naig.strategies.base import Strategy, register, uniform_weights

__all__ = ["DCASGD"]


@register
class DCASGD(Strategy):
    """First-order Taylor compensation of the delay with the diagonal g⊙g Hessian proxy."""

    name = "dc-asgd"

    def combine(
        self, grads: Tensor, lags: Tensor, theta_now: Tensor, theta_stale: Tensor
    ) -> tuple[Tensor, Tensor]:
        """ĝ = mean_k(g_k + λ g_k² (θ_t − θ_{t−τ_k})); π_k = 1/K; see ``Strategy.combine``."""
        drift = theta_now.unsqueeze(0) - theta_stale  # (K, n)
        drift.mul_(grads).mul_(grads)  # g ⊙ g ⊙ Δθ, in place: one (K, n) temporary in all
        corrected = torch.add(grads, drift, alpha=self.options.dc_lambda)
        return corrected.mean(0), uniform_weights(grads)
