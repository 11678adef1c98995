"""``centered-clip``: one step of centered clipping around the previous update
(Karimireddy, He, Jaggi 2021).

    v ← v + (1/B) Σ_k clip(g_k − v, c),   clip(x, c) = x · min(1, c/‖x‖)   (whole-vector)

v starts at the previous aggregated gradient of this rule (0 before the first update),
one iteration; c = ``clip``, or ``"auto"``: c = median_k ‖g_k − v‖ (mean of the two
middle norms when B is even). A non-finite deviation (NaN/Inf gradient) is infinitely
far: its factor is 0 and it is left out of the sum. π_k = min(1, c/‖g_k − v‖)/B is the
coefficient of g_k in the new v (the rest, 1 − Σ π_k, stays on the previous v).

Source: S. P. Karimireddy, L. He, M. Jaggi, *Learning from History for Byzantine Robust
Optimization*, ICML 2021.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from naig.simulate.strategies.base import Batch, Strategy, StrategyOptions, Update, register, weighted_sum

__all__ = ["CenteredClip", "clip_radius"]


def clip_radius(norms: Tensor) -> float:
    """The auto radius: median of the (B,) deviation norms, non-finite ones counted as +∞.

    Example:
        >>> clip_radius(torch.tensor([1.0, 5.0, float("nan"), 3.0]))
        4.0
    """
    values = norms.nan_to_num(nan=math.inf).sort().values
    b = values.shape[0]
    return float((values[(b - 1) // 2] + values[b // 2]) / 2)


@register
class CenteredClip(Strategy):
    """v + mean_k clip(g_k − v, c), v the previous update."""

    name = "centered-clip"
    min_batch = 2

    def __init__(self, options: StrategyOptions) -> None:
        super().__init__(options)
        self.previous: Tensor | None = None  # v: the last update this rule returned

    def combine(self, batch: Batch) -> Update:
        """See the module docstring and ``Strategy.combine``."""
        grads = batch.grads
        v = grads.new_zeros(grads.shape[1]) if self.previous is None else self.previous
        deviations = grads - v  # (B, n)
        norms = torch.linalg.vector_norm(deviations, dim=1, dtype=torch.float64)
        c = clip_radius(norms) if self.options.clip == "auto" else float(self.options.clip)
        factor = torch.where(norms > 0, (c / norms).clamp(max=1.0), torch.ones_like(norms))
        factor = torch.where(torch.isfinite(norms), factor, torch.zeros_like(norms))
        pi = factor / grads.shape[0]
        out = v + weighted_sum(pi, deviations)
        self.previous = out.clone()
        return Update(out, pi)
