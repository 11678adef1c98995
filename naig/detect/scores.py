"""The per-rank scores ``naig detect`` compares: one number per rank and step, larger = more suspect.

Every score is computed from the statistics the monitor gathers (``naig.monitor.signals``):
the sketches S g_k (R = 4 blocks of 14; the first block is the R = 1 sketch), the exact
‖g_k‖², the non-finite counts, and, for the exact scores, the exact ⟨g_k, ḡ⟩ and ‖g_k − ḡ‖²
(from the float64 Gram matrix of the K gradients). ``relative`` means the robust z of the
rank's value against the other ranks' values at the same step (``naig.monitor.detectors``:
median and MAD, scale floor 1e-6), on the detectors' transformed scale (``signal_values``):

=============  ======  ==================================================================
detector       kind    score of rank k
=============  ======  ==================================================================
``nan``        exact   its number of non-finite entries (the NaN check at the collective)
``norm``       exact   |relative z| of log ‖g_k‖ (Megatron-style norm check, both sides)
``norm-ind``   exact   |z| of log ‖g_k‖ − median_{j≠k} log ‖g_j‖ against its own last
                       ``window`` clean values (the individual score)
``cos``        exact   relative z of arccos cos(g_k, ḡ)
``dist``       exact   relative z of log ‖g_k − ḡ‖²
``sketch-14``  sketch  relative z of log ‖S₁(g_k − ḡ)‖² (14 buckets, no Ψ)
``sketch-56``  sketch  the same with 4 blocks (56 buckets)
``energy-14``  sketch  relative z of E_k^(1/3), the Fano–Fisher energy at 14 buckets
``energy-56``  sketch  E_k averaged over 4 sketches, cube root, relative z
``monitor``    mixed   the monitor's combined rule (``Detector`` with every signal and both
                       scores, exact statistics): max over its tests of z / threshold
=============  ======  ==================================================================

A rank whose gradient is not finite gets +inf from every detector (the monitor never scores
such a rank as clean); the others are measured against the mean of the finite ranks. A score
that cannot be computed (no scale) is −inf (never flagged).

Example:
    >>> import torch
    >>> from naig.monitor.signals import MonitorSketch
    >>> sk = MonitorSketch.build([("w", 64)], seed=0, blocks=4)
    >>> g = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
    >>> g[3] *= 100
    >>> s = Scorer(5, window=4).scores(StepStats.of(g, sk))
    >>> s.shape, int(s[DETECTORS.index("norm")].argmax())
    ((10, 5), 3)
"""

from __future__ import annotations

import copy
import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from naig.monitor.detectors import SIDES, Detector, robust_z, signal_values
from naig.monitor.signals import MonitorSketch, RankSignals, rank_signals

__all__ = ["DETECTORS", "KINDS", "BLOCKS", "StepStats", "Scorer", "relative_z"]

DETECTORS = ("nan", "norm", "norm-ind", "cos", "dist", "sketch-14", "sketch-56", "energy-14", "energy-56",
             "monitor")
KINDS = {"nan": "exact", "norm": "exact", "norm-ind": "exact", "cos": "exact", "dist": "exact",
         "sketch-14": "sketch", "sketch-56": "sketch", "energy-14": "sketch", "energy-56": "sketch",
         "monitor": "mixed"}
BLOCKS = 4  # sketch blocks gathered (56 buckets); the first block is the 14-bucket sketch
MIN_SCALE = 1e-6


@dataclass(frozen=True)
class StepStats:
    """What the monitor would gather at one step, plus the exact float64 Gram matrix.

    Attributes:
        grads64: (K, n) float64 gradients (the clean ones; a faulted copy shares them).
        sketches: (K, 14·R) float64 S g_k.
        sq_norms: (K,) float64 ‖g_k‖².
        nonfinite: (K,) int64 non-finite entries.
        gram: (K, K) float64 ⟨g_j, g_k⟩ (NaN where a gradient is not finite).
    """

    grads64: Tensor
    sketches: np.ndarray
    sq_norms: np.ndarray
    nonfinite: np.ndarray
    gram: np.ndarray

    @classmethod
    def of(cls, grads: Tensor, sketch: MonitorSketch) -> StepStats:
        """The statistics of K gradients (K, n) (any float dtype) under ``sketch``."""
        g64 = grads.detach().to(torch.float64)
        sk = np.stack([sketch(row).cpu().numpy() for row in grads])
        gram = (g64 @ g64.T).cpu().numpy()
        bad = (~torch.isfinite(grads)).sum(1).cpu().numpy().astype(np.int64)
        return cls(g64, sk, np.diag(gram).copy(), bad, gram)

    def with_row(self, rank: int, grad: Tensor, sketch: MonitorSketch) -> StepStats:
        """The same step with rank ``rank``'s gradient replaced by ``grad`` (n,): only that row is
        recomputed (its sketch, norm, count and its dots with the others)."""
        g64 = grad.detach().to(torch.float64)
        dots = (self.grads64 @ g64).cpu().numpy()
        sq = float(torch.dot(g64, g64))
        dots[rank] = sq
        gram = self.gram.copy()
        gram[rank, :], gram[:, rank] = dots, dots
        sk, sqn, bad = self.sketches.copy(), self.sq_norms.copy(), self.nonfinite.copy()
        sk[rank] = sketch(grad).cpu().numpy()
        sqn[rank], bad[rank] = sq, int((~torch.isfinite(grad)).sum())
        return StepStats(self.grads64, sk, sqn, bad, gram)

    def exact(self) -> tuple[np.ndarray, np.ndarray]:
        """(⟨g_k, ḡ⟩, ‖g_k − ḡ‖²) with ḡ the mean of all K, from the Gram matrix (float64)."""
        with np.errstate(invalid="ignore", over="ignore"):  # a non-finite rank: NaN, not used
            dots = self.gram.mean(axis=1)
            return dots, np.diag(self.gram) - 2 * dots + self.gram.mean()

    def signals(self, blocks: int, exact: bool) -> RankSignals:
        """``rank_signals`` of the first ``blocks`` sketch blocks, with the exact statistics or not."""
        dots, dist = self.exact() if exact else (None, None)
        return rank_signals(self.sketches[:, :14 * blocks], self.sq_norms, self.nonfinite, dots=dots,
                            sq_dists=dist)


