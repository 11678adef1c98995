"""``naig``: Gibbs-weighted combination by Fano–Fisher energy of the sketched drift (SPEC §2.7).

With the reference R = the min-lag worker at this step (the first one on ties):

    d_k = S g_k − S g_R ∈ R^14          (SPEC §2.5 sketch, fixed seed)
    E_k = d_kᵀ Ψ_ℓ d_k                   (SPEC §2.4)
    π_k = exp(−β E_k) / Σ_j exp(−β E_j)  (β = ``--beta``; "auto": 1 / median positive E)
    ĝ   = Σ_k π_k g_k
"""

from __future__ import annotations

from abc import abstractmethod

import numpy as np
import torch
from torch import Tensor

from naig.errors import DataError
from naig.gibbs import combine, gibbs_weights, resolve_beta
from naig.metric import fano_fisher_metric
from naig.strategies.base import Strategy, StrategyOptions, register

__all__ = ["NAIG", "GibbsStrategy", "reference_index", "sketch_energies", "gibbs_pi"]


def reference_index(lags: Tensor) -> int:
    """Index of the first worker with the smallest lag."""
    return int(torch.argmin(lags))


def sketch_energies(sketched: Tensor, ref: int, psi: Tensor) -> Tensor:
    """E_k = d_kᵀ Ψ d_k with d_k = sketched[k] − sketched[ref]; (K, 14) → (K,) float64."""
    d = sketched - sketched[ref]
    return ((d @ psi) * d).sum(-1)  # dᵀΨd per row; (K, 14) → (K,)


def gibbs_pi(energies: Tensor, beta: float | str) -> Tensor:
    """Gibbs weights (``naig.gibbs``) of (K,) energies, returned as float64 on their device."""
    e = energies.detach().cpu().numpy().astype(np.float64)
    pi = gibbs_weights(e, resolve_beta(beta, e))
    return torch.from_numpy(pi).to(energies.device)


class GibbsStrategy(Strategy):
    """Shared body of ``naig`` and ``naig-exact``: energies → Gibbs weights → MGE combine."""

    @abstractmethod
    def energies(self, grads: Tensor, ref: int) -> Tensor:
        """(K,) float64 energies of each worker's drift from the reference."""

    def combine(
        self, grads: Tensor, lags: Tensor, theta_now: Tensor, theta_stale: Tensor
    ) -> tuple[Tensor, Tensor]:
        """ĝ = Σ_k π_k g_k with π = Gibbs(E); see ``Strategy.combine``.

        When no energy is finite (every gradient, or the reference, is NaN/Inf) no
        worker can be preferred: π is uniform and ĝ is the (non-finite) mean, as for
        ``hogwild``, so the caller sees the divergence instead of an exception.
        """
        energies = self.energies(grads, reference_index(lags))
        try:
            pi = gibbs_pi(energies, self.options.beta)
        except DataError:
            pi = torch.full((grads.shape[0],), 1.0 / grads.shape[0], dtype=torch.float64, device=grads.device)
        return combine(pi, grads), pi


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
        return sketch_energies(self.sketch(grads), ref, self.psi)
