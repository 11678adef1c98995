"""``dc-asgd``: delay-compensated gradients, then the mean (Zheng et al. 2017).

g̃_k = g_k + λ g_k ⊙ g_k ⊙ (θ_t − θ_{t−τ_k}),   ĝ = (1/B) Σ_k g̃_k,   λ = ``dc_lambda``.

The default λ = 20 was measured on the default workload (``benchmarks/dc_lambda.py``,
docs/design.md §12): it is the λ whose correction best predicts the gradient at θ_t
(least squares) at lr 3e-3 (λ* ≈ 19; ≈ 61 at lr 1e-3) and changes the stale gradients by
~5–10% of ‖g‖, where the old 0.04 changed them by ~0.02%. ``Update.correction``
reports ‖G̃ − G‖/‖G‖ so a no-op correction is visible.

Source: S. Zheng, Q. Meng, T. Wang, W. Chen, N. Yu, Z.-M. Ma, T.-Y. Liu, *Asynchronous
Stochastic Gradient Descent with Delay Compensation*, ICML 2017 (the constant-λ variant).
"""

from __future__ import annotations

import torch

from naig.simulate.strategies.base import (
    Batch,
    Strategy,
    Update,
    register,
    relative_correction,
    uniform_weights,
)

__all__ = ["DCASGD"]


@register
class DCASGD(Strategy):
    """First-order Taylor compensation of the delay with the diagonal g⊙g Hessian proxy."""

    name = "dc-asgd"

    def combine(self, batch: Batch) -> Update:
        """ĝ = mean_k(g_k + λ g_k² (θ_t − θ_{t−τ_k})); π_k = 1/B; see ``Strategy.combine``."""
        grads = batch.grads
        drift = batch.theta.unsqueeze(0) - batch.theta_stale  # (B, n)
        drift.mul_(grads).mul_(grads)  # g ⊙ g ⊙ Δθ, in place: one (B, n) temporary in all
        corrected = torch.add(grads, drift, alpha=self.options.dc_lambda)
        return Update(corrected.mean(0), uniform_weights(grads), 1.0,
                      relative_correction(corrected, grads))
