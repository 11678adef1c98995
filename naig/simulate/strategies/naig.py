"""``naig``: Gibbs-weighted combination by Fano–Fisher energy of the sketched drift.

**Batch reference** (lockstep, and arrival windows B ≥ 2), docs/design.md §5–§7: the
reference R is the freshest gradient of the batch (min τ, ties to the lowest worker
index; ``reference_row``), never an oracle in arrival mode:

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

import math
from abc import abstractmethod
from collections import deque

import numpy as np
import torch
from torch import Tensor

from naig.energy import energy
from naig.errors import DataError, UsageError
from naig.gibbs import gibbs_weights, resolve_beta
from naig.metric import fano_fisher_metric
from naig.simulate.strategies.base import (
    Batch,
    Strategy,
    StrategyOptions,
    Update,
    no_step,
    reference_row,
    register,
    weighted_sum,
)

__all__ = ["NAIG", "GibbsStrategy", "ReferenceStrategy", "EMA_DECAY", "BETA_HISTORY"]

EMA_DECAY = 0.9  # r ← 0.9 r + 0.1 x
BETA_HISTORY = 100  # auto-β at window 1: median of the last this many positive energies


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
        self.reference: Tensor | None = None  # EMA point (embedded), window 1 only
        self.history: deque[float] = deque(maxlen=BETA_HISTORY)

    @abstractmethod
    def embed(self, grads: Tensor) -> Tensor:
        """(B, m) float64 points whose differences are the drifts (sketch, or g itself)."""

    @abstractmethod
    def energy_of(self, drifts: Tensor) -> Tensor:
        """(B,) float64 energies of (B, m) drifts."""

    def combine(self, batch: Batch) -> Update:
        """ĝ = Σ_k π_k g_k with π = Gibbs(E), or at window 1 g with lr η·w; see the module.

        With the batch reference, when no energy is finite (the reference itself is
        NaN/Inf) no worker can be preferred: π is uniform and ĝ is the (non-finite) mean,
        as for ``hogwild``, so the caller sees the divergence instead of an exception.
        """
        if self.ema_reference:
            return self._combine_ema(self.single(batch))
        grads = batch.grads
        points = self.embed(grads)
        e = self.energy_of(points - points[reference_row(batch.staleness, batch.workers)])
        e = e.detach().cpu().numpy().astype(np.float64)
        try:
            pi = torch.from_numpy(gibbs_weights(e, resolve_beta(self.options.beta, e)))
        except DataError:
            pi = torch.full((grads.shape[0],), 1.0 / grads.shape[0], dtype=torch.float64)
        pi = pi.to(grads.device)
        return Update(weighted_sum(pi, grads), pi)

    def _combine_ema(self, grads: Tensor) -> Update:
        point = self.embed(grads)[0]
        if self.reference is None and bool(torch.isfinite(point).all()):
            self.reference = point.clone()  # seeded by the first arrival
        if self.reference is None:
            return no_step(grads)
        e = float(self.energy_of((point - self.reference).unsqueeze(0))[0])
        if not math.isfinite(e):
            return no_step(grads)
        if e > 0:
            self.history.append(e)
        w = math.exp(-resolve_beta(self.options.beta, np.asarray(self.history, dtype=np.float64)) * e)
        if w == 0.0:
            return no_step(grads)
        self.reference.mul_(EMA_DECAY).add_(point, alpha=1 - EMA_DECAY)
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
