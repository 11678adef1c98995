"""``staleness-lr``: Zhang et al. 2016 as published — staleness scales the learning rate.

ĝ = (1/B) Σ_k g_k applied with learning rate η · (1/B) Σ_k 1/max(1, τ_k)
(``Update.lr_scale``); π_k = 1/B. Unlike ``staleness`` (which divides the gradients and
so is cancelled by Adam's normalisation), an lr scale survives Adam.

Source: W. Zhang, S. Gupta, X. Lian, J. Liu, *Staleness-Aware Async-SGD for Distributed
Deep Learning*, IJCAI 2016 (η/τ per gradient).
"""

from __future__ import annotations

from naig.simulate.strategies.base import Batch, Strategy, Update, register, uniform_weights

__all__ = ["StalenessLR"]


@register
class StalenessLR(Strategy):
    """Uniform mean, lr scaled by mean_k 1/max(1, τ_k)."""

    name = "staleness-lr"

    def combine(self, batch: Batch) -> Update:
        """See the module docstring and ``Strategy.combine``."""
        scale = float((1.0 / batch.staleness.clamp(min=1).double()).mean())
        return Update(batch.grads.mean(0), uniform_weights(batch.grads), scale)
