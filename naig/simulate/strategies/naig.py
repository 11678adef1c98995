"""``naig``: Gibbs-weighted combination by Fano–Fisher energy of the sketched drift.

**Batch reference** (lockstep, and arrival windows B ≥ 2), docs/design.md §5–§7: the
reference R is the freshest gradient of the batch whose sketch is finite (min τ, ties to
the lowest worker index; ``naig.gibbs.reference_index``), never an oracle in arrival mode:

    d_k = S g_k − S g_R ∈ R^14          (the sketch, fixed seed)
    E_k = d_kᵀ Ψ_ℓ d_k                   (Fano–Fisher energy)
    π_k = exp(−β E_k) / Σ_j exp(−β E_j)  (β = ``beta``; "auto": 1 / median positive E_k)
    ĝ   = Σ_{k: π_k > 0} π_k g_k          (a non-finite E_k gets π_k = 0 and is left out)

**EMA reference** (arrival mode, window B = 1; docs/design.md §12): a Gibbs
normalisation over one gradient is trivially 1, so the arrival is weighted against a
reference r whose own energy is 0:

    r ← S g_1 at the first (finite) arrival, then r ← 0.9 r + 0.1 S g after each applied one
    E = (S g − r)ᵀ Ψ_ℓ (S g − r),   w = exp(−β E) ∈ (0, 1]
    ĝ = g applied with learning rate η·w   (``Update.lr_scale = w``: Adam cancels a gradient
                                            scale, not an lr scale)

with auto-β = 1 / median of the last 100 positive energies, the current E included.
r is the EMA(0.9) of the sketches of the gradients handed to the optimizer (an
arrival with non-finite E, or w = 0, is not applied and does not enter r).
"""

from __future__ import annotations

from abc import abstractmethod

import numpy as np
import torch
from torch import Tensor

from naig.energy import energy
from naig.errors import UsageError
from naig.gibbs import EmaReference, naig_weights, reference_index, resolve_beta
from naig.metric import fano_fisher_metric
from naig.simulate.strategies.base import (
    Batch,
    Strategy,
    StrategyOptions,
    Update,
    no_step,
    register,
    weighted_sum,
)

__all__ = ["NAIG", "GibbsStrategy", "ReferenceStrategy"]


class ReferenceStrategy(Strategy):
    """A rule with a reference gradient: the freshest of the batch, or (window 1) an EMA."""

    def __init__(self, options: StrategyOptions) -> None:
        super().__init__(options)
        self.ema_reference = options.resolved_reference == "ema"

    @classmethod
    def check(cls, options: StrategyOptions) -> tuple[str, ...]:
        """As ``Strategy.check``; also refuses ``reference`` ema with batches of more than one."""
        warnings = super().check(options)
        if options.resolved_reference == "ema" and options.batch_size != 1:
            raise UsageError(f"reference ema is defined for a window of 1 in arrival mode only "
                             f"({options.mode} mode, batch {options.batch_size}); use reference batch",
                             field="reference", value="ema")
        return warnings

    def single(self, batch: Batch) -> Tensor:
        """The one gradient of a window-1 batch, (1, n); ValueError for more rows."""
        if batch.grads.shape[0] != 1:
            raise ValueError(f"{self.name} with the EMA reference combines one gradient per "
                             f"update, got {batch.grads.shape[0]}")
        return batch.grads


class GibbsStrategy(ReferenceStrategy):
    """Shared body of ``naig`` and ``naig-exact``: energies → Gibbs weights → MGE combine."""

    def __init__(self, options: StrategyOptions) -> None:
        super().__init__(options)
        self.ema = EmaReference(options.beta, lambda d: self.energy_of(d.unsqueeze(0))[0])  # window 1

    @abstractmethod
    def embed(self, grads: Tensor) -> Tensor:
        """(B, m) float64 points whose differences are the drifts (sketch, or g itself)."""

    @abstractmethod
    def energy_of(self, drifts: Tensor) -> Tensor:
        """(B,) float64 energies of (B, m) drifts."""

    def combine(self, batch: Batch) -> Update:
        """ĝ = Σ_k π_k g_k with π = Gibbs(E), or at window 1 g with lr η·w; see the module.

        With the batch reference, when no energy is finite (the reference itself is
        NaN/Inf) no worker can be preferred: π is uniform (``naig.gibbs.naig_weights``) and
        ĝ is the (non-finite) mean, as for ``hogwild``, so the caller sees the divergence.
        """
        if self.ema_reference:
            return self._combine_ema(self.single(batch))
        grads = batch.grads
        points = self.embed(grads)
        usable = torch.isfinite(points).all(1).tolist()  # a NaN row cannot be the reference
        ref = reference_index(batch.staleness.tolist(), batch.workers.tolist(), usable)
        e = self.energy_of(points - points[ref])
        e = e.detach().cpu().numpy().astype(np.float64)
        pi = torch.from_numpy(naig_weights(e, resolve_beta(self.options.beta, e))).to(grads.device)
        return Update(weighted_sum(pi, grads), pi)

    def _combine_ema(self, grads: Tensor) -> Update:
        w = self.ema.weight(self.embed(grads)[0])
        if w == 0.0:
            return no_step(grads)
        return Update(grads[0].clone(), torch.tensor([w], dtype=torch.float64, device=grads.device), w)


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

    def embed(self, grads: Tensor) -> Tensor:
        """S g_k, (B, 14) float64 (the sketch accumulates in float64)."""
        return self.sketch(grads)

    def energy_of(self, drifts: Tensor) -> Tensor:
        """E_k = d_kᵀ Ψ d_k."""
        return energy(drifts, self.psi)
