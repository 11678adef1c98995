"""``gap-aware``: divide each stale gradient by its gap counted in typical steps
(Barkai, Hakimi, Schuster 2020).

    C_k = 1 + |θ_t − θ_bak(k)| ⊘ s        (elementwise; s = the typical per-update step)
    g̃_k = g_k ⊘ C_k,   ĝ = (1/B) Σ_k g̃_k,   π_k = 1/B

The typical step s depends on the optimizer (docs/design.md §12):

- SGD: s = η (√v̂ + 1e-8), with v ← 0.999 v + 0.001 g⊙g over every gradient the server
  receives (in arrival order) and v̂ = v / (1 − 0.999^m) after m gradients (bias-corrected).
- Adam (which cancels a gradient's scale): s = EMA_0.9(|Δθ|), bias-corrected, with Δθ
  the step the optimizer actually applied (θ_t minus the θ this rule saw at its previous
  update); before any step s = 0. A coordinate with zero gap has C = 1; a non-zero gap
  over s = 0 gives C = ∞ (that coordinate of g̃_k is 0).

A fresh gradient has C = 1. ``Update.correction`` is ‖G̃ − G‖/‖G‖ over the batch.

Source: S. Barkai, I. Hakimi, A. Schuster, *Gap-Aware Mitigation of Gradient
Staleness*, ICLR 2020.
"""

from __future__ import annotations

import math

from torch import Tensor

from naig.simulate.strategies.base import (
    Batch,
    Strategy,
    StrategyOptions,
    Update,
    register,
    relative_correction,
    uniform_weights,
)

__all__ = ["GapAware", "V_DECAY", "STEP_DECAY", "V_EPS"]

V_DECAY = 0.999  # SGD: v ← 0.999 v + 0.001 g²
STEP_DECAY = 0.9  # Adam: EMA_0.9(|Δθ|)
V_EPS = 1e-8  # SGD: η(√v̂ + 1e-8)


@register
class GapAware(Strategy):
    """g̃_k = g_k ⊘ (1 + |θ_t − θ_bak(k)| ⊘ s), s the typical step of the optimizer."""

    name = "gap-aware"

    def __init__(self, options: StrategyOptions) -> None:
        super().__init__(options)
        self.ema: Tensor | None = None  # SGD: v (of g²); Adam: EMA of |Δθ|
        self.count = 0  # SGD: gradients received; Adam: steps observed (for bias correction)
        self.last_theta: Tensor | None = None  # Adam: θ at the previous update

    def typical_step(self, batch: Batch) -> Tensor:
        """s (n,): η(√v̂ + 1e-8) under SGD, bias-corrected EMA_0.9(|Δθ|) under Adam."""
        if self.options.optimizer == "sgd":
            return self._sgd_step(batch.grads)
        return self._adam_step(batch.theta)

    def _sgd_step(self, grads: Tensor) -> Tensor:
        if self.ema is None:
            self.ema = grads.new_zeros(grads.shape[1])
        for g in grads:
            self.ema.mul_(V_DECAY).addcmul_(g, g, value=1 - V_DECAY)
            self.count += 1
        v_hat = self.ema / (1 - V_DECAY ** self.count)
        return v_hat.sqrt_().add_(V_EPS).mul_(self.options.lr)

    def _adam_step(self, theta: Tensor) -> Tensor:
        if self.ema is None:
            self.ema = theta.new_zeros(theta.shape)
        if self.last_theta is not None:
            self.ema.mul_(STEP_DECAY).add_((theta - self.last_theta).abs_(), alpha=1 - STEP_DECAY)
            self.count += 1
        self.last_theta = theta.detach().clone()
        if self.count == 0:
            return self.ema.clone()  # zeros: no step observed yet
        return self.ema / (1 - STEP_DECAY ** self.count)

    def combine(self, batch: Batch) -> Update:
        """See the module docstring and ``Strategy.combine``."""
        grads = batch.grads
        step = self.typical_step(batch)
        gap = (batch.theta.unsqueeze(0) - batch.theta_stale).abs_()  # (B, n)
        ratio = gap.div_(step).nan_to_num_(nan=0.0, posinf=math.inf)  # 0/0 (no gap) → C = 1; x/0 → ∞
        corrected = grads / ratio.add_(1)
        return Update(corrected.mean(0), uniform_weights(grads), 1.0,
                      relative_correction(corrected, grads))
