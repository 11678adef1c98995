"""Per-rank gradient signals from one small all-gather: the monitor's framework-free core.

Every rank k of a data-parallel group of K ranks holds its own gradient g_k ∈ Rⁿ before the
reduction. It contributes a payload of m + 2 float64 values (``pack``):

    [ S g_k (m = 14·R floats) | ‖g_k‖² | number of non-finite entries of g_k ]

(128 B per rank for R = 1). After an all-gather every rank holds the same (K, m + 2) array and
``rank_signals`` derives, identically on every rank, for each rank k:

- ``energy``  E_k = (1/R) Σ_r (d_k⁽ʳ⁾)ᵀ Ψ_ℓ d_k⁽ʳ⁾, the Fano–Fisher energy (docs/design.md §4) of
  its sketched drift from the mean sketch, d_k = S g_k − mean_j S g_j, block by block (always a
  sketch quantity);
- ``cos``     cos(g_k, ḡ) and ``sq_dist`` ‖g_k − ḡ‖², ḡ = (1/K) Σ_j g_j the reduced mean: exact
  when the framework hands over the exact ⟨g_k, ḡ⟩ and ‖g_k − ḡ‖², sketch estimates otherwise;
- ``rel_norm`` ‖g_k‖ / median_j ‖g_j‖ (exact; the median over the reference ranks, k included);
- ``drift_cos`` cos(d_k,t, d_k,t−1), the cosine between rank k's sketched drift from the mean at
  this step and at the previous one (``previous``: the previous step's sketches, measured against
  the mean of the same reference ranks; NaN without it). A clean rank draws a new minibatch each
  step, so its drift is fresh noise and the cosine scatters about 0; a rank whose departure
  persists in one direction (a batch it keeps reusing, a data shard of another kind, weights
  that drifted) keeps pointing the same way: the cosine stays high (always a sketch quantity);
- ``turn`` the angle (radians, in [0, π]) between rank k's sketched gradient at this step and at
  the previous one, arccos cos(S g_k,t, S g_k,t−1) (``previous``; NaN without it). It involves no
  other rank: consecutive clean gradients share the mean gradient, so the angle sits well below
  π/2 early in training and grows as the noise takes over, the same for every clean rank; a rank
  that keeps reusing one batch also keeps its noise, and its gradient barely turns (on the small
  GPT at batch 8, from step 41: ~0.1–0.2 rad against ~0.5–1.2 for the clean ranks; always a
  sketch quantity);
- ``drift_t2`` the multivariate EWMA statistic of rank k's sketched drift (Lowry, Woodall, Champ &
  Rigdon, "A multivariate exponentially weighted moving average control chart", Technometrics
  34(1), 1992): with e_k,t = (1 − λ) e_k,t−1 + λ d̃_k,t, d̃_k = d_k / median_j ‖d_j‖ (the drift
  relative to the step's typical one) and the precision P = Σ̂⁻¹ of the clean ranks' relative
  drift coordinates (``naig.monitor.detectors.DriftState``, which the detector keeps),

      T²_k = e_kᵀ P e_k / (m · λ/(2 − λ))

  (≈ χ²_m/m for a clean rank, whose e has covariance λ/(2 − λ)·Σ in the steady state). A departure
  that keeps its direction accumulates in e over ~1/λ steps while fresh noise averages out, and
  P weighs each sketch coordinate by its own spread (always a sketch quantity; NaN without a
  ``DriftState``, see ``with_drift``);
- the gradient noise scale B_simple of the step (McCandlish et al. 2018), one value per step.

**The sketch and its scale.** S is R independent blocks of the project's CountSketch with 14
buckets (docs/design.md §5), block r with seed ``seed + r`` (as the audit's several sketches).
Each block is unbiased with unit scale, E[⟨S_r x, S_r y⟩] = ⟨x, y⟩ (no 1/14 factor), so
⟨x, y⟩ ≈ ⟨S x, S y⟩ / R. For a difference spread over many coordinates the 14 coordinates of
one block behave like independent N(0, ‖Δ‖²/14) variables, so ‖S Δ‖²/R ≈ ‖Δ‖² χ²_m / m: its
relative standard deviation is √(2/m): 0.38 for m = 14, 0.19 for m = 56, 0.13 for m = 112
(measured over 300 seeds in tests/test_monitor_signals.py: 0.35, 0.18, 0.13). E_k has relative
spread √(1/2)/√R (§5.1).

**Sketch estimates** (when no exact statistics are given). With s̄ the mean sketch of the ranks
of the reference (S is linear, so S g_k − s̄ = S(g_k − ḡ) exactly):

    sq_dist_k = ‖S g_k − s̄‖² / R                           (unbiased: E = ‖g_k − ḡ‖²)
    ‖ḡ‖²      = mean_k ‖g_k‖² − mean_k sq_dist_k            (unbiased, from the identity
                 mean_k ‖g_k‖² = ‖ḡ‖² + mean_k ‖g_k − ḡ‖² with the exact norms)
    cos_k     = ⟨S g_k, s̄⟩ / (‖S g_k‖ ‖s̄‖)                  (the sketched vectors' cosine)

The spread and ‖ḡ‖² carry sketch noise proportional to ‖g_k − ḡ‖², not to ‖g_k‖² (which is what
makes the noise scale usable). The cosine is the sketched vectors' own, always in [−1, 1]: a
law-of-cosines estimate (‖g_k‖² + ‖ḡ‖² − sq_dist_k)/(2‖g_k‖‖ḡ‖) is better conditioned when the
ranks agree but divides by a difference of large numbers when ‖ḡ‖² ≪ mean ‖g_k‖² (noise-dominated
gradients, the common case for small per-rank batches) and then swings between −1 and 1.

**Exact statistics.** Given ⟨g_k, ḡ⟩ and ‖g_k − ḡ‖² for every rank (all finite), then
‖ḡ‖² = (1/K) Σ_k ⟨g_k, ḡ⟩ exactly, cos_k = ⟨g_k, ḡ⟩ / (‖g_k‖ ‖ḡ‖) (clipped to [−1, 1]) and
sq_dist_k is the given value.

**Non-finite ranks and the reference.** A rank is usable when its count is 0 and its norm and
sketch are finite. ḡ is the mean of the *reference* ranks: every usable rank by default, fewer
when the detectors leave a flagged rank out (``RankSignals.with_reference``). The mean sketch,
the median norm and the noise scale use the reference ranks; every usable rank is measured
against their mean; an unusable rank's values are NaN. The exact statistics are used only when
the reference holds all K ranks (a non-finite rank makes the reduced mean non-finite),
otherwise the sketch estimates.

**Gradient noise scale** (McCandlish, Kaplan, Amodei et al., "An Empirical Model of Large-Batch
Training", 2018, Appendix A). With b examples per rank, g_k the mean-loss gradient of rank k's
batch (|G_small|² at B_small = b: the mean over ranks of ‖g_k‖²) and ḡ that of the global batch
(|G_big|² = ‖ḡ‖² at B_big = K·b), the unbiased estimates (eqs. A.2, A.3) are

    |G|²   = (B_big |G_big|² − B_small |G_small|²) / (B_big − B_small) = (K ‖ḡ‖² − mean_k ‖g_k‖²)/(K − 1)
    tr(Σ)  = (|G_small|² − |G_big|²) / (1/B_small − 1/B_big)           = b K (mean_k ‖g_k‖² − ‖ḡ‖²)/(K − 1)
    B_simple = tr(Σ) / |G|²

|G|² is a squared gradient norm (loss units² per parameter unit²), tr(Σ) the trace of the
per-example gradient covariance (the same units times examples) and B_simple is in examples
(the unit ``batch`` counts: sequences, tokens, …; with ``batch=1`` it is in per-rank batches).
A single step is noisy (|G|² may come out ≤ 0: B_simple is then NaN); the paper averages |G|²
and tr(Σ) over steps before the ratio, as ``NoiseScaleAverage`` does.

Example:
    >>> import numpy as np
    >>> g = np.array([[3.0, 0.0], [1.0, 0.0], [2.0, 1.0]])          # 3 ranks, n = 2
    >>> mean = g.mean(0)
    >>> sig = rank_signals(np.zeros((3, 14)), (g * g).sum(1), np.zeros(3),
    ...                    dots=g @ mean, sq_dists=((g - mean) ** 2).sum(1))
    >>> sig.kind("cos"), sig.kind("energy"), sig.cos.round(4).tolist()
    ('exact', 'sketch', [0.9864, 0.9864, 0.9558])
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from naig.energy import energy
from naig.errors import UsageError
from naig.metric import DEFAULT_LINE, fano_fisher_metric, parse_line
from naig.monitor.detectors import pooled_median
from naig.sketch.core import SKETCH_DIM, check_seed
from naig.sketch.layout_sketch import LayoutSketch

if TYPE_CHECKING:
    from naig.monitor.detectors import DriftState

__all__ = ["EXACT_ALWAYS", "MAX_BLOCKS", "MonitorSketch", "NoiseScale", "NoiseScaleAverage",
           "RankSignals", "check_batch", "check_blocks", "noise_scale", "pack", "pack_tensors",
           "payload_size", "rank_signals", "to_float64", "unpack"]

EXACT_ALWAYS = frozenset({"sq_norm", "rel_norm"})
"""Quantities that are exact whatever the statistics given (full-dimension float64 norms)."""
_FROM_MEAN = ("cos", "sq_dist", "mean_sq_norm", "noise")  # exact only with the exact statistics
_SKETCH_ONLY = frozenset({"energy", "drift_cos", "drift_t2", "turn"})  # always sketch estimates


@dataclass(frozen=True, eq=False)
class MonitorSketch:
    """S : Rⁿ → R^{14R}: R blocks of the project's 14-bucket sketch, block r with seed ``seed + r``.

    No per-parameter array is stored: the hash codes are recomputed while the gradient is read
    (``naig.sketch.layout_sketch.LayoutSketch``: the C kernel on CPU, Triton on CUDA), and the
    payload ``[S g | ‖g‖² | non-finite count]`` comes out of that one read (``pack``). Memory:
    the tensors' keys and the layout's segments, O(tensors × R), whatever n.

    Attributes:
        layout: the ``LayoutSketch`` (names, keys, segments).
    """

    layout: LayoutSketch

    @classmethod
    def build(cls, named_sizes: Sequence[tuple[str, int]], seed: int = 0, blocks: int = 1,
              device: str | torch.device = "cpu") -> MonitorSketch:
        """The sketch of a flat layout of named tensors (one pass over the names).

        Args:
            named_sizes: ``(name, numel)`` per tensor, in flat-layout order (names key the hashes).
            seed: the first block's seed; block r uses ``seed + r`` (all uint64).
            blocks: R ≥ 1, the number of 14-bucket blocks (m = 14·R).
            device: accepted for compatibility; nothing is stored per device but a few small
                tables, built where the gradient is first sketched.

        Raises:
            UsageError: for ``blocks`` < 1 or a seed (``seed + blocks − 1`` included) outside uint64.
        """
        r = check_blocks(blocks)
        check_seed(seed)
        check_seed(seed + r - 1, field="seed")
        return cls(LayoutSketch.build(named_sizes, seed, r))

    @classmethod
    def from_segments(cls, names: Sequence[str], segments: np.ndarray, numel: int, seed: int = 0,
                      blocks: int = 1) -> MonitorSketch:
        """The sketch of a layout of tensor pieces (``LayoutSketch.from_segments``; FSDP's input).

        Raises:
            UsageError: as ``build``, or a segment outside the input.
        """
        r = check_blocks(blocks)
        check_seed(seed)
        check_seed(seed + r - 1, field="seed")
        return cls(LayoutSketch.from_segments(names, segments, numel, seed, r))

    @property
    def dim(self) -> int:
        """m = 14·R, the sketch length."""
        return self.layout.dim

    @property
    def numel(self) -> int:
        """n, the flat length the sketch accepts."""
        return self.layout.numel

    def payload(self, flat: Tensor) -> Tensor:
        """[S x | ‖x‖² | non-finite count] of x (n,) of any float dtype: (m + 2,) float64 on x's device."""
        return self.layout(flat)

    def __call__(self, flat: Tensor) -> Tensor:
        """S x for x (n,) of any float dtype → (m,) float64 on x's device."""
        return self.layout(flat)[:self.dim]


MAX_BLOCKS = 256
"""The most sketch blocks per rank: m = 3584 floats, a relative spread √(2/m) of 2.4 % (each block
adds 14 floats to every rank's payload and one hash per gradient entry to every step)."""


def check_blocks(blocks: object) -> int:
    """Validate R, the number of sketch blocks (an int in [1, ``MAX_BLOCKS``]).

    Raises:
        UsageError: anything else, naming ``blocks``.
    """
    if isinstance(blocks, bool) or not isinstance(blocks, int | np.integer) or not 1 <= blocks <= MAX_BLOCKS:
        raise UsageError(f"must be an int in [1, {MAX_BLOCKS}] (the sketch has 14 floats per block; "
                         f"{MAX_BLOCKS} blocks measure to 2.4 %)", field="blocks", value=blocks)
    return int(blocks)


def payload_size(blocks: int = 1) -> int:
    """Floats each rank sends per step: m + 2 = 14·R + 2 (float64: 8 bytes each)."""
    return SKETCH_DIM * check_blocks(blocks) + 2


def pack(flat: Tensor, sketch: MonitorSketch) -> Tensor:
    """This rank's payload [S g | ‖g‖² | non-finite count]: (m + 2,) float64 on ``flat``'s device.

    One read of g (``MonitorSketch.payload``); ‖g‖² is accumulated in float64 and no float64
    copy of g is made. On CPU the non-finite entries are counted (a second pass) only when ‖g‖²
    is not finite: a finite float64 sum of squares has no NaN or infinite term.

    Args:
        flat: (n,) this rank's gradient, any float dtype (non-contiguous: copied once).
        sketch: the sketch of the flat layout.
    """
    return sketch.payload(flat)


def pack_tensors(tensors: Sequence[Tensor], sketch: MonitorSketch) -> Tensor:
    """``pack`` of the flat concatenation of ``tensors`` (the layout's tensors, in order): on the CPU
    each is read where it lies; on CUDA runs of them are concatenated, a bounded transient copy, and
    sketched one launch per run (see ``LayoutSketch.of_tensors``).

    Raises:
        UsageError: tensors that do not match the sketch's layout.
    """
    return sketch.layout.of_tensors(tensors)


def to_float64(values: object, field: str) -> np.ndarray:
    """Gathered rows as a float64 numpy array: a tensor of any float dtype on any device (copied to
    the CPU), an array or nested lists of numbers (not copied when already float64).

    Raises:
        UsageError: values that are not numbers (None, strings, objects), naming ``field``.
    """
    if isinstance(values, Tensor):
        if values.is_meta or values.is_complex():
            raise UsageError(f"expected real numbers with values, got a {values.dtype} tensor on "
                             f"{values.device}", field=field)
        values = values.detach().to("cpu", torch.float64).numpy()  # numpy has no bfloat16
    try:
        raw = np.asarray(values)  # one conversion; then a cast, a no-op for float64
    except (TypeError, ValueError) as exc:
        raise UsageError(f"expected rows of numbers ({type(exc).__name__}: {str(exc)[:80]})",
                         field=field) from None
    if np.iscomplexobj(raw):  # a float64 cast would drop the imaginary part, warning only
        raise UsageError("expected real numbers, got complex ones", field=field)
    if raw.dtype.kind == "O":  # a float64 cast reads None as NaN (a non-finite rank) and casts "1.5"
        odd = [v for v in raw.flat if v is None or isinstance(v, str | bytes)]
        if odd:
            raise UsageError(f"expected rows of numbers, got {odd[0]!r:.40}", field=field)
    elif raw.dtype.kind not in "biuf":  # strings ("1.5" would be cast), dates, records
        raise UsageError(f"expected rows of numbers, got {raw.dtype} values", field=field)
    try:
        return raw.astype(np.float64, copy=False)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"expected rows of numbers ({type(exc).__name__}: {str(exc)[:80]})",
                         field=field) from None


