"""``median``: the coordinate-wise median of the batch (robust aggregation).

    ĝ_i = median_k g_{k,i}   for every coordinate i (the mean of the two middle values
                             when B is even)

Content-aware like NAIG but with no trusted reference: up to ⌈B/2⌉ − 1 arbitrary
gradients (NaN included: sorted last) cannot move ĝ outside the range of the others.
π_k is the fraction of ĝ's coordinates that row k supplies (a middle value counts
1/2 when B is even), so Σ_k π_k = 1.

Source: D. Yin, Y. Chen, K. Ramchandran, P. Bartlett, *Byzantine-Robust Distributed
Learning: Towards Optimal Statistical Rates*, ICML 2018 (coordinate-wise median).
"""

from __future__ import annotations

import torch
from torch import Tensor

from naig.simulate.strategies.base import Batch, Strategy, Update, register

__all__ = ["Median", "row_coverage", "middle_mean"]


def row_coverage(indices: Tensor, rows: int) -> Tensor:
    """Fraction of the entries of ``indices`` (any shape, row numbers) equal to each row.

    Returns:
        (rows,) float64 summing to 1.

    Example:
        >>> row_coverage(torch.tensor([[0, 2], [2, 2]]), 3).tolist()
        [0.25, 0.0, 0.75]
    """
    counts = torch.bincount(indices.reshape(-1), minlength=rows).to(torch.float64)
    return counts / indices.numel()


def middle_mean(grads: Tensor, t: int) -> Update:
    """Coordinate-wise mean of the sorted values t .. B − t − 1 (NaN sorted last), with π_k the
    share of those entries row k supplies: the median for t = ⌊(B − 1)/2⌋, the trimmed mean
    for t = f.

    Args:
        grads: (B, n) the batch's gradients.
        t: values dropped at each end, 0 ≤ t ≤ ⌊(B − 1)/2⌋.

    Example:
        >>> u = middle_mean(torch.tensor([[1.0], [5.0], [3.0], [100.0]]), 1)
        >>> u.grad.tolist(), u.weights.tolist()
        ([4.0], [0.0, 0.5, 0.5, 0.0])
    """
    values, order = grads.sort(0)  # NaN sorts last
    b = values.shape[0]
    return Update(values[t : b - t].mean(0), row_coverage(order[t : b - t], b))


@register
class Median(Strategy):
    """ĝ = coordinate-wise median; π_k = share of coordinates row k supplies."""

    name = "median"
    min_batch = 3

    @classmethod
    def size_hint(cls, options: object) -> str:
        """Why 3."""
        return "with 2 gradients the median is the mean; use more workers or a larger `window`"

    def combine(self, batch: Batch) -> Update:
        """See the module docstring and ``Strategy.combine``."""
        return middle_mean(batch.grads, (batch.grads.shape[0] - 1) // 2)
