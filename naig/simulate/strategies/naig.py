"""``naig``: Gibbs-weighted combination by Fano–Fisher energy of the sketched drift.

With the reference R = the least stale gradient of the batch (the first one on ties),
as in docs/design.md §5–§7:

    d_k = S g_k − S g_R ∈ R^14          (the sketch, fixed seed)
    E_k = d_kᵀ Ψ_ℓ d_k                   (Fano–Fisher energy)
    π_k = exp(−β E_k) / Σ_j exp(−β E_j)  (β = ``beta``; "auto": 1 / median positive E)
    ĝ   = Σ_k π_k g_k
"""

from __future__ import annotations

from abc import abstractmethod

import numpy as np
import torch
from torch import Tensor

from naig.energy import energy
from naig.errors import DataError
from naig.gibbs import combine, gibbs_weights, reference_index, resolve_beta
from naig.metric import fano_fisher_metric
from naig.simulate.strategies.base import Batch, Strategy, StrategyOptions, Update, register

__all__ = ["NAIG", "GibbsStrategy"]


class GibbsStrategy(Strategy):
    """Shared body of ``naig`` and ``naig-exact``: energies → Gibbs weights → MGE combine."""

    @abstractmethod
    def energies(self, grads: Tensor, ref: int) -> Tensor:
        """(K,) float64 energies of each worker's drift from the reference row ``ref``."""

    def combine(self, batch: Batch) -> Update:
        """ĝ = Σ_k π_k g_k with π = Gibbs(E); see ``Strategy.combine``.

        When no energy is finite (every gradient, or the reference, is NaN/Inf) no
        worker can be preferred: π is uniform and ĝ is the (non-finite) mean, as for
        ``hogwild``, so the caller sees the divergence instead of an exception.
        """
        grads = batch.grads
        e = self.energies(grads, reference_index(batch.staleness.tolist()))
        e = e.detach().cpu().numpy().astype(np.float64)
        try:
            pi = torch.from_numpy(gibbs_weights(e, resolve_beta(self.options.beta, e)))
        except DataError:
            pi = torch.full((grads.shape[0],), 1.0 / grads.shape[0], dtype=torch.float64)
        pi = pi.to(grads.device)
        return Update(combine(pi, grads), pi)


@register
class NAIG(GibbsStrategy):
    """Energies from the 14-dimensional sketch and the rank-4 metric Ψ_ℓ."""

    name = "naig"

    def __init__(self, options: StrategyOptions) -> None:
        super().__init__(options)
        if options.sketch is None:
            raise ValueError("the naig strategy needs StrategyOptions.sketch (a TorchSketch)")
        self.sketch = options.sketch
        psi = torch.from_numpy(fano_fisher_metric(options.line))
        self.psi = psi.to(options.sketch.signs.device)  # (14, 14) float64

    def energies(self, grads: Tensor, ref: int) -> Tensor:
        """E_k = (S g_k − S g_R)ᵀ Ψ (S g_k − S g_R), sketch accumulated in float64."""
        sketched = self.sketch(grads)  # (K, 14) float64
        return energy(sketched - sketched[ref], self.psi)
