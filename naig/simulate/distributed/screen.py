"""Sketch-first: naig's weights computed on the pushed 14-float sketches (docs/design.md §14).

With sketch-first a worker pushes its sketch S g (56 B) and the server fetches the
gradient (4n B) only when it would count: w ≥ 0.01 for a single arrival (B = 1),
π_k ≥ 0.01/B in a window. The weights are the ``naig`` rule's own definitions, computed
on the sketches, and the server applies them itself:

- B = 1, EMA reference r (seeded by the first finite arrival, then r ← 0.9 r + 0.1 S g
  after every arrival with w > 0): E = (S g − r)ᵀ Ψ (S g − r), w = exp(−β E), auto-β =
  1 / median of the last 100 positive energies, the current one included; the gradient,
  when fetched, is applied with learning rate η·w. The reference and the energy history
  move with every arrival, fetched or not, exactly as without sketch-first (only the
  fetch is saved, never the bookkeeping): left out is a step of weight w < 0.01.
- a window: reference = the freshest finite sketch (min τ, ties to the lowest worker index),
  π = Gibbs(E) over the window; ĝ = Σ π_k g_k over the fetched rows (each one left out
  weighed π_k < 0.01/B).

A non-finite sketch has weight 0 at B = 1 (its gradient is never fetched); in a window
with no finite energy the weights are uniform (``naig.gibbs.naig_weights``), as the rule's.

Example:
    >>> import torch
    >>> rule = SketchScreen(beta=1.0)
    >>> rule.single(torch.zeros(14))   # the first arrival seeds the reference
    1.0
    >>> far = torch.zeros(14); far[4] = 5.0
    >>> w = rule.single(far); round(w, 6), rule.fetch(w, 1)   # E = 2·25 = 50
    (0.0, False)
    >>> rule.single(torch.full((14,), float("nan")))
    0.0
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from naig.energy import energy
from naig.gibbs import FROZEN_FACTOR, EmaReference, naig_weights, reference_index, resolve_beta
from naig.metric import fano_fisher_metric

__all__ = ["SketchScreen", "EMA_DECAY", "BETA_HISTORY"]

EMA_DECAY = 0.9  # r ← 0.9 r + 0.1 S g
BETA_HISTORY = 100  # auto-β at B = 1: median of the last this many positive energies


class SketchScreen:
    """naig's weights from sketches: the rule sketch-first applies (see the module).

    Args:
        beta: inverse temperature, a float ≥ 0 or ``"auto"``.
        line: the Fano line ℓ of Ψ_ℓ.
    """

    def __init__(self, beta: float | str = "auto", line: tuple[int, int, int] = (1, 2, 4)) -> None:
        self.beta = beta
        self.psi = torch.from_numpy(fano_fisher_metric(line))  # (14, 14) float64
        self.ema = EmaReference(beta, lambda d: energy(d, self.psi))

    def single(self, sketch: Tensor) -> float:
        """w = exp(−β E) of one arrival against the EMA reference, updating both (0 if non-finite)."""
        return self.ema.weight(sketch.detach().cpu().to(torch.float64))

    def window(self, sketches: Tensor, staleness: list[int], workers: list[int]) -> np.ndarray:
        """π over a window of B sketches (B, 14) against its freshest one (uniform if no E is finite)."""
        s = sketches.detach().cpu().to(torch.float64)
        ref = reference_index(staleness, workers, torch.isfinite(s).all(1).tolist())
        e = energy(s - s[ref], self.psi).numpy()
        return naig_weights(e, resolve_beta(self.beta, e))

    @staticmethod
    def fetch(weight: float, window: int) -> bool:
        """Fetch the gradient when w ≥ 0.01 (B = 1) or π ≥ 0.01/B."""
        return bool(weight >= FROZEN_FACTOR / window)
