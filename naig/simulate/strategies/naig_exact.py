"""``naig-exact``: as ``naig`` but with the sketch-free energy (isolates the sketch noise).

E_k = (8/3)(4/14) ‖g_k − g_R‖²: the expected sketched energy of a drift spread
evenly over g2 (E[‖S x‖²] = ‖x‖², a fraction 4/14 of it on the ridge, eigenvalue 8/3).
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

    def energies(self, grads: Tensor, ref: int) -> Tensor:
        """E_k = (8/3)(4/14) ‖g_k − g_R‖² as (K,) float64."""
        d = grads.to(torch.float64) - grads[ref].to(torch.float64)
        return EXACT_FACTOR * (d * d).sum(-1)