def bad_counts(raw: np.ndarray) -> np.ndarray:
    """(K,) int64 non-finite entry counts from their gathered float64 values: a count that is not a
    whole number >= 0 (NaN, -1, 0.5: a garbled payload) counts as 1, so its rank is unusable."""
    whole = np.isfinite(raw) & (raw >= 0) & (raw == np.floor(raw))
    return np.where(whole, raw, 1.0).astype(np.int64)


def unpack(gathered: Tensor | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split gathered payloads (K, m + 2) into sketches (K, m), ‖g_k‖² (K,) and counts (K,) int64
    (``bad_counts``).

    Raises:
        UsageError: when ``gathered`` is not numbers of shape (K, m + 2), m a positive multiple of 14.
    """
    a = to_float64(gathered, "gathered")
    if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < SKETCH_DIM + 2 or (a.shape[1] - 2) % SKETCH_DIM:
        raise UsageError(f"expected shape (K, 14*R + 2), got {a.shape}", field="gathered")
    return a[:, :-2], a[:, -2], bad_counts(a[:, -1])


@dataclass(frozen=True)
class NoiseScale:
    """The gradient noise scale of one step (McCandlish et al. 2018, Appendix A; see the module).

    Attributes:
        sq_grad: |G|², the estimate of the true gradient's squared norm (may be ≤ 0 by noise).
        trace: tr(Σ), the estimate of the per-example gradient covariance's trace (≥ 0).
        b_simple: tr(Σ)/|G|² in examples (NaN when |G|² ≤ 0 or fewer than 2 usable ranks).
        batch: b, examples per rank, the unit of ``b_simple``.
    """

    sq_grad: float
    trace: float
    b_simple: float
    batch: float


def noise_scale(sq_norms: np.ndarray, mean_sq_norm: float, batch: float = 1.0) -> NoiseScale:
    """B_simple from the ranks' ‖g_k‖² (|G_small|² at b) and ‖ḡ‖² (|G_big|² at K·b).

    Args:
        sq_norms: (K,) float64 ‖g_k‖² of the usable ranks.
        mean_sq_norm: ‖ḡ‖² of their mean.
        batch: b > 0, examples per rank.

    Returns:
        A ``NoiseScale``; all NaN for K < 2.

    Raises:
        UsageError: for a ``batch`` that is not finite and > 0.
    """
    b = check_batch(batch)
    k = len(sq_norms)
    if k < 2 or not math.isfinite(mean_sq_norm):
        return NoiseScale(math.nan, math.nan, math.nan, b)
    small = float(np.mean(sq_norms))
    g2 = (k * mean_sq_norm - small) / (k - 1)
    trace = b * k * (small - mean_sq_norm) / (k - 1)
    return NoiseScale(g2, trace, trace / g2 if g2 > 0 else math.nan, b)


def check_batch(batch: object) -> float:
    """Validate b, examples per rank (a finite number > 0).

    Raises:
        UsageError: anything else, naming ``batch``.
    """
    if isinstance(batch, bool) or not isinstance(batch, int | float | np.number) or not (
            math.isfinite(batch) and batch > 0):
        raise UsageError("must be a finite number > 0 (examples per rank)", field="batch", value=batch)
    return float(batch)


@dataclass
class NoiseScaleAverage:
    """Exponential averages of |G|² and tr(Σ) over steps, then their ratio (as the paper advises).

    Args:
        decay: weight of the past, in [0, 1); the averages are bias-corrected (as Adam's moments).
    """

    decay: float = 0.9
    _g2: float = field(default=0.0, repr=False)
    _trace: float = field(default=0.0, repr=False)
    _weight: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.decay, bool) or not isinstance(self.decay, int | float) or not 0 <= self.decay < 1:
            raise UsageError("must be a float in [0, 1)", field="decay", value=self.decay)

    def update(self, noise: NoiseScale) -> float:
        """Fold one step in (non-finite steps are skipped); returns the averaged B_simple."""
        if math.isfinite(noise.sq_grad) and math.isfinite(noise.trace):
            d = self.decay
            self._g2 = d * self._g2 + (1 - d) * noise.sq_grad
            self._trace = d * self._trace + (1 - d) * noise.trace
            self._weight = d * self._weight + (1 - d)
        return self.b_simple

    @property
    def b_simple(self) -> float:
        """tr(Σ)/|G|² of the averages (NaN before any step or while the averaged |G|² ≤ 0)."""
        return self._trace / self._g2 if self._weight > 0 and self._g2 > 0 else math.nan


@dataclass(frozen=True, eq=False)
class RankSignals:
    """What ``rank_signals`` derives for one step, the same on every rank.

    Arrays are (K,) float64 indexed by rank; an unusable (non-finite) rank's entries are NaN.

    Attributes:
        world: K, the number of ranks.
        blocks: R, the sketch blocks (m = 14·R).
        nonfinite: (K,) int64, non-finite entries of each g_k (as reported by the rank).
        usable: (K,) bool, count 0 and finite norm and sketch.
        reference: (K,) bool, the ranks whose mean is ḡ (usable ones; see ``with_reference``).
        sq_norm: ‖g_k‖² (exact; non-finite as reported).
        rel_norm: ‖g_k‖ / median_j ‖g_j‖ over the usable ranks (exact).
        energy: E_k of the sketched drift from the mean sketch (sketch).
        drift_cos: cos of rank k's sketched drift at this step and the previous one (sketch; NaN
            without the previous sketches, see ``with_previous``).
        drift_t2: the multivariate EWMA statistic T² of rank k's sketched drift (sketch; NaN
            without a ``DriftState``, see ``with_drift``).
        turn: the angle in radians between S g_k at this step and at the previous one (sketch;
            NaN without the previous sketches, see ``with_previous``).
        cos: cos(g_k, ḡ) (``kind("cos")``).
        sq_dist: ‖g_k − ḡ‖² (``kind("sq_dist")``).
        mean_sq_norm: ‖ḡ‖² of the usable ranks' mean.
        noise: the step's ``NoiseScale``.
        exact: names of the exact quantities; every other one is a sketch estimate.
    """

    world: int
    blocks: int
    nonfinite: np.ndarray
    usable: np.ndarray
    reference: np.ndarray
    sq_norm: np.ndarray
    rel_norm: np.ndarray
    energy: np.ndarray
    cos: np.ndarray
    sq_dist: np.ndarray
    mean_sq_norm: float
    noise: NoiseScale
    exact: frozenset[str]
    inputs: _Inputs = field(repr=False)
    drift_cos: np.ndarray = field(default_factory=lambda: np.zeros(0))
    drift_t2: np.ndarray = field(default_factory=lambda: np.zeros(0))
    turn: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def with_reference(self, reference: np.ndarray) -> RankSignals:
        """The same step measured against the mean of the ``reference`` ranks (a (K,) bool mask).

        Used to leave flagged ranks out of the mean the others are measured against.
        """
        ref = np.asarray(reference, dtype=bool)
        if ref.shape != (self.world,):
            raise UsageError(f"expected a ({self.world},) bool mask", field="reference")
        return _signals(self.inputs, self.usable, ref & self.usable)

    def with_previous(self, previous: np.ndarray | None) -> RankSignals:
        """The same step with the previous step's (K, m) float64 sketches (NaN rows: ranks unusable
        then), so that ``drift_cos`` and ``turn`` are measured; None leaves them NaN.

        Raises:
            UsageError: for a shape other than this step's sketches'.
        """
        prev = _check_previous(previous, self.inputs.sketches.shape)
        inputs = dataclasses.replace(self.inputs, previous=prev)
        s, ref = inputs.sketches, self.reference
        turn = _turn(inputs, self.usable)
        if not ref.any():
            return dataclasses.replace(self, inputs=inputs, turn=turn)  # drift_cos stays NaN
        drift = s - s[ref].mean(axis=0)  # only drift_cos and turn depend on the previous step
        return dataclasses.replace(self, inputs=inputs, drift_cos=_drift_cos(inputs, drift, self.usable, ref),
                                   turn=turn)

    def with_drift(self, state: DriftState | None) -> RankSignals:
        """The same step with the EWMA state of the ranks' drifts, so that ``drift_t2`` is measured
        (None leaves it NaN); the reference stays this one's.

        Raises:
            UsageError: a state for another number of ranks or sketch width.
        """
        if state is not None and (state.ewma.shape != self.inputs.sketches.shape
                                  or state.precision.shape != (state.ewma.shape[1],) * 2):
            raise UsageError(f"expected a state for sketches of shape {self.inputs.sketches.shape}",
                             field="drift")
        inputs, ref = dataclasses.replace(self.inputs, drift=state), self.reference
        if not ref.any():
            return dataclasses.replace(self, inputs=inputs)  # drift_t2 stays NaN
        drift = self.inputs.sketches - self.inputs.sketches[ref].mean(axis=0)  # only drift_t2 depends on it
        return dataclasses.replace(self, inputs=inputs, drift_t2=_drift_t2(inputs, drift, self.usable))

    def kind(self, name: str) -> str:
        """``"exact"`` or ``"sketch"`` for a quantity (``energy``, ``cos``, ``sq_dist``, …).

        Raises:
            UsageError: for an unknown name.
        """
        known = EXACT_ALWAYS | set(_FROM_MEAN) | _SKETCH_ONLY
        if name not in known:
            raise UsageError(f"use one of {', '.join(sorted(known))}", field="name", value=name)
        return "exact" if name in self.exact else "sketch"

    def to_dict(self) -> dict:
        """Plain lists and floats (NaN kept as float NaN) with each quantity's kind."""
        arrays = ("nonfinite", "usable", "reference", "sq_norm", "rel_norm", "energy", "cos", "sq_dist",
                  "drift_cos", "drift_t2", "turn")
        out: dict = {a: getattr(self, a).tolist() for a in arrays}
        out.update(world=self.world, blocks=self.blocks, mean_sq_norm=self.mean_sq_norm,
                   noise={"sq_grad": self.noise.sq_grad, "trace": self.noise.trace,
                          "b_simple": self.noise.b_simple, "batch": self.noise.batch},
                   kinds={n: self.kind(n) for n in sorted(EXACT_ALWAYS | set(_FROM_MEAN) | _SKETCH_ONLY)})
        return out


