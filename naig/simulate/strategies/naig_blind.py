"""``naig-blind``: NAIG's weights without the content (ablation; docs/design.md §12).

Batch reference (the freshest gradient R of the batch, as ``naig``)::

    π_R ∝ 1,   π_k ∝ e^{−1} (k ≠ R),   ĝ = Σ_k π_k g_k

— exactly what ``naig`` with auto-β gives when every non-reference energy is equal
(β = 1/E, so exp(−βE) = e^{−1}). At window 1 in arrival mode (EMA reference) every
arrival is applied with learning rate η·e^{−1} (``Update.lr_scale``). Comparing it
with ``naig`` shows how much of ``naig`` is content. Content-blind: a NaN gradient
gets π > 0 and the run diverges.
"""

from __future__ import annotations

import math

import torch

from naig.simulate.strategies.base import Batch, Update, reference_row, register, weighted_sum
from naig.simulate.strategies.naig import ReferenceStrategy

__all__ = ["NAIGBlind", "BLIND_WEIGHT"]

BLIND_WEIGHT = math.exp(-1.0)  # a non-reference gradient's unnormalised weight


@register
class NAIGBlind(ReferenceStrategy):
    """π_ref ∝ 1 and every other gradient ∝ e^{−1}; at window 1, lr η·e^{−1}."""

    name = "naig-blind"

    def combine(self, batch: Batch) -> Update:
        """See the module docstring and ``Strategy.combine``."""
        if self.ema_reference:
            grads = self.single(batch)
            w = torch.tensor([BLIND_WEIGHT], dtype=torch.float64, device=grads.device)
            return Update(grads[0].clone(), w, BLIND_WEIGHT)
        grads = batch.grads
        pi = torch.full((grads.shape[0],), BLIND_WEIGHT, dtype=torch.float64, device=grads.device)
        pi[reference_row(batch.staleness, batch.workers)] = 1.0
        pi /= pi.sum()
        return Update(weighted_sum(pi, grads), pi)
