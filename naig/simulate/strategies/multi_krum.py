"""``multi-krum``: the mean of the m gradients with the best Krum scores (Blanchard et al. 2017).

    ĝ = (1/m) Σ_{k ∈ M} g_k,   M = the m rows of smallest score_k (``krum_scores``; ties to
                                 the first rows),   m = B − f (at least 1),   π_k = 1/m on M

f = ``byzantine``; as ``krum``, B < 2f + 3 runs with max(1, B − f − 2) neighbours and warns.

Source: P. Blanchard, E. M. El Mhamdi, R. Guerraoui, J. Stainer, *Machine Learning with
Adversaries: Byzantine Tolerant Gradient Descent*, NeurIPS 2017 (Multi-Krum).
"""

from __future__ import annotations

import torch

from naig.simulate.strategies.base import Batch, StrategyOptions, Update, register, weighted_sum
from naig.simulate.strategies.krum import Krum, krum_scores

__all__ = ["MultiKrum"]


@register
class MultiKrum(Krum):
    """Average of the m = B − f best-scored gradients."""

    name = "multi-krum"

    @classmethod
    def needed_batch(cls, options: StrategyOptions) -> int:
        """3, and m = B − f ≥ 1."""
        return max(cls.min_batch, options.byzantine + 1)

    def combine(self, batch: Batch) -> Update:
        """See the module docstring and ``Strategy.combine``."""
        grads = batch.grads
        b = grads.shape[0]
        m = max(1, b - self.options.byzantine)
        order = torch.sort(krum_scores(grads, self.options.byzantine), stable=True).indices
        pi = torch.zeros(b, dtype=torch.float64)
        pi[order[:m]] = 1.0 / m
        pi = pi.to(grads.device)
        return Update(weighted_sum(pi, grads), pi)