def relative_z(x: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """(K,) robust z of each usable x_k against the other usable ranks' values (NaN elsewhere)."""
    z = np.full(len(x), np.nan)
    for r in np.flatnonzero(ok):
        others = x[ok & (np.arange(len(x)) != r)]
        if len(others) >= 2:
            z[r] = robust_z(float(x[r]), others, MIN_SCALE)
    return z


class Scorer:
    """Every detector's score per rank at each step; keeps the individual histories of clean steps.

    Args:
        world: K ≥ 3 ranks (the relative scores need two other ranks).
        window: clean steps in the individual histories (``norm-ind`` and ``monitor``).
        false_alarm: the monitor ``Detector``'s own per-step false-alarm rate (sets its thresholds,
            which only scale its score; ``naig detect`` calibrates every score itself).
    """

    def __init__(self, world: int, window: int = 16, false_alarm: float = 1e-3) -> None:
        self.world, self.window = world, window
        self.history: list[deque[float]] = [deque(maxlen=window) for _ in range(world)]
        self.monitor = Detector(world, false_alarm=false_alarm, window=window, quiet=True)

    def scores(self, stats: StepStats, commit: bool = False) -> np.ndarray:
        """(len(DETECTORS), K) float64 scores of one step.

        Args:
            stats: the step's statistics.
            commit: a clean step: its values enter the individual histories.
        """
        exact, one, four = stats.signals(1, True), stats.signals(1, False), stats.signals(BLOCKS, False)
        ok = exact.usable
        out = np.full((len(DETECTORS), self.world), -np.inf)
        out[0] = stats.nonfinite
        log_norm = signal_values(exact, "norm")
        rows = {"norm": np.abs(relative_z(log_norm, ok)), "norm-ind": self._individual(log_norm, ok, commit),
                "cos": relative_z(signal_values(exact, "cos"), ok),
                "dist": relative_z(signal_values(exact, "distance"), ok),
                "sketch-14": relative_z(signal_values(one, "distance"), ok),
                "sketch-56": relative_z(signal_values(four, "distance"), ok),
                "energy-14": relative_z(signal_values(one, "energy"), ok),
                "energy-56": relative_z(signal_values(four, "energy"), ok),
                "monitor": self._monitor(exact, commit)}
        for name, v in rows.items():
            out[DETECTORS.index(name)] = np.where(np.isnan(v), -np.inf, v)
        out[1:, ~ok] = np.inf
        return out

    def _individual(self, log_norm: np.ndarray, ok: np.ndarray, commit: bool) -> np.ndarray:
        """|z| of the centred log norm against the rank's own clean history (NaN until it is full)."""
        y = np.full(self.world, np.nan)
        for r in np.flatnonzero(ok):
            others = log_norm[ok & (np.arange(self.world) != r)]
            if len(others):
                y[r] = log_norm[r] - float(np.median(others))
        z = np.full(self.world, np.nan)
        for r in range(self.world):
            hist = self.history[r]
            if len(hist) == self.window and math.isfinite(y[r]):
                z[r] = abs(robust_z(float(y[r]), np.fromiter(hist, float, len(hist)), MIN_SCALE))
        if commit:
            for r in np.flatnonzero(np.isfinite(y)):
                self.history[r].append(float(y[r]))
        return z

    def _monitor(self, sig: RankSignals, commit: bool) -> np.ndarray:
        """Max over the monitor's tests of (side-adjusted value) / threshold, from its first pass."""
        det = self.monitor if commit else copy.deepcopy(self.monitor)
        dec = det.update(sig)
        best = np.full(self.world, np.nan)
        for score, table in (("transient", dec.transient), ("cusum", dec.cusum)):
            for name, zs in table.items():
                t = dec.thresholds.get(score, {}).get(name, math.nan)
                if not math.isfinite(t):
                    continue
                z = np.asarray(zs, dtype=float)
                z = np.abs(z) if SIDES[name] == "both" or score == "cusum" else z
                best = np.fmax(best, z / t)
        return best