@lru_cache(maxsize=21)
def _psi(line: tuple[int, int, int]) -> np.ndarray:
    return fano_fisher_metric(line)


def rank_signals(sketches: np.ndarray, sq_norms: np.ndarray, nonfinite: np.ndarray, *,
                 dots: np.ndarray | None = None, sq_dists: np.ndarray | None = None,
                 batch: float = 1.0, line: Sequence[int] = DEFAULT_LINE,
                 reference: np.ndarray | None = None, previous: np.ndarray | None = None) -> RankSignals:
    """Every rank's signals from the gathered statistics (see the module for the formulas).

    Args:
        sketches: (K, m) float64, row k = S g_k, m = 14·R (R blocks as ``MonitorSketch``).
        sq_norms: (K,) float64 ‖g_k‖².
        nonfinite: (K,) non-finite entry counts (integers ≥ 0).
        dots: (K,) exact ⟨g_k, ḡ⟩ with ḡ = (1/K) Σ g_j, or None.
        sq_dists: (K,) exact ‖g_k − ḡ‖², or None (give both or neither).
        batch: b > 0, examples per rank (the unit of B_simple).
        line: the Fano line ℓ of Ψ_ℓ.
        reference: (K,) bool, the ranks whose mean is ḡ (default: every usable rank); unusable
            ranks are dropped from it. Every usable rank is measured against that mean. The exact
            statistics are used only when it holds all K ranks.
        previous: (K, m) float64, the previous step's sketches (NaN rows for ranks unusable then),
            for ``drift_cos`` and ``turn``; None leaves them NaN.

    Returns:
        ``RankSignals``.

    Raises:
        UsageError: shapes that disagree, m not a positive multiple of 14, only one of ``dots``
            and ``sq_dists``, a bad ``batch``, ``line``, ``reference`` or ``previous``.
    """
    s, sq, bad = _check_inputs(sketches, sq_norms, nonfinite)
    k = s.shape[0]
    inputs = _Inputs(s, sq, bad, *_check_exact(dots, sq_dists, k), check_batch(batch),
                     parse_line(tuple(line) if not isinstance(line, str) else line),
                     _check_previous(previous, s.shape))
    usable = (bad == 0) & np.isfinite(sq) & np.isfinite(s).all(axis=1)
    if reference is None:
        ref = usable
    else:
        ref = np.asarray(reference)
        if ref.shape != (k,) or ref.dtype != np.bool_:
            raise UsageError(f"expected a ({k},) bool mask", field="reference")
        ref = ref & usable
    return _signals(inputs, usable, ref)


