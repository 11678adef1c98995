"""``naig-exact``: as ``naig`` but with the sketch-free energy (isolates the sketch noise).

E_k = (8/3)(4/14) ‖g_k − g_R‖²: the expected sketched energy of a drift spread
evenly over g2 (E[‖S x‖²] = ‖x‖², a fraction 4/14 of it on the ridge, eigenvalue 8/3).
At window 1 the reference is an n-float EMA(0.9) of the applied gradients (float64),
as ``naig``'s sketch-space one (see ``naig.simulate.strategies.naig``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from naig.metric import E_MAX_FACTOR
from naig.simulate.strategies.base import register
from naig.simulate.strategies.naig import GibbsStrategy
from naig.sketch.core import SKETCH_DIM

__all__ = ["NAIGExact", "EXACT_FACTOR"]

EXACT_FACTOR = E_MAX_FACTOR * 4 / SKETCH_DIM  # (8/3)(4/14)


@register
class NAIGExact(GibbsStrategy):
    """Gibbs weights on E_k = (8/3)(4/14)‖g_k − g_R‖², computed in float64 in full dimension."""

    name = "naig-exact"

    def embed(self, grads: Tensor) -> Tensor:
        """g_k itself, (B, n) float64."""
        return grads.to(torch.float64)

    def energy_of(self, drifts: Tensor) -> Tensor:
        """E_k = (8/3)(4/14) ‖d_k‖² as (B,) float64."""
        return EXACT_FACTOR * (drifts * drifts).sum(-1)
