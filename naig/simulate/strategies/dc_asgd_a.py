"""``dc-asgd-a``: adaptive delay compensation (Zheng et al. 2017, DC-ASGD-a).

One mean square per worker (as the authors' Multiverso updater keeps), updated with
each gradient the worker sends, before it is used:

    ms_k ← 0.95 ms_k + 0.05 g_k ⊙ g_k                      (ms_k = 0 before k's first gradient)
    g̃_k  = g_k + λ0 / √(ms_k + 1e-7) ⊙ g_k ⊙ g_k ⊙ (θ_t − θ_bak(k)),   λ0 = 2
    ĝ    = (1/B) Σ_k g̃_k,   π_k = 1/B

``Update.correction`` is ‖G̃ − G‖/‖G‖ over the batch.

Source: S. Zheng et al., *Asynchronous Stochastic Gradient Descent with Delay
Compensation*, ICML 2017 (adaptive λ_t = λ0/√(MeanSquare)).
"""

from __future__ import annotations

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

__all__ = ["DCASGDAdaptive", "LAMBDA0", "MS_DECAY", "MS_EPS"]

LAMBDA0 = 2.0  # λ0
MS_DECAY = 0.95  # ms ← 0.95 ms + 0.05 g²
MS_EPS = 1e-7  # inside the square root


@register
class DCASGDAdaptive(Strategy):
    """DC-ASGD with λ_k = λ0/√(ms_k + ε) per coordinate, one ms_k per worker."""

    name = "dc-asgd-a"

    def __init__(self, options: StrategyOptions) -> None:
        super().__init__(options)
        self.mean_square: dict[int, Tensor] = {}  # worker → (n,) ms_k

    def combine(self, batch: Batch) -> Update:
        """See the module docstring and ``Strategy.combine``."""
        grads = batch.grads
        corrected = grads.clone()
        for row, worker in enumerate(batch.workers.tolist()):
            g = grads[row]
            ms = self.mean_square.setdefault(worker, g.new_zeros(g.shape))
            ms.mul_(MS_DECAY).addcmul_(g, g, value=1 - MS_DECAY)
            term = (batch.theta - batch.theta_stale[row]).mul_(g).mul_(g)  # g ⊙ g ⊙ Δθ
            term.div_(ms.add(MS_EPS).sqrt_())
            corrected[row].add_(term, alpha=LAMBDA0)
        return Update(corrected.mean(0), uniform_weights(grads), 1.0,
                      relative_correction(corrected, grads))
