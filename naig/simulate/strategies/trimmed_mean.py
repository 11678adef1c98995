"""``trimmed-mean``: per coordinate, drop the f largest and f smallest values, average the rest.

    ĝ_i = (1/(B − 2f)) Σ_{j=f}^{B−f−1} g_{(j),i}    (g_{(0),i} ≤ … ≤ g_{(B−1),i}, NaN last)

f = ``byzantine`` (default 1); the rule needs B ≥ 2f + 1. A smaller batch met at run
time (fixed-lag workers that have not joined yet) trims min(f, ⌊(B − 1)/2⌋).
π_k is the share of the averaged entries that row k supplies (Σ_k π_k = 1).

Source: D. Yin, Y. Chen, K. Ramchandran, P. Bartlett, *Byzantine-Robust Distributed
Learning: Towards Optimal Statistical Rates*, ICML 2018 (coordinate-wise trimmed mean).
"""

from __future__ import annotations

from naig.simulate.strategies.base import Batch, Strategy, StrategyOptions, Update, register
from naig.simulate.strategies.median import middle_mean

__all__ = ["TrimmedMean"]


@register
class TrimmedMean(Strategy):
    """Coordinate-wise mean of the middle B − 2f values."""

    name = "trimmed-mean"

    @classmethod
    def needed_batch(cls, options: StrategyOptions) -> int:
        """2f + 1."""
        return 2 * options.byzantine + 1

    @classmethod
    def size_hint(cls, options: StrategyOptions) -> str:
        """Trim fewer or combine more."""
        return "trimming f per side needs 2f + 1 gradients; use a smaller `byzantine` or more gradients"

    def combine(self, batch: Batch) -> Update:
        """See the module docstring and ``Strategy.combine``."""
        return middle_mean(batch.grads, min(self.options.byzantine, (batch.grads.shape[0] - 1) // 2))