@dataclass(frozen=True, eq=False)
class _Inputs:
    """The gathered statistics behind a ``RankSignals`` (checked), to recompute it for another mean."""

    sketches: np.ndarray
    sq_norms: np.ndarray
    nonfinite: np.ndarray
    dots: np.ndarray | None
    sq_dists: np.ndarray | None
    batch: float
    line: tuple[int, int, int]
    previous: np.ndarray | None = None
    drift: DriftState | None = None


def _drift_t2(inp: _Inputs, drift: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """(K,) T²_k = e_kᵀ P e_k / (m · λ/(2 − λ)) with this step's drift folded in (NaN where undefined)."""
    st = inp.drift
    if st is None:
        return np.full(len(drift), np.nan)
    e = st.step(drift, usable, inp.sketches)
    with np.errstate(invalid="ignore", over="ignore"):
        t2 = np.einsum("ka,ab,kb->k", e, st.precision, e) / (e.shape[1] * st.lam / (2.0 - st.lam))
    return np.where(usable & np.isfinite(t2), t2, np.nan)


def _check_previous(previous: object, shape: tuple[int, int]) -> np.ndarray | None:
    if previous is None:
        return None
    prev = np.asarray(previous, dtype=np.float64)
    if prev.shape != shape:
        raise UsageError(f"expected shape {shape} (the previous step's sketches), got {prev.shape}",
                         field="previous")
    return prev


def _drift_cos(inp: _Inputs, drift: np.ndarray, usable: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """(K,) cos(d_k,t, d_k,t−1), both against the mean of the reference ranks (NaN where undefined)."""
    k = len(drift)
    if inp.previous is None:
        return np.full(k, np.nan)
    p = inp.previous
    ok = np.isfinite(p).all(axis=1)
    if not (ref & ok).any():
        return np.full(k, np.nan)
    c = _row_cos(drift, p - p[ref & ok].mean(axis=0))
    return np.where(usable & ok & np.isfinite(c), np.clip(c, -1.0, 1.0), np.nan)


def _row_cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(K,) the cosine of each row of a (K, m) with the same row of b (NaN or inf for a zero row)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.einsum("ka,ka->k", a, b) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _turn(inp: _Inputs, usable: np.ndarray) -> np.ndarray:
    """(K,) arccos cos(S g_k,t, S g_k,t−1) in radians (NaN where either is unusable or zero)."""
    if inp.previous is None:
        return np.full(len(usable), np.nan)
    c = _row_cos(inp.sketches, inp.previous)
    ok = usable & np.isfinite(c)
    return np.where(ok, np.arccos(np.clip(np.where(ok, c, 0.0), -1.0, 1.0)), np.nan)


def _signals(inp: _Inputs, usable: np.ndarray, ref: np.ndarray) -> RankSignals:
    s, sq, bad = inp.sketches, inp.sq_norms, inp.nonfinite
    k, r = s.shape[0], s.shape[1] // SKETCH_DIM
    nan = np.full(k, np.nan)
    if not ref.any():
        return RankSignals(k, r, bad, usable, ref, sq, nan, nan.copy(), nan.copy(), nan.copy(), math.nan,
                           noise_scale(sq[ref], math.nan, inp.batch), EXACT_ALWAYS, inp, nan.copy(),
                           nan.copy(), _turn(inp, usable))
    n = ref.sum()
    sbar = s[ref].sum(axis=0) / n  # np.mean's value, bit for bit, without its overhead
    drift = s - sbar
    e = np.where(usable, energy(drift.reshape(k, r, SKETCH_DIM), _psi(inp.line)).mean(axis=1), np.nan)
    norms = np.sqrt(np.where(usable, sq, np.nan))
    med = pooled_median(norms[ref])  # np.median's value (finite), without its overhead
    rel = norms / med if med > 0 else nan.copy()  # NaN for unusable ranks (norms is NaN there)
    exact_ok = inp.dots is not None and bool(ref.all()) and bool(
        np.isfinite(inp.dots).all() and np.isfinite(inp.sq_dists).all())
    if exact_ok:
        mean_sq = float(np.mean(inp.dots))
        dist, exact = inp.sq_dists, EXACT_ALWAYS | set(_FROM_MEAN)
        with np.errstate(divide="ignore", invalid="ignore"):
            cos = inp.dots / (norms * math.sqrt(mean_sq)) if mean_sq > 0 else nan.copy()
    else:
        dist = np.where(usable, np.einsum("ka,ka->k", drift, drift) / r, np.nan)
        mean_sq = float(sq[ref].sum() / n - dist[ref].sum() / n)
        with np.errstate(divide="ignore", invalid="ignore"):
            cos = (s @ sbar) / (np.linalg.norm(s, axis=1) * np.linalg.norm(sbar))
        exact = EXACT_ALWAYS
    cos = np.where(usable & (norms > 0), np.clip(cos, -1.0, 1.0), np.nan)
    return RankSignals(k, r, bad, usable, ref, sq, rel, e, cos, np.where(usable, dist, np.nan), mean_sq,
                       noise_scale(sq[ref], mean_sq, inp.batch), frozenset(exact), inp,
                       _drift_cos(inp, drift, usable, ref), _drift_t2(inp, drift, usable), _turn(inp, usable))


def _check_inputs(sketches: object, sq_norms: object, nonfinite: object
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s = np.asarray(sketches, dtype=np.float64)
    if s.ndim != 2 or s.shape[0] < 1 or s.shape[1] < SKETCH_DIM or s.shape[1] % SKETCH_DIM:
        raise UsageError(f"expected shape (K, 14*R) with K >= 1, R >= 1; got {s.shape}", field="sketches")
    k = s.shape[0]
    sq = np.asarray(sq_norms, dtype=np.float64)
    if sq.shape != (k,):
        raise UsageError(f"expected shape ({k},), got {sq.shape}", field="sq_norms")
    raw = np.asarray(nonfinite, dtype=np.float64)
    if raw.shape != (k,):
        raise UsageError(f"expected shape ({k},), got {raw.shape}", field="nonfinite")
    return s, sq, bad_counts(raw)


def _check_exact(dots: object, sq_dists: object, k: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The exact statistics as (K,) float64 arrays, or (None, None)."""
    if (dots is None) != (sq_dists is None):
        raise UsageError("give both dots and `sq_dists` (exact statistics) or neither", field="dots")
    if dots is None:
        return None, None
    out = []
    for name, v in (("dots", dots), ("sq_dists", sq_dists)):
        a = to_float64(v, name)
        if a.shape != (k,):
            raise UsageError(f"expected shape ({k},), got {a.shape}", field=name)
        out.append(a)
    return out[0], out[1]
