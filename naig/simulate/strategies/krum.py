"""``krum``: the gradient closest to its neighbours (Blanchard et al. 2017).

    score_k = Σ_{j ∈ N_k} ‖g_k − g_j‖²,   N_k = the m_n gradients nearest to g_k (j ≠ k)
    ĝ = g_{k*},   k* = argmin_k score_k   (ties to the first row),   π = one-hot on k*

m_n = B − f − 2 with f = ``byzantine``; Krum's guarantee needs B ≥ 2f + 3: below that the
rule runs with max(1, B − f − 2) neighbours and ``check`` warns. Squared distances are
accumulated in float64; a non-finite distance (a NaN/Inf gradient) counts as +∞.

Source: P. Blanchard, E. M. El Mhamdi, R. Guerraoui, J. Stainer, *Machine Learning with
Adversaries: Byzantine Tolerant Gradient Descent*, NeurIPS 2017.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from naig.simulate.strategies.base import Batch, Strategy, StrategyOptions, Update, register

__all__ = ["Krum", "krum_scores", "neighbours"]


def neighbours(b: int, f: int) -> int:
    """Krum's neighbour count: B − f − 2, at least 1, at most B − 1 (0 for B = 1)."""
    return min(b - 1, max(1, b - f - 2))


def krum_scores(grads: Tensor, f: int) -> Tensor:
    """score_k of each row of ``grads`` (B, n): (B,) float64, +∞ for rows far from every finite one.

    Example:
        >>> g = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [9.0, 9.0]])
        >>> krum_scores(g, 1).tolist()
        [1.0, 1.0, 4.0, 130.0]
    """
    b = grads.shape[0]
    dist = torch.full((b, b), math.inf, dtype=torch.float64)
    for i in range(b):
        for j in range(i + 1, b):
            norm = torch.linalg.vector_norm(grads[i] - grads[j], dtype=torch.float64)
            dist[i, j] = dist[j, i] = float(norm) ** 2
    dist = dist.nan_to_num(nan=math.inf)
    return dist.sort(1).values[:, :neighbours(b, f)].sum(1).nan_to_num(nan=math.inf)


@register
class Krum(Strategy):
    """ĝ = the gradient with the smallest Krum score."""

    name = "krum"
    min_batch = 3

    @classmethod
    def check(cls, options: StrategyOptions) -> tuple[str, ...]:
        """As ``Strategy.check``; warns when B < 2f + 3 (fewer neighbours than Krum assumes)."""
        warnings = super().check(options)
        b, f = options.batch_size, options.byzantine
        if b is not None and b < 2 * f + 3:
            warnings += (f"{cls.name}: {b} gradients per update < 2f + 3 = {2 * f + 3} "
                         f"(`byzantine` f = {f}); it runs with {neighbours(b, f)} neighbour(s) "
                         f"and without Krum's guarantee",)
        return warnings

    def combine(self, batch: Batch) -> Update:
        """See the module docstring and ``Strategy.combine``."""
        grads = batch.grads
        best = int(torch.argmin(krum_scores(grads, self.options.byzantine)))
        pi = torch.zeros(grads.shape[0], dtype=torch.float64, device=grads.device)
        pi[best] = 1.0
        return Update(grads[best].clone(), pi)
