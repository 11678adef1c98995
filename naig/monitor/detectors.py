"""Per-rank detectors: pooled calibration across ranks, transient tests and CUSUM change detection.

For each signal of ``naig.monitor.signals`` a detector looks at one value per rank and step,
on a scale where ordinary variation is roughly symmetric and nothing blows up:

=============== ====================== ================ ======================================
signal          value x_k              flagged when     meaning
=============== ====================== ================ ======================================
``norm``        log ‖g_k‖              u > t or u < −t  a gradient far larger or smaller (zero)
``cos``         arccos cos(g_k, ḡ)     u > t            a rank pointing away from the mean
``distance``    log ‖g_k − ḡ‖²         u > t            a rank far from the mean
``energy``      E_k^(1/3)              u > t            a large Fano–Fisher drift energy
``persistence`` cos(d_k,t, d_k,t−1)    CUSUM only       a drift that keeps its direction
``drift``       T²_k                   T² > h           a drift accumulated over ~1/λ steps
``turn``        −log ∠(g_k,t, g_k,t−1) u > t             a gradient that barely turns (reused data)
=============== ====================== ================ ======================================

(a norm of 0 is taken as 1e-150 before the log, so a zero gradient is an extreme low norm). The
angle rather than log(1 − cos) because a sketched cosine near 1 would send the log to −∞; the
cube root of the energy (Wilson–Hilferty: near-normal for χ² laws) rather than its log.

``persistence`` (``RankSignals.drift_cos``) is the cosine between a rank's sketched drift from
the mean at this step and at the previous one: a clean rank draws a fresh minibatch every step,
so its drift is new noise and the cosine scatters about 0 (measured on the small GPT at K = 4,
batch 8: mean 0.0, sd 0.35–0.4); a rank whose departure keeps one direction (a batch it keeps
reusing, a shard of another kind of data, weights that drifted) stays near 0.7–0.9. One step of it
says little (the cosine is bounded: no single value is far out), so only its CUSUM runs; the
detector keeps the previous step's sketches (K × m floats, in its state) to measure it.

``turn`` (``RankSignals.turn``) is the angle between a rank's own sketched gradients at this step
and the previous one, scored as −log of the angle (larger: turns less). No other rank enters it, so
a bad rank cannot leak into the clean ranks' values, as it does into their drifts from a mean it is
part of (measured: the clean ranks' ``persistence`` rose to 0.5–0.8 beside a rank reusing its
batch). Consecutive clean gradients share the mean gradient and differ by fresh noise, the same
for every clean rank (the centring below removes the common trend as the noise takes over); a rank
that reuses one batch keeps its noise too, and its gradient turns by a fraction of the clean
ranks' angle (the small GPT at batch 8, K = 4, from step 41: its u about 2–8 at every step, the
clean ranks' 99.9% quantile 3.7 on the validation pool). Both tests run on it (until 2026-12-06 its
CUSUM only: two similar batches in a row happen; the transient test, tried on the validation seeds
and pools, named one of the three validation repeated batches 3 steps sooner at the same false
alarms, docs/results/monitor-detection.md), on the previous step's sketches the detector keeps.

``drift`` (``RankSignals.drift_t2``) is the multivariate EWMA statistic of the same drifts (Lowry
et al. 1992), each relative to the step's typical one (d̃_k,t = d_k,t / median_j ‖d_j,t‖, which
removes a spread that grows as training goes on, as the centring does for the other signals):
e_k,t = (1 − λ) e_k,t−1 + λ d̃_k,t with λ = ``DRIFT_LAMBDA`` (0.1), and
T²_k = e_kᵀ P e_k / (m λ/(2 − λ)), P the inverse of the clean ranks' drift covariance Σ̂ (each
clean step adds the mean of d_k d_kᵀ over the pooled ranks to an average that forgets at the
rate 1/``window``). Where ``persistence`` compares two steps, e carries ~1/λ of them: a small
departure that keeps its direction (a stale rank, a batch reused, text of another kind) grows
in e while the noise of fresh batches averages out, and P weighs each sketch coordinate by its
own spread. T² is already on its null scale, and it is autocorrelated (e moves slowly), so it is
not centred, pooled and fitted as the other signals are (a bad rank's rising T² would enter the
pool and the tail record before it is named and raise its own threshold): its threshold h is the
(1 − α) quantile of T² in the steady state of EWMA chains fed with the *single-step* clean drifts,
whitened by P and resampled (``drift_threshold``: a bootstrap of the empirical law, heavy tails
included, then the same peaks-over-threshold extrapolation as "Tails"), refitted with the other
thresholds. A single step of a slightly shifted rank barely moves that law. It gets the transient
test only (the EWMA is already the accumulation a CUSUM would add), and a rank named by it restarts
its e from 0 (as a CUSUM side restarts after its alarm). The detector keeps e (K × m), Σ̂ (m × m)
and the last ``DRIFT_RECORD`` clean drifts in its state; T² is NaN (not scored) until Σ̂ rests on
2m clean drifts, and is not tested until the record holds ``DRIFT_MIN_STEPS`` (32) clean steps:
a Σ̂ and a law from the first few steps raised most of the early false alarms at K = 8.

**Normalisation (K ≥ 3).** Each value is centred on the other ranks at the same step,

    y_k = x_k − median_{j ≠ k, j in the reference} x_j,

which removes what moves every rank at once (the trend of training, a learning-rate change, a
loss spike of the global batch). Under the assumption below the y_k of every rank and step
follow one law, so they are **pooled**: the last ``window`` clean steps × K ranks (hundreds of
values: 192 at K = 3, 512 at K = 8 with the default window of 64) give one location and scale
per signal, m = median and s = 1.4826 · MAD of the pool, and every rank is scored by

    u_k = (y_k − m) / max(s_k, ``min_scale``),   s_k ≥ s (see "Scale that keeps up").

A rank's values enter the pool only when it is usable and was not named in the last ``hold``
steps, so a rank that goes bad does not widen the scale it is judged by once it is named.
(Leaving out ranks whose change statistic is merely high was tried and rejected: it keeps the
calm values only, so the scale shrinks and clean ranks are flagged more often.)

**Assumption: exchangeable clean ranks.** Pooling is right when, absent a fault, the ranks are
interchangeable: the same model, the same data distribution, the same batch size, the same
numerics. What breaks it: heterogeneous data per rank (a shard of another language or domain,
non-i.i.d. federated splits), a rank with another batch size (its log-norm sits log √(b/b′)
away and its spread differs), ranks on different hardware or precision. Such a rank is a
*persistent* departure from the others, and the change detector below names it (within the
first window, or as soon as it starts): the monitor does not know such a difference is
intended. Its answer is to say which rank and signal departed and from which step; if the
difference is by design, watch those ranks in their own ``process_group`` (a group of
exchangeable ranks) or restrict ``signals`` to those that are comparable.

**Warm-up.** Until the pool holds ``warmup`` clean steps (default 16; at most ``window``), only
non-finite checks run; the ``Decision`` says so (``Decision.warmup``) and the detector warns
once at its first step (``WARMUP``) unless ``quiet``. A resumed run restores the pool with
``load_state_dict`` and has no second warm-up.

**Scale that keeps up.** The cross-rank spread of a signal changes as training goes on (measured:
the log-norm's spread doubles over the first 40 steps of the small GPT at batch 8, and triples
over 80 steps at batch 64), so a scale from the whole pool lags a growing spread and clean ranks
are flagged. Each rank k is therefore scored on its own scale s_k, the larger of the pooled scale
and the spread of the *other* ranks' pooled values over the last ``RECENT_STEPS`` (4) steps
(1.4826 · MAD about their median): it follows a growing spread within a few steps, a shrinking
one only costs power, and a rank that departs does not widen its own scale. It does widen the
others' (the median each clean rank is centred on moves), so at K = 4 a small persistent shift is
found more slowly than against the pooled scale alone (tests/test_monitor_detectors.py measures
it); the false-alarm rate is the reason (docs/results/monitor-detection.md).

**Tails.** Real gradient statistics have heavier tails than normal (measured on the small GPT's
clean runs: the normalised log-norm exceeds the normal-theory threshold of α = 3.6·10⁻⁵ about
50 times as often), and the tests' thresholds lie far in the tail. So each detector keeps a
*tail record*: the normalised values u of the last ``TAIL_STEPS`` (1024) clean steps (the pool's
ranks at the steps it pooled, each u as it was scored), and every ``refit_every`` clean steps (8;
32 once the record holds 64 steps; 128 once it is full) fits each signal's thresholds on it (on
the pool normalised by itself while the record is shorter than the pool):

- the transient threshold t is the larger of the normal-theory one below and the record's
  (1 − α) quantile by peaks over a threshold (``tail_quantile``: Pickands 1975; Balkema & de
  Haan 1974; a generalised Pareto law fitted to the top 10%, at least 16 values, by probability-
  weighted moments, Hosking & Wallis 1987, its shape shrunk toward an exponential tail while few
  values back it);
- the CUSUM threshold h is the larger of the normal-theory h and the h whose run length is 1/α
  when the increments follow the record's empirical law (``cusum_threshold_sample``, the
  Brook–Evans chain with the empirical CDF; both sides for ``norm``).

Both are in the state, so a resumed detector decides as the uninterrupted one. A transient fit
needs 32 values, so at the first scored steps (16 × K pooled values) only normal theory applies
to it. **Until its fit, the CUSUM runs on a stricter threshold** (the fit needs 160 values, the
pool's while it is the longer sample, warm-up included: ``CUSUM_FIT_VALUES``; until then h is the
normal-theory h at α × ``UNFITTED_CUSUM``, 1/100 of the rate): on the normal-theory h at α it
raised most of the early false alarms. Chosen on the validation pools and seeds of the
persistent-fault protocol, 2026-12-05, per 1000 clean steps at α = 10⁻³: batch 8, K = 3: 1.22 →
0.41; batch 64, K = 3: 1.22 → 0.68, K = 4: 1.90 → 1.77; the other K and the detection within 10
steps unchanged. No CUSUM at all until the fit gave the same false alarms but named a ×0.5 rank
from step 41 later (median delay 2 → 8; 4 with the stricter threshold). The fit is made at the
refits of ``refit_every``'s cadence: the fitted h is in use from step 57 at K = 3, 41 at K = 4 (49
for persistence and turn, whose samples reach 160 values a step after the refit of step 40), 25 at
K = 8. (Fitting at the step a sample reaches 160 values was tried and reverted, 2026-12-07:
docs/design.md, "The CUSUM's fit at once".)

**Transient tests** (``transient``), for one-step faults: a rank is flagged when u_k passes t,
at least the (1 − α) quantile of the robust z of a normal value against n pooled normal values
(``robust_threshold``: it accounts for the median and MAD being estimated; n is the pool size,
rounded down to one of ``POOL_SIZES``; above 256 the 256 threshold, slightly conservative).

**Change detection** (``cusum``), for persistent faults: per rank, signal and side a CUSUM
(Page, "Continuous inspection schemes", Biometrika 1954) on the normalised values,

    S_t = max(0, S_{t−1} + clip(u_t, ±c) − δ)     (upper; the lower side uses −u_t; ``norm`` has both)

with reference δ (``delta``: half the shift in pooled standard deviations it is tuned to find;
default 1) and clipping c (``clip``, default 3: one outlier adds at most c − δ, so the transient
test, not the CUSUM, answers for single steps). A side alarms when S_t > h; the step the change
began is the step after S was last 0 (``Flag.since``); S restarts from 0 after an alarm, so a
rank that stays bad is named again every few steps. h is at least the value from the average run length to a
false alarm: with N(0, 1) values the alarms of one side form a renewal process of rate
1/ARL₀(h), and h is the value with ARL₀ = 1/α (``cusum_threshold``: Brook & Evans's Markov
chain on 200 states, exact for the clipped normal increments up to the discretisation).

**Thresholds from a false-alarm rate.** ``false_alarm`` is the probability that a clean step
flags any rank (family-wise, per step). It is split evenly (Bonferroni, valid whatever the
dependence) over the tests of a step: α = false_alarm / (K · Σ_signals (transient + CUSUM
sides)); with the default signals that is 10 tests per rank (12 with cos). Correlated signals make the
realised rate lower than false_alarm; tails heavier than the record shows, and a spread that
moves faster than the scale follows, make it higher (docs/results/monitor-detection.md measures
it on real training).

**Naming one rank.** cos, distance and energy are measured against the mean, which a bad rank
pulls: with K = 3 and one rank ×1000, ḡ is a third of that rank and every rank's distance to it
jumps. So when ranks are flagged, each flagged rank c is tried: it is left out of the mean
(``RankSignals.with_reference``) and out of the others' centring, the other ranks are scored
again, and the rank whose exclusion leaves the fewest (then the least) flags is named; the search
goes on among the rest until no rank is flagged. A named rank stays out of the reference (the
mean and the others' centring) for the next ``hold`` steps (default 8), so the ranks it displaced
are not named after it; not a rank named for a non-finite gradient only, which is unusable (left
out) while it lasts and clean after it (held out, it left 2 reference ranks at K = 3, and clean
ranks were flagged after a NaN: 6 flags in the 10 steps after one against 0 on the same data
without it, over 24 seeds × 300 steps, 2026-12-06).

**Two ranks.** With K = 2 the mean-relative signals are symmetric: d₀ = −d₁ against the mean,
so both ranks have the same distance and energy and mirrored angles, and nothing measured against
the mean can say which rank departed; centring on the other rank is symmetric too. So at K ≤ 2
only non-finite ranks and the ``norm`` are scored: each rank's own log-norm, a transient test
against its own last ``window`` values (uncentred), z_k = robust z against that history, scored as
u_k = sign(z_k)·min(|z_k|, |z_k − z_j|) at K = 2 (a move both ranks make, the training trend or a
loss spike, scores near 0; one rank's jump keeps its z; |u_k| ≤ |z_k|). Its threshold is the larger
of the normal-theory one for the history's length and the tail fit on the clean steps' u (the tail
record, as at K ≥ 3; since 2026-12-06: before, the normal-theory threshold alone and z_k alone gave
31.7 and 49.2 false alarms per 1000 steps at α = 10⁻³ on the persistent-fault protocol's 2000-step
validation pools at batch 8 and 64, now 1.97 and 3.15). A flagged step is not pooled, but a named
rank's next clean value is (``hold`` applies at K ≥ 3). cos, distance and energy are not scored
(their scores are NaN), there is no change detection, and the detector warns once (``TWO_RANKS``, a
``UserWarning``). Use 3 ranks or more to compare ranks.

**Non-finite** ranks (a NaN/Inf entry, norm or sketch) are always flagged, with signal
``nonfinite`` and score +inf, from the first step; they are left out of every reference.

**State and determinism.** A ``Detector`` is a pure function of the sequence of ``RankSignals``
it was given (seeded calibration, numpy medians), so ranks fed the same gathered data reach the
same ``Decision`` without another collective. ``state_dict()`` returns its whole state (pool,
CUSUM statistics, change starts, last naming steps, settings) as plain JSON values;
``load_state_dict`` into a detector of the same settings continues exactly as the uninterrupted
one would.

**Actions** (``ACTIONS``, a closed choice; integrations apply them): ``log`` records only;
``warn`` also emits one line naming rank, host and signal; ``skip`` applies no update this step
on any rank; ``exclude`` weights the flagged ranks 0 in the mean where the framework allows it;
``raise`` raises ``BadRankError`` on every rank before the optimizer step.

Example:
    >>> import numpy as np
    >>> from naig.monitor.signals import rank_signals
    >>> det = Detector(3, false_alarm=0.01, window=4, quiet=True)
    >>> sq = np.array([1.0, 1.1, np.nan]); bad = np.array([0, 0, 5])
    >>> det.update(rank_signals(np.ones((3, 14)), sq, bad)).ranks
    (2,)
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from statistics import NormalDist
from typing import TYPE_CHECKING

import numpy as np

from naig.errors import DataError, UsageError, warn_caller
from naig.threads import one_blas_thread

if TYPE_CHECKING:
    from naig.monitor.signals import RankSignals

__all__ = ["ACTIONS", "MAX_WORLD", "SCORES", "SIDES", "SIGNALS", "SIGNAL_TABLE", "MAD_SCALE",
           "DEFAULT_DETECTOR",
           "DEFAULT_SIGNALS", "DEFAULT_SCORES", "DEFAULT_WINDOW", "DEFAULT_WARMUP", "DEFAULT_DELTA",
           "DEFAULT_CLIP", "DEFAULT_HOLD", "POOL_SIZES", "STATE_VERSION", "TWO_RANKS", "WARMUP",
           "DRIFT_LAMBDA", "DRIFT_MIN_STEPS", "TAIL_STEPS", "MIN_TEST_RATE", "UNFITTED_CUSUM", "TURN_FLOOR",
           "CUSUM_FIT_VALUES",
           "BadRankError", "Decision", "Detector", "DriftState", "Flag",
           "SignalSpec", "SortedPool",
           "check_action", "cusum_arl", "cusum_threshold", "cusum_threshold_sample", "drift_threshold",
           "gpd_fit", "has_bool", "median_of_others", "null_draws_kept", "null_tail", "pooled_median",
           "pooled_stats", "stats_of_others", "real_numbers", "refit_every", "robust_threshold", "robust_z",
           "signal_values",
           "tail_quantile", "whole_numbers"]

TINY = 1e-300  # a squared norm of 0 before the log
TURN_FLOOR = 1e-6
"""The smallest angle ``turn`` tells apart (radians). A gradient repeated exactly gives a float64
cosine of 1 or a few ulps below it, depending on the rounding of its dot product and norms: an
angle of 0 or 1.5e-8, 2.1e-8, … (arccos(1 − k·2⁻⁵³) ≈ √k·2⁻²⁶); every angle below 1e-6 (a cosine
within ~2000 ulps of 1) scores −log(1e-6) ≈ 13.8, so identical ranks get one value."""


SCORES = ("transient", "cusum")


@dataclass(frozen=True)
class SignalSpec:
    """One scored signal: the ``RankSignals`` field it reads, the transform its detectors score (which
    makes a rank's value roughly Gaussian across steps), and the side its tests fire on (``both``:
    too large or too small; ``upper``: too large only).

    Attributes:
        name: the signal's name (``Detector(signals=...)``, record columns ``score_NAME`` and so on).
        field: the (K,) float64 ``RankSignals`` attribute it transforms.
        side: ``"both"`` or ``"upper"``.
        transform: (K,) float64 → (K,) float64, elementwise.
        scores: the tests that apply to it (a subset of ``SCORES``; ``Detector(scores=...)``
            chooses among them).
    """

    name: str
    field: str
    side: str
    transform: Callable[[np.ndarray], np.ndarray]
    scores: tuple[str, ...] = SCORES


SIGNAL_TABLE: tuple[SignalSpec, ...] = (
    SignalSpec("norm", "sq_norm", "both", lambda x: 0.5 * np.log(np.maximum(x, TINY))),  # log ‖g‖
    SignalSpec("cos", "cos", "upper", np.arccos),  # the angle to the others' mean
    SignalSpec("distance", "sq_dist", "upper", lambda x: np.log(np.maximum(x, TINY))),  # log ‖g − ḡ‖²
    SignalSpec("energy", "energy", "upper", np.cbrt),  # E^{1/3} (Wilson–Hilferty: a χ²-like energy)
    SignalSpec("persistence", "drift_cos", "upper", lambda x: np.arctanh(np.clip(x, -0.999, 0.999)),
               ("cusum",)),  # Fisher z of cos(d_t, d_{t−1})
    SignalSpec("drift", "drift_t2", "upper", lambda x: x, ("transient",)),  # MEWMA T², its own null
    SignalSpec("turn", "turn", "upper",  # −log ∠(S g_t, S g_{t−1}): large when the gradient barely turns
               lambda x: -np.log(np.maximum(x, TURN_FLOOR))),
)
"""Every signal the detectors score, once: ``SIGNALS``, ``SIDES``, ``signal_values``, the records'
columns and ``naig detect``'s scores all come from it. A new signal is one entry here plus its
computation in ``naig.monitor.signals`` (a ``RankSignals`` field)."""
SIGNALS = tuple(spec.name for spec in SIGNAL_TABLE)
ACTIONS = ("log", "warn", "skip", "exclude", "raise")
SIDES = {spec.name: spec.side for spec in SIGNAL_TABLE}
_SPEC = {spec.name: spec for spec in SIGNAL_TABLE}
MAD_SCALE = 1.482602218505602  # 1 / Φ⁻¹(3/4)
NULL_DRAWS, NULL_BUDGET, NULL_MAX_N, NULL_SEED = 400_000, 4_000_000, 256, 20180601
NULL_CHUNK = 1 << 17
"""Standard normals drawn and reduced, and null draws summed, at a time for the robust z's null
(1 MB of float64 each): its memory stays a few MB beyond the one kept size's draws."""
POOL_SIZES = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
"""The pool sizes thresholds are computed for: a pool of n values uses the largest size ≤ n."""
ARL_STATES = 200  # Brook–Evans states of the CUSUM's Markov chain
TAIL_FRACTION, TAIL_MIN_EXCEED, XI_PRIOR, XI_MIN, XI_MAX = 0.1, 16, 100, 0.0, 0.45
"""Peaks over a threshold: the top 10% of a sample fits the tail (at least its top 16 values, from
a sample of 32); the fitted shape ξ of k excesses is shrunk toward 0 (an exponential tail) as
ξ·k/(k + 100), and kept in [0, 0.45]: never a bounded tail (ξ < 0, which a few dozen excesses of a
heavy-tailed gradient statistic suggest by chance, and which put the threshold too low: on the
persistent-fault protocol's validation pools, 2026-12-03, a floor of 0 instead of −0.25 gave
1.00, 0.75, 0.12 false alarms per 1000 at K = 3, 4, 8, batch 8, against 1.12, 1.50, 0.38, with
the same detection on the validation seeds), and at most 0.45 (the PWM estimator's reliable
range)."""
CUSUM_FIT_VALUES = int(TAIL_MIN_EXCEED / TAIL_FRACTION)
"""Values a signal's sample needs before its CUSUM threshold is fitted on it (160; see "Tails")."""

RECENT_STEPS = 4
"""The last pooled steps whose spread (of the other ranks) a rank's scale may not fall below (see
"Scale that keeps up")."""
TAIL_STEPS, RECALIBRATE, SAMPLE_ARL_STATES = 1024, 8, 100
"""Clean steps of normalised values kept to fit the tails (K × 1024 per signal), clean steps
between two fits while the record is short (``refit_every``), Brook–Evans states of the empirical
CUSUM chain."""


def refit_every(recorded: int) -> int:
    """Clean steps between two fits of the thresholds, given the steps the tail record holds:
    ``RECALIBRATE`` (8) while it holds fewer than 64, 32 until it is full (``TAIL_STEPS``), 128 after.

    A full record spans 1024 steps, so a fit every 128 (an eighth of it new) lags the record's own
    memory little, and costs a quarter of a fit every 32: at K = 4 a fit (the tails' quantiles and
    CUSUM chains, ~5 ms, and ``drift``'s bootstrap, ~10 ms) every 32 steps was a third of
    ``Monitor.decide``'s mean cost (2026-12-06, benchmarks/monitor_step_cost.py). The persistent-fault
    protocol's fault runs (51 steps) and validation pools (200) never fill the record, so its choice
    of the default is unchanged; its 2000-step test pools measure the false alarms with it.
    """
    if recorded < TAIL_STEPS // 16:
        return RECALIBRATE
    return 4 * RECALIBRATE if recorded < TAIL_STEPS else 16 * RECALIBRATE


STATE_VERSION = 6
"""The layout version of ``Detector.state_dict`` (``load_state_dict`` also reads versions 2, whose
states have no tail record: the tails are then fitted afresh; 3, saved before ``persistence``
existed: a version-3 state whose signals are this detector's without ``persistence`` loads, and
persistence starts afresh, with an empty pool and no previous sketches; and 4, saved before
``drift`` existed, which loads likewise, the drift's EWMA and covariance starting afresh; and 5,
saved before ``turn`` existed, likewise)."""
_SINCE = {"persistence": 4, "drift": 5, "turn": 6}  # the state version each later signal first appears in
DRIFT_LAMBDA = 0.1
"""λ of the ``drift`` signal's EWMA: the newest step's weight (chosen on the validation seeds of the
persistent-fault protocol, 2026-12-05, among 0.1, 0.2, 0.3; docs/results/monitor-detection.md)."""
MAX_WORLD = 1 << 17
"""The most ranks a detector (and a monitor log) may have: more is refused before anything is allocated."""
UNFITTED_CUSUM = 0.01
"""Until a signal's tail record can fit its CUSUM threshold, the CUSUM runs on the normal-theory h
of α × this (6.4 instead of 4.2 at the default rate and K = 4): normal theory at α itself raised
most of the early false alarms (see "Tails")."""
DRIFT_RECORD, DRIFT_CHAINS, DRIFT_STEPS, DRIFT_EVERY = 2048, 1000, 400, 4
"""Clean single-step drifts kept for ``drift``'s threshold (the last 2048 rank-steps: 512 steps at
K = 4), and its bootstrap: 1000 EWMA chains, 400 steps after a burn-in of 5/λ, every 4th value kept
(10⁵ values of T²)."""
DRIFT_MIN_STEPS = 32
"""Clean steps of single-step drifts the ``drift`` threshold waits for before its first fit (fewer
when the record holds fewer: ``DRIFT_RECORD`` // K steps above 64 ranks); until then drift is not
tested. It used to be fitted once 2m drifts were recorded (28: 4 steps at K = 8), on a Σ̂ and a law
from the first few steps, and raised most of the early false alarms at K = 8. Chosen on the
validation pools and seeds of the persistent-fault protocol, 2026-12-05, among a wait of 0, 32 and
40 steps (and of 160, 320, 640 drifts): per 1000 clean steps at α = 10⁻³, batch 8, K = 8 3.26 →
0.14, batch 64, K = 4 1.77 → 1.63, K = 8 7.88 → 4.62 (α = 10⁻⁴: 1.22 → 0 and 4.76 → 2.31), the
detection within 10 steps unchanged (32 and 40 alike; 320 drifts and more lost the text shard at
K = 4)."""
_OWN_NULL = frozenset({"drift"})  # signals on their own null scale: not centred or pooled
TWO_RANKS = ("monitor with 2 ranks: cos, distance, energy, persistence and drift are measured against the "
             "mean, where d_0 = -d_1, so they cannot tell the two ranks apart and are not scored (nor is "
             "turn, a change test); only non-finite gradients and the norm are; use 3 or more ranks to "
             "compare ranks")
"""The one-line warning of a 2-rank ``Detector`` (see "Two ranks" in the module docstring)."""
WARMUP = ("monitor warm-up: only non-finite gradients are checked until {steps} clean steps of history "
          "are pooled (step {until}); after that every test runs at false_alarm={rate:g} per step")
"""The one-line warning a ``Detector`` gives at its first step (see "Warm-up")."""
MAX_WINDOW = 100_000
"""The longest pooled history in steps (memory: K × signals × window floats)."""
MIN_TEST_RATE = 1e-15
"""The smallest false-alarm probability of one test (false_alarm / (K · tests per rank)): near 1e-16,
1 − α rounds to 1 in float64 and no threshold can be computed; a smaller ``false_alarm`` is refused."""
DEFAULT_WINDOW, DEFAULT_WARMUP, DEFAULT_DELTA, DEFAULT_CLIP, DEFAULT_HOLD = 64, 16, 1.0, 3.0, 8
"""Pooled steps, warm-up steps, CUSUM reference δ and clipping c (pooled sd), steps a named rank
stays out of the reference: the defaults the persistent-fault protocol of ``naig detect`` chose on
its validation seeds (docs/results/monitor-detection.md)."""
DEFAULT_DETECTOR = "monitor"
"""The per-rank score ``naig detect`` (per-step protocol) chose on its validation seeds (a name of
``naig.detect.scores.DETECTORS``: the combined rule, every signal and both scores)."""
DEFAULT_SIGNALS = ("norm", "distance", "energy", "persistence", "drift", "turn")
"""The signals of the default ``Detector`` (``Detector(signals=...)``), chosen on the validation
seeds of the persistent-fault protocol (``naig.detect.sequential``; ``ndepwt/δ1``, 2026-12-05;
``ndepw/δ1`` before ``turn``, which named a repeated batch sooner on validation, median delay
9 → 6 steps, at the same false alarms and detection within 10 steps):
``persistence`` raised the mean detection at the same false-alarm bound (a repeated batch), and
``drift`` again (0.786 → 0.810: a text shard; validation false alarms 1.09 → 0.95 per 1000); not
``cos``, whose sketched angle has heavy tails (its spread moves with the step's noise), so it
raised the false-alarm rate for little detection (docs/results/monitor-detection.md)."""
DEFAULT_SCORES = SCORES
"""The scores of the default ``Detector`` (``Detector(scores=...)``)."""


def check_action(action: object) -> str:
    """Validate an action name (one of ``ACTIONS``).

    Raises:
        UsageError: anything else, naming ``action``.
    """
    if action not in ACTIONS:
        raise UsageError(f"use one of {', '.join(ACTIONS)}", field="action", value=action)
    return str(action)


def signal_values(sig: RankSignals, name: str) -> np.ndarray:
    """The (K,) float64 values a detector scores for one signal (see the module's table).

    Raises:
        UsageError: for a name not in ``SIGNALS``.
    """
    spec = _SPEC.get(name)
    if spec is None:
        raise UsageError(f"use one of {', '.join(SIGNALS)}", field="signals", value=name)
    return spec.transform(getattr(sig, spec.field))


def robust_z(x: float, ref: np.ndarray, min_scale: float = 0.0) -> float:
    """(x − median(ref)) / max(1.4826 · MAD(ref), min_scale); NaN when the scale is 0.

    Args:
        x: the value scored.
        ref: (n,) finite reference values, n ≥ 1.
        min_scale: a floor on the scale, in x's units.
    """
    med = pooled_median(ref)  # np.median's value (ref is finite), without its overhead on small arrays
    scale = max(MAD_SCALE * pooled_median(np.abs(ref - med)), min_scale)
    if scale == 0.0:
        return 0.0 if x == med else math.copysign(math.inf, x - med)
    return (x - med) / scale


def _sf(u: np.ndarray) -> np.ndarray:
    """Φ̄(u) = erfc(u/√2)/2 (Numerical Recipes' erfcc: relative error < 1.2e-7), numpy only."""
    z = np.abs(u) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.5 * z)
    poly = (-1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277)))))))))
    r = t * np.exp(-z * z + poly)
    return 0.5 * np.where(u >= 0, r, 2.0 - r)


def _median_rows(x: np.ndarray) -> np.ndarray:
    n = x.shape[1]
    x = np.sort(x, axis=1)
    return x[:, n // 2] if n % 2 else 0.5 * (x[:, n // 2 - 1] + x[:, n // 2])


def pooled_median(v: np.ndarray) -> float:
    """``np.median``'s value of a non-empty 1-D float64 array without NaN, by a partition: O(n), without
    ``np.median``'s overhead on small arrays."""
    h = len(v) // 2
    if len(v) % 2:
        return float(np.partition(v, h)[h])
    x = np.partition(v, (h - 1, h))
    return float(0.5 * (x[h - 1] + x[h]))


_KEPT: dict[int, tuple[np.ndarray, np.ndarray]] = {}
_KEEPING = [0]  # open ``null_draws_kept`` blocks
_KEPT_LOCK = threading.Lock()


@contextlib.contextmanager
def null_draws_kept() -> Iterator[None]:
    """Inside, the null draws behind ``robust_threshold`` and ``null_tail`` are kept for every
    reference count n asked for, not for the last n only (a detector asks for the 11 of
    ``POOL_SIZES``: about 25 MB; each n ≤ 256 holds at most 6.4 MB); they are let go when the
    outermost block ends. For callers that build detectors at many false-alarm rates (``naig
    detect``'s sequential evaluation): each rate's detector walks the pool sizes again, and each new
    size would draw afresh (~50 ms). The thresholds are the same either way. Process-wide: the
    blocks of every thread are counted together (under a lock), and draws made by a thread while
    the last block closes are not kept.
    """
    with _KEPT_LOCK:
        _KEEPING[0] += 1
    try:
        yield
    finally:
        with _KEPT_LOCK:
            _KEEPING[0] -= 1
            if not _KEEPING[0]:
                _KEPT.clear()


def _null(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``_null_draws(n)``, kept for every n inside ``null_draws_kept``, for the last n outside."""
    with _KEPT_LOCK:
        keeping = bool(_KEEPING[0])
        if keeping and n in _KEPT:
            return _KEPT[n]
    draws = _null_draws(n)
    if keeping:
        with _KEPT_LOCK:
            if _KEEPING[0]:
                _KEPT.setdefault(n, draws)
    return draws


@lru_cache(maxsize=1)
def _null_draws(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded draws of (median, 1.4826·MAD) of n standard normals, sorted by the scale.

    One size is kept (up to 6.4 MB): a detector asks for one pool size at a time, for each side
    at the same step, and ``robust_threshold`` keeps every threshold once computed
    (``null_draws_kept`` keeps every size).

    The draws are generated and reduced ``NULL_CHUNK`` values at a time (the generator's stream is
    the same as one (draws, n) call's), so the transient memory is a few MB, not the 3 × 32 MB a
    whole (draws, n) array and its sorted copies took (the monitor's peak RSS at gpt-nano).
    """
    draws = min(NULL_DRAWS, NULL_BUDGET // n)
    rng = np.random.default_rng(NULL_SEED + n)
    m, s = np.empty(draws), np.empty(draws)
    rows = max(1, NULL_CHUNK // n)
    for lo in range(0, draws, rows):
        x = rng.standard_normal((min(rows, draws - lo), n))
        mid = _median_rows(x)
        m[lo:lo + len(x)] = mid
        s[lo:lo + len(x)] = MAD_SCALE * _median_rows(np.abs(x - mid[:, None]))
    order = np.argsort(s, kind="stable")
    m = m[order]  # the unsorted m goes before the sorted s is made: one array less at the peak
    return m, s[order]


def null_tail(t: float, n: int, side: str) -> float:
    """P(z > t) (``upper``/``lower``) or P(|z| > t) (``both``) of the robust z with n references.

    Under the null the value and its n references are independent normals (see the module).

    Raises:
        UsageError: for n < 2 or an unknown side.
    """
    n, two = _check_null(n, side)
    if n == 2:  # z = (√3/c) · Cauchy
        p = 0.5 - math.atan(MAD_SCALE * t / math.sqrt(3.0)) / math.pi
        return 2 * p if two else p
    return _tail_and_slope(t, n, two)[0]


def _tail_and_slope(t: float, n: int, two: bool) -> tuple[float, float]:
    """(P, dP/dt) of ``null_tail`` for n ≥ 3: P = mean Φ̄(m + s·t) (+ Φ̄(s·t − m) for both sides)
    over the seeded draws (m, s) of ``_null``; dP/dt = −mean s·φ(m + s·t) (− s·φ(s·t − m))."""
    m, s = _null(min(n, NULL_MAX_N))
    cut = int(np.searchsorted(s, (9.0 + float(np.abs(m).max())) / t, side="right")) if t > 0 else len(s)
    tail = slope = 0.0
    for lo in range(0, cut, NULL_CHUNK):  # beyond the cut Φ̄ < 1e-19: nothing to add
        mm, ss = m[lo:min(cut, lo + NULL_CHUNK)], s[lo:min(cut, lo + NULL_CHUNK)]
        u = mm + ss * t
        tail += float(_sf(u).sum())
        slope += float((ss * np.exp(-0.5 * u * u)).sum())
        if two:
            v = ss * t - mm
            tail += float(_sf(v).sum())
            slope += float((ss * np.exp(-0.5 * v * v)).sum())
    return tail / len(m), -slope / (len(m) * math.sqrt(2.0 * math.pi))


def _check_null(n: int, side: str) -> tuple[int, bool]:
    if side not in ("upper", "lower", "both"):
        raise UsageError("use upper, lower or both", field="side", value=side)
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 2:
        raise UsageError("needs at least 2 reference values", field="n", value=n)
    return int(n), side == "both"


@lru_cache(maxsize=1024)
def robust_threshold(alpha: float, n: int, side: str) -> float:
    """The t with ``null_tail(t, n, side) = alpha``: the robust z's (1 − α) null quantile.

    Args:
        alpha: the false-alarm probability of this one test, in (0, 0.5).
        n: reference values (≥ 2; above 256 the 256 threshold).
        side: ``upper``, ``lower`` (the same t, applied to −z) or ``both``.

    Raises:
        UsageError: for alpha outside (0, 0.5), n < 2 or an unknown side.
    """
    if not isinstance(alpha, int | float) or not 0 < alpha < 0.5:
        raise UsageError("must be in (0, 0.5)", field="alpha", value=alpha)
    n, two = _check_null(n, side)
    if n == 2:
        return math.sqrt(3.0) / MAD_SCALE * math.tan(math.pi * (0.5 - (alpha / 2 if two else alpha)))
    return math.exp(_solve_log_t(alpha, n, two))


def _solve_log_t(alpha: float, n: int, two: bool) -> float:
    """log t with P(t) = α for n ≥ 3: Newton's method on log P against log t (nearly linear there),
    kept inside a bracket that every step narrows, bisecting where Newton would leave it; to
    |Δ log t| < 1e-10 (4-8 steps where 50 bisections were, about 5× the time)."""
    lo, hi = math.log(1e-3), math.log(1e15)  # P(lo) > α > P(hi)
    x = math.log(max(NormalDist().inv_cdf(1.0 - (alpha / 2 if two else alpha)), 1e-3))
    for _ in range(100):
        tail, slope = _tail_and_slope(math.exp(x), n, two)
        if tail > alpha:
            lo = x
        else:
            hi = x
        step = math.log(tail / alpha) / (math.exp(x) * slope / tail) if tail > 0 and slope < 0 else math.inf
        new = x - step
        if not lo < new < hi:  # Newton leaves the bracket (or P underflowed): bisect
            new = 0.5 * (lo + hi)
        if abs(new - x) < 1e-10 or hi - lo < 1e-10:
            return new
        x = new
    return hi


def _phi(x: np.ndarray) -> np.ndarray:
    """Φ(x), the standard normal CDF (via ``_sf``)."""
    return 1.0 - _sf(np.asarray(x, dtype=np.float64))


def _normal_increments(delta: float, clip: float) -> Callable[[np.ndarray], np.ndarray]:
    """F_X(x) = P(clip(u) − δ ≤ x) for u ~ N(0, 1): 0 below −c − δ, Φ(x + δ) between, 1 from c − δ on."""
    def cdf(x: np.ndarray) -> np.ndarray:
        out = _phi(x + delta)
        return np.where(x < -clip - delta, 0.0, np.where(x >= clip - delta, 1.0, out))
    return cdf


def _sample_increments(sample: np.ndarray, delta: float, clip: float) -> Callable[[np.ndarray], np.ndarray]:
    """F_X(x) = P(clip(u) − δ ≤ x) for u drawn from the empirical law of ``sample`` (sorted, finite)."""
    n = len(sample)

    def cdf(x: np.ndarray) -> np.ndarray:
        out = np.searchsorted(sample, x + delta, side="right") / n
        return np.where(x < -clip - delta, 0.0, np.where(x >= clip - delta, 1.0, out))
    return cdf


def _arl(h: float, cdf: Callable[[np.ndarray], np.ndarray], states: int) -> float:
    """Brook & Evans (1972): ARL₀ from S = 0 of S_t = max(0, S_{t−1} + X_t) > h, X_t i.i.d. ~ ``cdf``."""
    w = 2.0 * h / (2 * states - 1)
    v = np.arange(states) * w
    edges = (np.arange(states) + 0.5) * w  # upper edge of each cell; the last is h
    upper = cdf(edges[None, :] - v[:, None])  # P(next ≤ edge_j | v_i)
    p = np.diff(np.concatenate([np.zeros((states, 1)), upper], axis=1), axis=1)
    try:
        return float(np.linalg.solve(np.eye(states) - p, np.ones(states))[0])
    except np.linalg.LinAlgError:  # a set of states the chain never leaves: no alarm from there
        return math.inf


def cusum_arl(h: float, delta: float, clip: float, states: int = ARL_STATES) -> float:
    """ARL₀: mean steps to the first alarm of S_t = max(0, S_{t−1} + clip(u_t, ±c) − δ) > h from S = 0.

    u_t are i.i.d. N(0, 1). Brook & Evans (1972): the interval [0, h] in ``states`` cells of width
    w = 2h/(2·states − 1), state i at i·w (state 0 holds the atom at 0); the ARL vector solves
    (I − P) L = 1.

    Args:
        h: the threshold (> 0), in pooled standard deviations.
        delta: the reference δ ≥ 0.
        clip: c > δ, the clipping of each value.
    """
    return _arl(h, _normal_increments(delta, clip), states)


def _solve_h(arl: Callable[[float], float], target: float, lo: float = 1e-3, steps: int = 40) -> float:
    """The smallest h (to bisection precision) with arl(h) ≥ target; arl increases with h."""
    hi = max(2.0 * lo, 1.0)
    while arl(hi) < target:
        lo, hi = hi, 2.0 * hi
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if arl(mid) < target else (lo, mid)
    return hi


@lru_cache(maxsize=256)
def cusum_threshold(alpha: float, delta: float = DEFAULT_DELTA, clip: float = DEFAULT_CLIP) -> float:
    """h with ``cusum_arl(h, δ, c) = 1/alpha``: one CUSUM side's threshold at a per-step false-alarm rate.

    After each alarm S restarts at 0, so the alarms of a clean stream are a renewal process whose
    long-run rate is 1/ARL₀ per step.

    Raises:
        UsageError: alpha outside (0, 0.5), δ < 0 or c ≤ δ.
    """
    if not isinstance(alpha, int | float) or not 0 < alpha < 0.5:
        raise UsageError("must be in (0, 0.5)", field="alpha", value=alpha)
    _check_cusum(delta, clip)
    return _solve_h(lambda h: cusum_arl(h, delta, clip), 1.0 / alpha)


def cusum_threshold_sample(sample: np.ndarray, alpha: float, delta: float = DEFAULT_DELTA,
                           clip: float = DEFAULT_CLIP, states: int = SAMPLE_ARL_STATES, low: float = 0.0
                           ) -> float:
    """h with ARL₀ = 1/alpha when the values u_t are i.i.d. from the empirical law of ``sample``.

    The same Brook–Evans chain as ``cusum_arl`` with the empirical CDF of clip(u) − δ in place of
    the normal one: heavier tails than normal (more mass near ±c) make the ARL at a given h
    shorter, so this h is larger than ``cusum_threshold``'s.

    Args:
        sample: (n,) float64 normalised clean values (n ≥ 1; non-finite values are dropped).
        alpha: the per-step false-alarm rate, in (0, 0.5).
        low: the answer is at least this (``low`` itself when its run length already reaches
            1/alpha: one chain solved; a detector passes the normal-theory h).

    Raises:
        UsageError: alpha outside (0, 0.5), δ < 0, c ≤ δ or no finite value.
    """
    if not isinstance(alpha, int | float) or not 0 < alpha < 0.5:
        raise UsageError("must be in (0, 0.5)", field="alpha", value=alpha)
    _check_cusum(delta, clip)
    v = np.sort(np.asarray(sample, dtype=np.float64).ravel())
    v = v[np.isfinite(v)]
    if len(v) == 0:
        raise UsageError("needs at least one finite value", field="sample")
    cdf = _sample_increments(v, float(delta), float(clip))
    if v[-1] <= delta:  # no increment above 0: S never leaves 0
        return math.inf
    arl = lambda h: _arl(h, cdf, states)  # noqa: E731
    if low > 0 and arl(low) >= 1.0 / alpha:
        return float(low)
    return _solve_h(arl, 1.0 / alpha, lo=max(low, 1e-3), steps=12 if low > 0 else 24)


def gpd_fit(excess: np.ndarray) -> tuple[float, float]:
    """Probability-weighted-moment estimates (ξ, σ) of a generalised Pareto law from its excesses.

    P(X > x) = (1 + ξx/σ)^(−1/ξ) (ξ = 0: e^(−x/σ)). Hosking & Wallis (1987), with their k = −ξ:
    a₀ = mean x, a₁ = mean (1 − p_i) x_(i), p_i = (i − 0.35)/n; k = a₀/(a₀ − 2a₁) − 2 and
    σ = 2a₀a₁/(a₀ − 2a₁). Reliable for ξ < 1/2.

    Args:
        excess: (n,) float64 non-negative excesses over a threshold, n ≥ 2, not all 0.

    Raises:
        UsageError: fewer than 2 values, a negative or non-finite one, or all 0.
    """
    x = np.sort(np.asarray(excess, dtype=np.float64).ravel())
    if len(x) < 2 or not np.isfinite(x).all() or x[0] < 0 or x[-1] == 0:
        raise UsageError("needs at least 2 finite non-negative excesses, not all 0", field="excess")
    n = len(x)
    a0 = float(x.mean())
    a1 = float(np.mean((1.0 - (np.arange(1, n + 1) - 0.35) / n) * x))
    d = a0 - 2.0 * a1
    if d <= 0:  # an extremely heavy sample: the estimate is outside the PWM's range
        return XI_MAX, a0 * (1.0 - XI_MAX)
    return 2.0 - a0 / d, 2.0 * a0 * a1 / d


def tail_quantile(sample: np.ndarray, alpha: float, side: str, fraction: float = TAIL_FRACTION,
                  minimum: int = TAIL_MIN_EXCEED) -> float:
    """The (1 − α) quantile of u (``upper``) or |u| (``both``) by peaks over a threshold.

    Pickands (1975), Balkema & de Haan (1974): above q, the sample's (1 − ``fraction``)
    quantile (at least its top ``minimum`` values), the excesses follow a generalised Pareto law
    (``gpd_fit``: ξ of k excesses shrunk to ξ·k/(k + ``XI_PRIOR``), clipped to [``XI_MIN``,
    ``XI_MAX``]); with ζ = P(u > q), the quantile is q + σ/ξ·((ζ/α)^ξ − 1)
    (q + σ·ln(ζ/α) at ξ = 0). An α above ζ is read off the sample directly.

    Args:
        sample: (n,) float64 normalised clean values (non-finite values are dropped).
        alpha: the tail probability, in (0, 0.5).
        side: ``upper`` or ``both``.
        fraction: the share of the sample above q.
        minimum: the fewest excesses a fit needs.

    Returns:
        The quantile, or NaN when fewer than ``minimum`` values lie above q.

    Raises:
        UsageError: alpha outside (0, 0.5) or an unknown side.
    """
    if not isinstance(alpha, int | float) or not 0 < alpha < 0.5:
        raise UsageError("must be in (0, 0.5)", field="alpha", value=alpha)
    if side not in ("upper", "both"):
        raise UsageError("use upper or both", field="side", value=side)
    v = np.asarray(sample, dtype=np.float64).ravel()
    v = v[np.isfinite(v)]
    a = np.abs(v) if side == "both" else v
    top = max(minimum, int(fraction * len(a)))
    if len(a) < 2 * minimum:
        return math.nan
    a = np.partition(a, len(a) - top - 1)  # q in its sorted place, the top values above it (a sort's
    q = float(a[-top - 1])  # values: 1 ms where a sort took 5 at the drift bootstrap's 100,000)
    excess = a[-top:] - q
    if excess.max() == 0:
        return math.nan
    zeta = top / len(a)
    if alpha >= zeta:
        return float(np.quantile(a, 1.0 - alpha))
    xi, sigma = gpd_fit(excess)
    xi = min(max(xi * top / (top + XI_PRIOR), XI_MIN), XI_MAX)
    r = math.log(zeta / alpha)
    return q + sigma * (r if abs(xi) < 1e-9 else math.expm1(xi * r) / xi)


def _check_cusum(delta: object, clip: object) -> None:
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not (
            math.isfinite(delta) and 0 <= delta <= 5):
        raise UsageError("must be a float in [0, 5] (pooled standard deviations)", field="delta", value=delta)
    if isinstance(clip, bool) or not isinstance(clip, int | float) or not (
            math.isfinite(clip) and delta < clip <= 50):
        raise UsageError(f"must be a float in ({delta:g}, 50] (more than delta)", field="clip", value=clip)


@dataclass(frozen=True)
class Flag:
    """One test that fired.

    Attributes:
        rank: the rank named.
        signal: ``nonfinite``, ``weights`` (the replica check, ``naig.monitor.replicas``) or one of
            ``SIGNALS``.
        score: ``nonfinite`` or ``overflow`` (for the signal ``nonfinite``: NaN/Inf entries, or every
            entry finite but ‖g‖² beyond float64), ``mismatch`` (for ``weights``), ``transient`` or
            ``cusum``.
        z: the normalised value u (transient), the CUSUM statistic (cusum; negative for the
            lower side), +inf (non-finite).
        threshold: the threshold it passed (0 for non-finite).
        since: the step the change began (cusum: the step after its statistic was last 0; else
            this step).
    """

    rank: int
    signal: str
    score: str
    z: float
    threshold: float
    since: int = 0


class BadRankError(DataError):
    """A rank was flagged and the action is ``raise``: raised on every rank before the update.

    Attributes:
        decision: the ``Decision`` that raised it.
    """

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        super().__init__(f"{decision.describe()}; no update was applied (action raise)")


@dataclass(frozen=True)
class Decision:
    """What the detectors decided at one step, the same on every rank.

    Attributes:
        step: 1 for the first step the detector saw.
        world: K.
        action: the configured action (applied by the integration when ``flagged``).
        flags: every test that fired, by rank.
        transient: signal → (K,) normalised value u per rank (NaN where not scored).
        cusum: signal → (K,) the CUSUM statistic per rank after this step, the larger side
            (negative when it is the lower side; NaN where not scored).
        thresholds: score → signal → the threshold of this step's tests (NaN where not scored).
        warmup: True while only non-finite checks run (see "Warm-up").
        hosts: each rank's host name, when the integration knows them (else empty).
        where: rank → where its gradient departs most (e.g. a DDP bucket and its parameters),
            when the integration knows it (else empty).
    """

    step: int
    world: int
    action: str
    flags: tuple[Flag, ...]
    transient: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    cusum: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    thresholds: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    warmup: bool = False
    hosts: tuple[str, ...] = ()
    where: Mapping[int, str] = field(default_factory=dict)

    @property
    def ranks(self) -> tuple[int, ...]:
        """The flagged ranks, ascending."""
        return tuple(sorted({f.rank for f in self.flags}))

    @property
    def flagged(self) -> bool:
        """Whether any rank is flagged."""
        return bool(self.flags)

    def since(self, rank: int) -> int | None:
        """The earliest step a flagged rank's change began (None when the rank is not flagged)."""
        steps = [f.since for f in self.flags if f.rank == rank]
        return min(steps) if steps else None

    def describe(self) -> str:
        """One line: the step, then each flagged rank (host, where) with the tests that fired."""
        if not self.flags:
            return f"step {self.step}: no rank flagged" + (" (warm-up: non-finite checks only)"
                                                           if self.warmup else "")
        parts = []
        for r in self.ranks:
            host = f" on {self.hosts[r]}" if r < len(self.hosts) and self.hosts[r] else ""
            host += f" in {self.where[r]}" if r in self.where else ""
            tests = ", ".join(_describe_flag(f) for f in self.flags if f.rank == r)
            parts.append(f"rank {r}{host}: {tests}")
        return f"step {self.step}: " + "; ".join(parts)

    def error(self) -> BadRankError:
        """The ``BadRankError`` of this decision (for the ``raise`` action)."""
        return BadRankError(self)


_NOT_FINITE = {"overflow": "gradient beyond float64 (no non-finite entry; its squared norm overflows)"}


def _describe_flag(f: Flag) -> str:
    if f.signal == "nonfinite":
        return _NOT_FINITE.get(f.score, "non-finite gradient")
    if f.signal == "weights":  # the replica check (naig.monitor.replicas)
        if not math.isfinite(f.z):
            return f"weights not finite (or beyond float64) since step {f.since}"
        return f"weights differ from the other ranks' by {f.z:.3g} of their norm (> {f.threshold:g}) " \
               f"since step {f.since}"
    if f.score == "cusum":
        side = "low" if f.z < 0 else "high"
        return f"{f.signal} {side} since step {f.since} (cusum {abs(f.z):.3g} > {f.threshold:.3g})"
    return f"{f.signal} transient z={f.z:+.3g} (threshold {f.threshold:.3g})"


def _whitening(precision: np.ndarray) -> np.ndarray:
    """R (m, m) with R Rᵀ = P: P's Cholesky factor; for a P that rounding left not quite positive
    definite (the inverse of a near-singular drift covariance: drifts in fewer than m directions,
    ridged by ``_ridged``), v · diag(√max(w, 0)) from its eigenvalues w, when every negative one is
    within 10⁻⁶ of the largest.

    Raises:
        numpy.linalg.LinAlgError: P with a negative eigenvalue beyond that (indefinite).
    """
    try:
        return np.linalg.cholesky(precision)
    except np.linalg.LinAlgError:
        w, v = np.linalg.eigh((precision + precision.T) / 2.0)
        if not (w[-1] > 0 and w[0] >= -1e-6 * w[-1]):
            raise
        return v * np.sqrt(np.maximum(w, 0.0))


def drift_threshold(drifts: np.ndarray, precision: np.ndarray, lam: float, alpha: float,
                    seed: int = NULL_SEED) -> float:
    """h with P(T² > h) = α for a clean rank: the ``drift`` test's threshold (see the module).

    T² = eᵀ P e / (m λ/(2 − λ)) with e_t = (1 − λ) e_t−1 + λ d_t, the d_t drawn independently from
    the empirical law of ``drifts``: ``DRIFT_CHAINS`` chains run ``DRIFT_STEPS`` steps after a
    burn-in of 5/λ, every ``DRIFT_EVERY``-th value kept, and the (1 − α) quantile of those values by
    peaks over a threshold (``tail_quantile``), at least their largest value below it. Seeded: the
    same drifts give the same h on every rank.

    Args:
        drifts: (n, m) float64 clean single-step drifts (n ≥ 1).
        precision: (m, m) float64 P, symmetric positive definite.
        lam: λ in (0, 1].
        alpha: the per-step false-alarm probability of one rank's test, in (0, 0.5).

    Returns:
        h, or inf when every drift is 0.

    Raises:
        UsageError: shapes that disagree, λ outside (0, 1] or alpha outside (0, 0.5).
        numpy.linalg.LinAlgError: a precision that is not positive definite, beyond rounding
            (``_whitening``).
    """
    d, precision = np.asarray(drifts, dtype=np.float64), np.asarray(precision, dtype=np.float64)
    if d.ndim != 2 or len(d) == 0 or precision.shape != (d.shape[1], d.shape[1]):
        raise UsageError(f"expected (n, m) drifts and an (m, m) precision, got {d.shape} and "
                         f"{precision.shape}", field="drifts")
    if not 0 < lam <= 1:
        raise UsageError("must be in (0, 1]", field="lam", value=lam)
    if not isinstance(alpha, int | float) or not 0 < alpha < 0.5:
        raise UsageError("must be in (0, 0.5)", field="alpha", value=alpha)
    m = d.shape[1]
    z = (d @ _whitening(precision)) * lam  # ‖z‖² = λ² dᵀ P d: each step's λ d, whitened
    burn = math.ceil(5 / lam)
    draws = np.random.default_rng(seed).integers(len(z), size=(burn + DRIFT_STEPS, DRIFT_CHAINS))
    e, step, kept = np.zeros((DRIFT_CHAINS, m)), np.empty((DRIFT_CHAINS, m)), []
    for t, rows in enumerate(draws):  # one step of every chain at a time (the draws: one call, same stream)
        e *= 1.0 - lam
        np.take(z, rows, axis=0, out=step)
        e += step
        if t >= burn and (t - burn) % DRIFT_EVERY == 0:
            kept.append(np.einsum("ca,ca->c", e, e))
    t2 = np.concatenate(kept) / (m * lam / (2.0 - lam))
    if not t2.max() > 0:  # drifts all 0: nothing to calibrate against
        return math.inf
    h = tail_quantile(t2, alpha, "upper")
    return float(h) if math.isfinite(h) else float(t2.max())


@dataclass(frozen=True, eq=False)
class DriftState:
    """What ``drift_t2`` needs from the steps before (kept by the detector; see the module).

    Attributes:
        ewma: (K, m) float64 e_k,t−1, the exponentially weighted drift of each rank (0 to start).
        precision: (m, m) float64 P = Σ̂⁻¹, the inverse covariance of a clean rank's drift
            coordinates.
        lam: λ in (0, 1], the weight of the newest step.
    """

    ewma: np.ndarray
    precision: np.ndarray
    lam: float

    def __post_init__(self) -> None:
        e, p = np.asarray(self.ewma), np.asarray(self.precision)
        if e.ndim != 2 or p.shape != (e.shape[1], e.shape[1]):
            raise UsageError(f"expected a (K, m) ewma and an (m, m) precision, got {e.shape} and {p.shape}",
                             field="drift")
        if isinstance(self.lam, bool) or not isinstance(self.lam, int | float) or not 0 < self.lam <= 1:
            raise UsageError("must be in (0, 1]", field="lam", value=self.lam)

    def step(self, drift: np.ndarray, usable: np.ndarray, sketches: np.ndarray) -> np.ndarray:
        """(K, m) e_k,t = (1 − λ) e_k,t−1 + λ d̃_k,t, d̃ = ``relative(drift, usable, sketches)`` (NaN
        rows where it is undefined)."""
        return (1.0 - self.lam) * self.ewma + self.lam * self.relative(drift, usable, sketches)

    @staticmethod
    def relative(drift: np.ndarray, usable: np.ndarray, sketches: np.ndarray) -> np.ndarray:
        """(K, m) d̃_k = d_k / median_j ‖d_j‖ over the usable ranks (NaN rows for the others): the
        drifts relative to this step's typical one, so that a spread that grows as training goes on
        (2–3× over the first 40–80 steps of the small GPT) moves neither T² nor Σ̂. All NaN when
        there is no typical drift: a median drift norm of at most 1e-9 of the ranks' median sketch
        norm (ranks equal up to rounding, whose drifts are rounding errors)."""
        norms = np.sqrt(np.einsum("ka,ka->k", drift, drift))
        if not usable.any():
            return np.full(drift.shape, np.nan)
        scale = pooled_median(norms[usable])
        size = pooled_median(np.sqrt(np.einsum("ka,ka->k", sketches[usable], sketches[usable])))
        if not (math.isfinite(scale) and scale > 1e-9 * size and scale > 0):
            return np.full(drift.shape, np.nan)
        return np.where(usable[:, None], drift / scale, np.nan)


class Detector:
    """Pooled-calibration transient tests and CUSUM change detection per rank and signal.

    Args:
        world: K, the number of ranks, in [1, ``MAX_WORLD``].
        false_alarm: the probability that a clean step flags any rank (family-wise), in (0, 1).
        window: steps of pooled clean history (K · window values per signal), in [3, ``MAX_WINDOW``].
        warmup: clean steps pooled before the tests run (non-finite checks only until then), in
            [3, window] (a larger value is taken as ``window``).
        signals: the signals scored (a subset of ``SIGNALS``).
        scores: the tests used (a subset of ``SCORES``).
        action: one of ``ACTIONS``, carried by every ``Decision``.
        delta: the CUSUM reference δ in pooled standard deviations, in [0, 5].
        clip: the CUSUM's clipping c of each value, in (δ, 50].
        hold: steps a named rank stays out of the reference (≥ 0).
        min_scale: a floor on the pooled scale (log units: 1e-6 is a relative change of 1e-6).
        quiet: no ``TWO_RANKS`` or ``WARMUP`` warning (integrations warn on rank 0 only).

    Raises:
        UsageError: for a bad argument, naming it.

    Warns:
        UserWarning: ``TWO_RANKS`` when ``world`` is 2 and a signal other than ``norm`` is asked
            for; ``WARMUP`` at the first step.
    """

    def __init__(self, world: int, *, false_alarm: float = 1e-3, window: int = DEFAULT_WINDOW,
                 warmup: int = DEFAULT_WARMUP, signals: Sequence[str] = DEFAULT_SIGNALS,
                 scores: Sequence[str] = DEFAULT_SCORES, action: str = "log", delta: float = DEFAULT_DELTA,
                 clip: float = DEFAULT_CLIP, hold: int = DEFAULT_HOLD, min_scale: float = 1e-6,
                 quiet: bool = False) -> None:
        self.world = _check_int(world, "world", 1, MAX_WORLD)
        self.window = _check_int(window, "window", 3)
        if self.window > MAX_WINDOW:
            raise UsageError(f"must be <= {MAX_WINDOW:,} (each rank keeps window values per signal)",
                             field="window", value=window)
        self.warmup = min(_check_int(warmup, "warmup", 3), self.window)
        self.hold = _check_int(hold, "hold", 0)
        self.signals = _check_subset(signals, SIGNALS, "signals")
        self.scores = _check_subset(scores, SCORES, "scores")
        for s in self.signals:
            if not any(self._applies(s, score) for score in SCORES):
                raise UsageError(f"{s} is scored by {' and '.join(_SPEC[s].scores)} only, which scores does "
                                 "not hold; add it to scores or drop the signal", field="signals", value=s)
        real = int | float | np.integer | np.floating  # numpy scalars too, as batch takes them
        if isinstance(false_alarm, bool | np.bool_) or not isinstance(false_alarm, real) or not (
                0 < false_alarm < 1):
            raise UsageError("must be a probability in (0, 1), e.g. 0.001", field="false_alarm",
                             value=false_alarm)
        if isinstance(min_scale, bool) or not isinstance(min_scale, int | float) or not (
                math.isfinite(min_scale) and min_scale >= 0):
            raise UsageError("must be a finite float >= 0", field="min_scale", value=min_scale)
        _check_cusum(delta, clip)
        self.delta, self.clip = float(delta), float(clip)
        self.false_alarm, self.min_scale = float(false_alarm), float(min_scale)
        self.action = check_action(action)
        self.quiet = quiet
        self.blind = frozenset(s for s in self.signals if s != "norm") if self.world <= 2 else frozenset()
        self._blind = np.array([s in self.blind for s in self.signals])  # (S,) masks of the signals
        self._own = np.array([s in _OWN_NULL for s in self.signals])
        self._two = np.array([SIDES[s] == "both" for s in self.signals])
        self._transient_on = np.array([self._applies(s, "transient") for s in self.signals])
        self._cusum_on = np.array([self._applies(s, "cusum") and self.world > 2 for s in self.signals])
        if self.world == 2 and self.blind and not quiet:
            warn_caller(TWO_RANKS)
        self.alpha = self.false_alarm / (self.world * self.tests_per_rank)
        if self.alpha < MIN_TEST_RATE:  # 1 − α rounds to 1 in float64 near 1e-16: no threshold exists
            floor = MIN_TEST_RATE * self.world * self.tests_per_rank
            raise UsageError(f"gives each of the {self.world * self.tests_per_rank} tests of a step (K = "
                             f"{self.world} ranks × {self.tests_per_rank}) a rate below {MIN_TEST_RATE:g}, "
                             f"where float64 has no threshold; use false_alarm >= {floor:.3g}",
                             field="false_alarm", value=self.false_alarm)
        self.step = 0
        self.pool: dict[str, deque[np.ndarray]] = {s: deque(maxlen=self.window) for s in self.signals}
        self.stat = np.zeros((len(self.signals), self.world, 2))  # CUSUM S (upper, lower)
        self.start = np.zeros((len(self.signals), self.world, 2), dtype=np.int64)  # step the excursion began
        self.named = np.zeros(self.world, dtype=np.int64)  # last step each rank was named (0: never)
        self.tails: dict[str, deque[np.ndarray]] = {s: deque(maxlen=TAIL_STEPS) for s in self.signals}
        self.recent: dict[str, deque[np.ndarray]] = {s: deque(maxlen=RECENT_STEPS) for s in self.signals}
        self.calibration: dict[str, tuple[float, float]] = {}  # signal → (transient t, CUSUM h) fitted
        self.fresh = 0  # clean steps recorded since the last fit
        self.last: np.ndarray | None = None  # (K, m) the previous step's sketches (persistence)
        self.scored: RankSignals | None = None  # the last step's signals as scored (drift_cos, drift_t2 in)
        self.ewma: np.ndarray | None = None  # (K, m) each rank's EWMA drift e (drift)
        self.cov: np.ndarray | None = None  # (m, m) Σ̂ · weight, the clean drifts' covariance (drift)
        self.cov_weight, self.cov_count = 0.0, 0  # its weight, and the clean drifts it has seen
        self.drift_record: deque[np.ndarray] = deque(maxlen=max(1, DRIFT_RECORD // self.world))
        self._stats: dict[str, tuple[float, float, int] | np.ndarray] = {}
        self._sorted: dict[str, SortedPool] | None = None  # pools kept in order (above SORTED_POOL)

    @property
    def tests_per_rank(self) -> int:
        """The tests of one rank at one step (the Bonferroni split; see the module)."""
        if self.world <= 2:
            return 1  # the norm's transient test against the rank's own history
        n = 0
        for s in self.signals:
            n += self._applies(s, "transient")
            n += (2 if SIDES[s] == "both" else 1) * self._applies(s, "cusum")
        return n

    def _applies(self, name: str, score: str) -> bool:
        """Whether a test runs on a signal: asked for (``scores``) and one of the signal's own."""
        return score in self.scores and score in _SPEC[name].scores

    @property
    def cusum_h(self) -> float:
        """h for normal values at the per-test rate ``alpha``: the floor of every signal's CUSUM
        threshold (NaN when not used; see "Tails" for the fitted one, ``cusum_threshold_of``)."""
        if "cusum" not in self.scores or self.world <= 2:
            return math.nan
        return cusum_threshold(self.alpha, self.delta, self.clip)

    def cusum_threshold_of(self, name: str) -> float:
        """A signal's CUSUM threshold now: the larger of ``cusum_h`` and the h fitted on its tail
        record; until the record is long enough to fit it, the normal-theory h at
        ``UNFITTED_CUSUM`` × the per-test rate (see "Tails")."""
        fitted = self._fitted(name)[1]
        if math.isfinite(fitted):
            return max(self.cusum_h, fitted)
        if "cusum" not in self.scores or self.world <= 2:
            return math.nan
        return cusum_threshold(self.alpha * UNFITTED_CUSUM, self.delta, self.clip)

    @property
    def warming(self) -> bool:
        """True while fewer than ``warmup`` clean steps are pooled (non-finite checks only): the longest
        pool counts, so a signal that starts afresh in a resumed run (saved before it existed) brings
        no second warm-up, wherever it stands in ``signals``."""
        return max(len(self.pool[s]) for s in self.signals) < self.warmup

    def settings(self) -> dict:
        """The settings a state must match (plain values)."""
        return {"world": self.world, "false_alarm": self.false_alarm, "window": self.window,
                "warmup": self.warmup, "signals": list(self.signals), "scores": list(self.scores),
                "delta": self.delta, "clip": self.clip, "hold": self.hold, "min_scale": self.min_scale}

    def update(self, sig: RankSignals) -> Decision:
        """Score one step, name the bad ranks, update the pool and the change statistics.

        ``scored`` then holds ``sig`` as the detectors measured it: with ``drift_cos`` (persistence)
        and ``drift_t2`` (drift) filled in from the detector's own state, which ``sig`` lacks.

        ``Decision.transient`` and ``cusum`` hold each rank's values from the pass that decided
        it: a named rank's from the pass that named it, every other rank's from the last pass
        (against the reference without the named ranks), as its ``Flag`` values are.

        Raises:
            UsageError: when ``sig`` is for another number of ranks.
        """
        with one_blas_thread():  # small solves and inverses: one BLAS thread (naig.threads)
            return self._update(sig)

    def _update(self, sig: RankSignals) -> Decision:
        self.scored = None
        if sig.world != self.world:
            raise UsageError(f"signals of {sig.world} ranks for a detector of {self.world}", field="world",
                             value=sig.world)
        self.step += 1
        if self.step == 1 and not self.quiet and self.warming:
            warn_caller(WARMUP.format(steps=self.warmup, until=self.warmup + 1, rate=self.false_alarm))
        flags = [Flag(r, "nonfinite", _unusable_kind(sig, r), math.inf, 0.0, self.step)
                 for r in np.flatnonzero(~sig.usable).tolist()]
        if "persistence" in self.signals or "turn" in self.signals:
            same = self.last is not None and self.last.shape == sig.inputs.sketches.shape
            if self.world > 2:  # at K = 2 blind (opposite drifts; no change tests): left NaN
                sig = sig.with_previous(self.last if same else None)  # another sketch width: afresh
            self.last = np.where(sig.usable[:, None], sig.inputs.sketches, np.nan)
        if "drift" in self.signals and self.world > 2:
            sig = sig.with_drift(self._drift_state(sig.inputs.sketches.shape))
        self.scored = sig
        warming = self.warming
        active = sig.usable.copy()
        ref = self._reference(active)
        first = self._pass(sig, active, ref, scored=not warming)
        scored = first
        kept: dict[int, _Pass] = {}
        while scored.flags:
            c, scored, active, ref = self._explain(sig, active, ref, scored)
            flags += [f for f in kept.setdefault(c, scored.parent).flags if f.rank == c]
        thresholds = self._thresholds()  # the ones this step's tests used (committing may refit them)
        self._commit(first, scored, kept, flags, sig.usable)  # named ranks are now "recent"
        if "drift" in self.signals and self.world > 2:
            self._fold_drift(sig, flags)
        flags.sort(key=lambda f: (f.rank, f.signal != "nonfinite", f.score, f.signal))
        view = _View.of(self, scored, kept)
        return Decision(self.step, self.world, self.action, tuple(flags), view.transient, view.cusum,
                        thresholds, warming)

    def _reference(self, active: np.ndarray) -> np.ndarray:
        """The usable ranks not named within the last ``hold`` steps (all usable if < 2 would remain)."""
        recent = (self.named > 0) & (self.step - self.named <= self.hold)
        ref = active & ~recent
        return ref if ref.sum() >= 2 else active.copy()

    def _drift_state(self, shape: tuple[int, int]) -> DriftState | None:
        """The ``drift`` signal's EWMA and precision for sketches of ``shape`` (None until Σ̂ rests on
        2m clean drifts; another sketch width starts afresh)."""
        if self.ewma is None or self.ewma.shape != shape:
            self.ewma, self.cov, self.cov_weight, self.cov_count = np.zeros(shape), None, 0.0, 0
            self.drift_record.clear()
            self.calibration.pop("drift", None)  # fitted for another sketch width
            self._stats.pop("thresholds", None)
        m = shape[1]
        if self.cov is None or self.cov_count < 2 * m:
            return None
        return DriftState(self.ewma, np.linalg.inv(_ridged(self.cov, self.cov_weight)), DRIFT_LAMBDA)

    def _drift_threshold(self) -> float:
        """h of the ``drift`` test, refitted with the other thresholds (inf until it can be fitted)."""
        if "drift" not in self.calibration:
            rows = np.concatenate(list(self.drift_record)) if self.drift_record else np.zeros((0, 1))
            state = self._drift_state(self.ewma.shape) if self.ewma is not None else None
            h = math.inf
            steps = min(DRIFT_MIN_STEPS, self.drift_record.maxlen or 1)
            if state is not None and len(rows) >= 2 * rows.shape[1] and len(self.drift_record) >= steps:
                h = drift_threshold(rows, state.precision, DRIFT_LAMBDA, self.alpha)
            self.calibration["drift"] = (h, math.nan)
        return self.calibration["drift"][0]

    def _fold_drift(self, sig: RankSignals, flags: list[Flag]) -> None:
        """Fold this step's drifts (against the usable ranks' mean) into each usable rank's EWMA and
        the clean ones (pooled this step) into Σ̂; a rank named by ``drift`` restarts from 0."""
        s, usable = sig.inputs.sketches, sig.usable
        if not usable.any() or self.ewma is None:
            return
        d = DriftState.relative(s - s[usable].mean(axis=0), usable, s)
        if np.isnan(d[usable]).any():  # no typical drift this step (every usable rank alike)
            return
        self.ewma = np.where(usable[:, None], (1.0 - DRIFT_LAMBDA) * self.ewma + DRIFT_LAMBDA * d, self.ewma)
        for f in flags:
            if f.signal == "drift":
                self.ewma[f.rank] = 0.0
        clean = usable & ~self._recent()
        if clean.any():
            dc = d[clean]
            self.drift_record.append(dc)
            forget = 1.0 - 1.0 / self.window
            outer = dc.T @ dc / len(dc)
            self.cov = outer if self.cov is None else forget * self.cov + outer
            self.cov_weight = forget * self.cov_weight + 1.0
            self.cov_count += len(dc)

    def _explain(self, sig: RankSignals, active: np.ndarray, ref: np.ndarray, scored: _Pass
                 ) -> tuple[int, _Pass, np.ndarray, np.ndarray]:
        """Name the flagged rank whose exclusion from the reference leaves the others cleanest.

        For each flagged rank c, the other active ranks are scored again without c in the mean
        and the centring; c is named when that leaves the fewest flagged ranks (then the smallest
        total |z|/threshold, then c's own largest |z|/threshold, then the lowest rank).

        Returns:
            c, the pass without c (its ``parent``: the pass that named c), the active ranks and
            the reference without c.
        """
        best = None
        for c in sorted({f.rank for f in scored.flags}):
            rest, rest_ref = active.copy(), ref.copy()
            rest[c] = rest_ref[c] = False
            if rest_ref.sum() < 1:
                rest_ref = rest.copy()
            trial = self._pass(sig, rest, rest_ref, scored=True)
            own = max(abs(f.z) / f.threshold for f in scored.flags if f.rank == c)
            key = (len({f.rank for f in trial.flags}), sum(abs(f.z) / f.threshold for f in trial.flags),
                   -own, c)
            if best is None or key < best[0]:
                best = (key, c, trial, rest, rest_ref)
        _, c, trial, rest, rest_ref = best
        trial.parent = scored
        return c, trial, rest, rest_ref

    def _pass(self, sig: RankSignals, active: np.ndarray, ref: np.ndarray, *, scored: bool) -> _Pass:
        """Every signal's centred values y, normalised u, candidate CUSUM statistics and flags for
        ``active`` ranks: one (S, K) array per quantity, S = len(``signals``), every signal at once."""
        k, n = self.world, len(self.signals)
        out = _Pass(self, None, None, np.full_like(self.stat, np.nan), self.start.copy(), [])
        if not active.any():
            return out
        mean_ref = active & sig.usable
        cur = sig if np.array_equal(sig.reference, mean_ref) else sig.with_reference(mean_ref)
        seen = ~self._blind
        y = np.full((n, k), np.nan)
        if seen.any():
            x = np.stack([signal_values(cur, s) for s, on in zip(self.signals, seen, strict=True) if on])
            y[seen] = np.where(active, x, np.nan)
        rows = seen & ~self._own  # centred and normalised on their pool (K > 2) or history (K <= 2)
        if k > 2 and rows.any():
            y[rows] -= median_of_others(y[rows], ref)
        out.y = y
        out.u = u = y.copy() if scored else np.full((n, k), np.nan)
        if scored and rows.any():
            u[rows] = self._individual(y[rows], rows) if k <= 2 else self._normalise(y[rows], rows)
        if scored and seen.any():
            self._flags(out, u, seen)
        return out

    def _normalise(self, y: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """(len(y), K) u = (y − m) / max(s_k, ``min_scale``) of the signals ``rows`` selects (y: theirs)."""
        loc, _, _, scale = self._all_stats()
        return (y - loc[rows, None]) / np.maximum(scale[rows], self.min_scale)

    def _fitted(self, name: str) -> tuple[float, float]:
        """(t, h) fitted on the signal's tail record (NaN where it is too short; see "Tails")."""
        if name not in self.calibration:
            sample = self._tail_sample(name)
            side = "both" if SIDES[name] == "both" else "upper"
            t = tail_quantile(sample, self.alpha, side) if len(sample) and self._applies(
                name, "transient") else math.nan
            h = math.nan
            if self._cusum_on[self.signals.index(name)] and len(sample) >= CUSUM_FIT_VALUES:
                low = self.cusum_h
                h = cusum_threshold_sample(sample, self.alpha, self.delta, self.clip, low=low)
                if side == "both":
                    h = max(h, cusum_threshold_sample(-sample, self.alpha, self.delta, self.clip, low=h))
            self.calibration[name] = (t, h)
        return self.calibration[name]

    def _tail_sample(self, name: str) -> np.ndarray:
        """The record's finite normalised values, or the pool normalised by itself while it holds more."""
        rec = np.concatenate(list(self.tails[name])) if self.tails[name] else np.zeros(0)
        rec = rec[np.isfinite(rec)]
        pool = np.concatenate(list(self.pool[name])) if self.pool[name] else np.zeros(0)
        pool = pool[np.isfinite(pool)]
        if len(rec) >= len(pool) or self.world <= 2:  # K <= 2: the pool holds raw, uncentred values
            return rec
        loc, scale, _ = self._pool_stats(name)
        if not (len(pool) and math.isfinite(scale)):
            return rec
        with np.errstate(divide="ignore", invalid="ignore"):  # scale 0 (min_scale=0, a constant pool)
            out = (pool - loc) / max(scale, self.min_scale)
        out = out[np.isfinite(out)]
        return out if len(out) else rec

    def _individual(self, y: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """K ≤ 2: each rank's robust z (``robust_z``) against its own pooled history, for the signals
        ``rows`` selects (y: their (len(y), K) values; NaN where fewer than 3 finite values are pooled);
        at K = 2 no larger than its distance from the other rank's z (``_apart``)."""
        out = np.full(y.shape, np.nan)
        for j, name in enumerate(s for s, on in zip(self.signals, rows, strict=True) if on):
            if not self.pool[name]:
                continue
            hist = np.array(self.pool[name]).T  # (K, T)
            count = np.isfinite(hist).sum(axis=1)
            med = _nan_median_rows(hist)
            scale = np.maximum(MAD_SCALE * _nan_median_rows(np.abs(hist - med[:, None])), self.min_scale)
            ok = np.isfinite(y[j]) & (count >= 3)
            with np.errstate(divide="ignore", invalid="ignore"):
                z = np.where(scale == 0.0, np.where(y[j] == med, 0.0, np.copysign(np.inf, y[j] - med)),
                             (y[j] - med) / scale)
            out[j] = _apart(np.where(ok, z, np.nan))
        return out

    def _pool_stats(self, name: str) -> tuple[float, float, int]:
        """(median, 1.4826·MAD, n) of the pooled finite values of a signal (0, NaN, 0 when there are
        none; cached until the pool moves)."""
        loc, scale, n, _ = self._all_stats()
        i = self.signals.index(name)
        return float(loc[i]), float(scale[i]), int(n[i])

    def _scale(self, name: str) -> np.ndarray:
        """(K,) each rank's scale: the larger of the pooled one and the spread of the other ranks over
        the last ``RECENT_STEPS`` steps (1.4826·MAD about their median; see "Scale that keeps up")."""
        return self._all_stats()[3][self.signals.index(name)]

    def _all_stats(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(S,) pooled medians, (S,) pooled scales, (S,) pooled counts and (S, K) scales of each rank
        (``_scale``) of every signal normalised on its pool (not ``drift``: NaN, 0 there), at once;
        cached until the pool moves."""
        if "all" not in self._stats:
            k, rows = self.world, np.flatnonzero(~self._own)
            loc, scale, n = np.zeros(len(self.signals)), np.full(len(self.signals), np.nan), \
                np.zeros(len(self.signals), dtype=np.int64)
            ranks = np.full((len(self.signals), k), np.nan)
            if len(rows):
                loc[rows], scale[rows], n[rows] = self._pooled(rows)
                ranks[rows] = scale[rows, None]
                recent = _stacked([self.recent[self.signals[i]] for i in rows], k)  # (S', T', K)
                if recent.shape[1]:
                    count, loo = _recent_spread(recent)
                    wider = (count >= 2 * RECENT_STEPS) & (loo > ranks[rows])
                    ranks[rows] = np.where(wider, loo, ranks[rows])
            self._stats["all"] = (loc, scale, n, ranks)
        return self._stats["all"]

    def _pooled(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``pooled_stats`` of the pools of the signals ``rows`` (indices): from the pools kept in order
        (``SortedPool``) where a full pool holds more than ``SORTED_POOL`` values, else by one sort."""
        if self.world * self.window <= SORTED_POOL:
            return pooled_stats(_stacked([self.pool[self.signals[i]] for i in rows], self.world)
                                 .reshape(len(rows), -1))
        if self._sorted is None:  # built here, kept by _append; a loaded state builds them afresh
            self._sorted = {self.signals[i]: SortedPool(self.pool[self.signals[i]])
                            for i in np.flatnonzero(~self._own)}
        stats = np.array([self._sorted[self.signals[i]].stats() for i in rows]).reshape(len(rows), 3)
        med, mad, n = stats.T
        return np.where(n > 0, med, 0.0), MAD_SCALE * mad, n.astype(np.int64)

    def _transient_threshold(self, name: str) -> float:
        if name in _OWN_NULL:
            return self._drift_threshold()
        if self.world <= 2:
            n = min(len(self.pool[name]), NULL_MAX_N)
        else:
            n = self._pool_stats(name)[2]
        sizes = [s for s in POOL_SIZES if s <= n]
        if not sizes:
            return math.inf
        # the tail fit is NaN until the record is long enough: max() keeps its first argument then
        return max(robust_threshold(self.alpha, sizes[-1], SIDES[name]), self._fitted(name)[0])

    def _thresholds_now(self) -> tuple[np.ndarray, np.ndarray]:
        """(S,) this step's transient t and CUSUM h of each signal (NaN where the test does not run or
        the signal is blind), computed once per step."""
        if "thresholds" not in self._stats:
            n = len(self.signals)
            t, h = np.full(n, np.nan), np.full(n, np.nan)
            for i, name in enumerate(self.signals):
                if self._blind[i]:
                    continue
                if self._transient_on[i]:
                    t[i] = self._transient_threshold(name)
                if self._cusum_on[i]:
                    h[i] = self.cusum_threshold_of(name)
            self._stats["thresholds"] = (t, h)
        return self._stats["thresholds"]

    def _flags(self, out: _Pass, u: np.ndarray, seen: np.ndarray) -> None:
        """Transient and CUSUM flags of every seen signal into ``out`` (candidate statistics too), in
        signal order; for each signal its transient flags by rank, then its CUSUM flags by rank and side."""
        t, h = self._thresholds_now()
        ok = np.isfinite(u)
        two = self._two[:, None]
        with np.errstate(invalid="ignore"):
            over = ok & ((u > t[:, None]) | (two & (u < -t[:, None])))  # NaN t: no transient test
        cus = seen & self._cusum_on
        hit = np.zeros((len(u), self.world, 2), dtype=bool)
        if cus.any():
            inc = np.clip(np.where(ok[cus], u[cus], 0.0), -self.clip, self.clip)
            old = self.stat[cus]
            new = np.stack([np.maximum(0.0, old[..., 0] + inc - self.delta),
                            np.where(two[cus], np.maximum(0.0, old[..., 1] - inc - self.delta), 0.0)], -1)
            new[~ok[cus]] = old[~ok[cus]]
            start = np.where((old == 0) & (new > 0), self.step, np.where(new > 0, self.start[cus], 0))
            out.cand[cus], out.start[cus] = new, start
            with np.errstate(invalid="ignore"):
                hit[cus] = ok[cus][..., None] & (new > h[cus][:, None, None])
        for i in np.flatnonzero(over.any(axis=1) | hit.any(axis=(1, 2))):  # usually none
            name = self.signals[i]
            for r in np.flatnonzero(over[i]):
                out.flags.append(Flag(int(r), name, "transient", float(u[i, r]), float(t[i]), self.step))
            for r, side in np.argwhere(hit[i]):
                z = float(out.cand[i, r, side]) * (1 if side == 0 else -1)
                out.flags.append(Flag(int(r), name, "cusum", z, float(h[i]), int(out.start[i, r, side])))

    def _commit(self, first: _Pass, last: _Pass, kept: dict[int, _Pass], flags: list[Flag],
                usable: np.ndarray) -> None:
        """Take the change statistics, the naming steps and (on a clean step) the pool values."""
        for f in flags:  # held out of the reference for `hold` steps; not for a non-finite gradient
            if f.signal != "nonfinite":  # (unusable, so left out, while it lasts; clean again after it)
                self.named[f.rank] = self.step
        if np.isnan(first.cand).all():  # warm-up, K <= 2 or no change detection
            self._append(first, usable if self.world <= 2 else usable & ~self._recent(), flags)
            return
        stat, start = self.stat.copy(), self.start.copy()
        rows = np.isfinite(last.cand[..., 0])
        stat[rows], start[rows] = last.cand[rows], last.start[rows]
        for c, p in kept.items():
            stat[:, c], start[:, c] = np.nan_to_num(p.cand[:, c], nan=0.0), p.start[:, c]
            for f in p.flags:
                if f.rank == c and f.score == "cusum":
                    side = 0 if f.z > 0 else 1
                    j = self.signals.index(f.signal)
                    stat[j, c, side], start[j, c, side] = 0.0, 0
        self.stat, self.start = np.nan_to_num(stat, nan=0.0), start
        self._append(first, usable & ~self._recent(), flags)

    def _recent(self) -> np.ndarray:
        return (self.named > 0) & (self.step - self.named <= self.hold)

    def _append(self, first: _Pass, keep: np.ndarray, flags: list[Flag]) -> None:
        """Pool the first pass's centred values of the ``keep`` ranks (K ≤ 2: only on unflagged steps)."""
        if flags and self.world <= 2:
            return
        if first.y is not None:
            y, u = np.where(keep, first.y, np.nan), np.where(keep, first.u, np.nan)
            tail = np.isfinite(first.u[:, keep]).any(axis=1)  # K <= 2: the own-history z (clean steps only)
            for i, name in enumerate(self.signals):
                pool = self.pool[name]
                if self._sorted is not None and name in self._sorted:
                    self._sorted[name].move(y[i], pool[0] if len(pool) == pool.maxlen else None, pool)
                pool.append(y[i])
                self.recent[name].append(y[i])
                if tail[i]:
                    self.tails[name].append(u[i])
            self._stats.clear()
        self.fresh += 1
        if self.fresh >= refit_every(len(self.tails[self.signals[0]])):
            self.calibration, self.fresh = {}, 0
            self._stats.pop("thresholds", None)

    def _thresholds(self) -> dict[str, dict[str, float]]:
        n = len(self.signals)
        t, h = (np.full(n, np.nan),) * 2 if self.warming else self._thresholds_now()
        return {score: dict(zip(self.signals, (t if score == "transient" else h).tolist(), strict=True))
                for score in self.scores}

    def state_dict(self) -> dict:
        """The whole state as plain JSON values (NaN as None): settings, step, pool, CUSUM, namings."""
        return {"version": STATE_VERSION, "settings": self.settings(), "step": self.step,
                "pool": {s: [_plain(row) for row in self.pool[s]] for s in self.signals},
                "stat": self.stat.tolist(), "start": self.start.tolist(), "named": self.named.tolist(),
                "tails": {s: [_plain(row) for row in self.tails[s]] for s in self.signals},
                "recent": {s: [_plain(row) for row in self.recent[s]] for s in self.signals},
                "calibration": {s: _plain(np.array(v)) for s, v in self.calibration.items()},
                "fresh": self.fresh, "last": None if self.last is None else [_plain(r) for r in self.last],
                "drift": None if self.ewma is None else {
                    "ewma": [_plain(r) for r in self.ewma], "cov_weight": self.cov_weight,
                    "cov_count": self.cov_count,
                    "cov": None if self.cov is None else [_plain(r) for r in self.cov],
                    "record": [[_plain(r) for r in step] for step in self.drift_record]}}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state_dict()`` of a detector with the same settings.

        Raises:
            UsageError: another version, other settings (naming the first that differs) or a
                malformed state.
        """
        if not isinstance(state, Mapping) or state.get("version") not in (2, 3, 4, 5, STATE_VERSION):
            got = state.get("version") if isinstance(state, Mapping) else type(state).__name__
            raise UsageError(f"not a detector state of version 2 to {STATE_VERSION}", field="state",
                             value=got)
        if not isinstance(state.get("settings", {}), Mapping):
            raise UsageError("malformed detector state (its settings are not a mapping); load a state "
                             "saved by Detector.state_dict()", field="state")
        mine, theirs = self.settings(), dict(state.get("settings", {}))
        saved = theirs.get("signals") or []
        if not isinstance(saved, list | tuple) or not all(isinstance(x, str) for x in saved):
            raise UsageError("malformed detector state (settings.signals is not a list of signal names); "
                             "load a state saved by Detector.state_dict()", field="state")
        saved = list(saved)
        older = [s for s in self.signals if _SINCE.get(s, 0) <= state["version"]]
        afresh = older != list(self.signals) and saved == older
        if afresh:
            theirs["signals"] = list(self.signals)  # saved before these signals existed: they start afresh
        unknown = sorted(set(theirs) - set(mine))
        if unknown:
            raise UsageError("the state was saved with settings this detector does not have "
                             f"({', '.join(unknown)}); load a state saved by Detector.state_dict()",
                             field="state")
        for key, value in mine.items():
            if key not in theirs and value is not None:  # "pass key=None" would not help
                raise UsageError(f"malformed detector state (its settings have no {key!r}); load a state "
                                 "saved by Detector.state_dict()", field="state")
            other = theirs.get(key)
            if (list(other) if isinstance(other, list | tuple) else other) != value or \
                    has_bool(other) != has_bool(value):  # True == 1.0 in Python
                raise UsageError(f"the state was saved with {key}={other!r}; pass {key}={other!r} to "
                                 "resume", field=key, value=value)
        try:
            k, s = self.world, len(saved)
            stat = _insert_rows(real_numbers(state["stat"], "stat").reshape(s, k, 2), saved,
                                self.signals)
            start = _insert_rows(whole_numbers(state["start"], "start").reshape(s, k, 2), saved,
                                 self.signals)
            named = whole_numbers(state["named"], "named").reshape(k)
            pool = {n: _rows(state["pool"][n] if n in saved else [], k, self.window) for n in self.signals}
            step = int(whole_numbers(state["step"], "step"))
            v3 = state["version"] >= 3
            tails = {n: _rows(state["tails"][n] if v3 and n in saved else [], k, TAIL_STEPS)
                     for n in self.signals}
            recent = {n: _rows(state["recent"][n] if v3 and n in saved else [], k, RECENT_STEPS)
                      for n in self.signals}
            if v3 and not isinstance(state["calibration"], Mapping):
                raise TypeError("calibration is not a mapping of signal names")
            calibration = {n: tuple(real_numbers(state["calibration"][n], "calibration").reshape(-1).tolist())
                           for n in (state["calibration"] if v3 else {})}
            fresh = int(whole_numbers(state["fresh"], "fresh")) if v3 else 0
            last = _sketch_rows(state.get("last") if state["version"] >= 4 else None, k)
            drift = _drift_rows(state.get("drift") if state["version"] >= 5 else None, k)
            if drift[2] > self.window * (1 + 1e-9):  # a geometric sum of ratio 1 - 1/window: below window
                raise ValueError("the drift covariance's weight exceeds the window")
            if any(n not in self.signals or len(v) != 2 for n, v in calibration.items()):
                raise ValueError("a calibration entry is not (t, h) of a signal")
            if any(not (math.isnan(x) or 0 < x < math.inf) for v in calibration.values() for x in v):
                raise ValueError("a fitted threshold is not > 0 and finite")
            h_drift = calibration.get("drift", (math.nan,))[0]
            if not (h_drift > 0 or math.isnan(h_drift)):
                raise ValueError("the drift threshold is not > 0")
            if "drift" in calibration and math.isnan(h_drift):  # inf (not yet fittable) saves as None
                calibration["drift"] = (math.inf, calibration["drift"][1])
            _check_counters(step, stat, start, named, fresh)
            _check_records(state, saved, step, self.window, self.world, drift[3])
            if afresh:
                calibration = {}  # fitted with fewer tests per rank (a larger α each): refit
        except (KeyError, TypeError, ValueError, OverflowError, np.linalg.LinAlgError) as exc:
            why = f"no key {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
            raise UsageError(f"malformed detector state ({why}); load a state saved by "
                             "Detector.state_dict()", field="state") from None
        self.stat, self.start, self.named, self.pool, self.step = stat, start, named, pool, step
        self.tails, self.recent, self.calibration, self.fresh = tails, recent, calibration, fresh
        self.scored = None  # the loaded state's steps were scored elsewhere
        self.last = last
        self.ewma, self.cov, self.cov_weight, self.cov_count, record = drift
        self.drift_record = deque(record, maxlen=self.drift_record.maxlen)
        self._stats, self._sorted = {}, None


def _leaves(values: object, what: str, *, none: bool) -> np.ndarray:
    """``values`` (a number or nested lists of equal lengths) as an object array, every entry checked
    to be an int or a float (numpy's too; not a bool), or None where ``none``.

    Raises:
        TypeError: an entry of another type (a string, a bool, a list where a number belongs), naming
            ``what``.
        ValueError: lists of unequal lengths.
    """
    a = np.array(values, dtype=object)
    for v in a.flat:
        if (v is None and none) or (isinstance(v, int | float | np.integer | np.floating)
                                    and not isinstance(v, bool | np.bool_)):
            continue
        raise TypeError(f"{what} holds {type(v).__name__} {str(v)[:20]!r}, not a number")
    return a


def real_numbers(values: object, what: str) -> np.ndarray:
    """A state's float entries as float64 (None as NaN: how ``state_dict`` writes a missing value).

    Raises:
        TypeError: an entry that is not a number or None (a string such as "2.5", a bool).
        ValueError: an infinite entry (``state_dict`` writes none), lists of unequal lengths.
    """
    a = _leaves(values, what, none=True)
    out = np.array([math.nan if v is None else float(v) for v in a.flat], dtype=np.float64).reshape(a.shape)
    if np.isinf(out).any():
        raise ValueError(f"{what} holds an infinite value (a state saves none)")
    return out


def has_bool(value: object) -> bool:
    """Whether ``value`` is a bool or a list holding one: a saved setting ``True`` is not the number 1,
    though ``True == 1`` in Python (state loads compare settings with this and ``==``)."""
    items = value if isinstance(value, list | tuple) else [value]
    return any(isinstance(v, bool) for v in items)


def _unusable_kind(sig: RankSignals, rank: int) -> str:
    """``overflow`` for an unusable rank whose every entry is finite (count 0, sketch finite: its
    ‖g‖² exceeds float64), else ``nonfinite``."""
    finite = sig.nonfinite[rank] == 0 and bool(np.isfinite(sig.inputs.sketches[rank]).all())
    return "overflow" if finite else "nonfinite"


def whole_numbers(values: object, what: str) -> np.ndarray:
    """A state's counters (steps, ranks) as int64, of any shape: ints, or floats with whole values
    (3.0; a serialiser may write them so), never truncated.

    Raises:
        ValueError: an entry with a fraction (3.5) or not finite, naming ``what``; entries of unequal
            lengths.
        TypeError: an entry that is not a number (None, a string, a bool, a mapping), naming ``what``.
    """
    _leaves(values, what, none=False)  # "3", True and None are not counters
    as_int = np.array(values, dtype=np.int64)  # ValueError (NaN) / OverflowError (beyond int64)
    if not np.array_equal(np.array(values, dtype=np.float64), as_int.astype(np.float64)):
        raise ValueError(f"{what} holds a value that is not a whole number")
    return as_int


def _check_counters(step: int, stat: np.ndarray, start: np.ndarray, named: np.ndarray, fresh: int) -> None:
    """Raise ValueError unless a loaded state's counters are ones a detector can reach: 0 <= step <= 2**62,
    every CUSUM statistic finite and >= 0, every excursion start and naming step in 0..step, and
    0 <= fresh <= step (a value out of range would load, then crash or silently flag later)."""
    if not 0 <= step <= 1 << 62:
        raise ValueError(f"step {step} is not in 0..2**62")
    if not (np.isfinite(stat).all() and (stat >= 0).all()):
        raise ValueError("a CUSUM statistic is not finite and >= 0")
    for name, a in (("start", start), ("named", named)):
        if a.size and not (a.min() >= 0 and a.max() <= step):
            raise ValueError(f"a {name} step is not in 0..{step} (the state's step)")
    if not 0 <= fresh <= step:
        raise ValueError(f"fresh {fresh} is not in 0..{step}")


def _insert_rows(a: np.ndarray, saved: list[str], signals: tuple[str, ...]) -> np.ndarray:
    """Per-signal rows of a state in ``signals`` order; a signal the state lacks gets zeros."""
    out = np.zeros((len(signals), *a.shape[1:]), dtype=a.dtype)
    for i, name in enumerate(signals):
        if name in saved:
            out[i] = a[saved.index(name)]
    return out


def _sketch_rows(rows: object, k: int, what: str = "the previous sketches") -> np.ndarray | None:
    """The previous step's (K, m) sketches of a state (None as NaN), m a positive multiple of 14 (or
    another (k, m) array of the state, named ``what`` in the errors).

    Raises:
        ValueError: another shape, or an entry that is not a number.
    """
    if rows is None:
        return None
    if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows) or any(
            isinstance(v, bool) or not (v is None or isinstance(v, int | float)) for r in rows for v in r):
        raise ValueError(f"{what} are not rows of numbers")
    last = np.array([[math.nan if v is None else v for v in r] for r in rows], dtype=np.float64)
    if np.isinf(last).any():
        raise ValueError(f"{what} hold an infinite value (a state saves none)")
    if last.ndim != 2 or last.shape[0] != k or last.shape[1] == 0 or last.shape[1] % 14:
        raise ValueError(f"{what} are not {k} rows of 14·R values")
    return last


def _ridged(cov: np.ndarray, weight: float) -> np.ndarray:
    """Σ̂ = ``cov`` / ``weight`` + 10⁻⁹ · (tr Σ̂ / m) · I (m × m): the drift covariance as the ``drift``
    signal inverts it, positive definite when Σ̂ is semi-definite (drifts in fewer than m directions)."""
    c = cov / weight
    return c + 1e-9 * max(float(np.trace(c)) / len(c), TINY) * np.eye(len(c))


def _drift_rows(saved: object, k: int
                ) -> tuple[np.ndarray | None, np.ndarray | None, float, int, list[np.ndarray]]:
    """(ewma, cov, weight, count, record) of the ``drift`` signal from a state (None: afresh).

    Raises:
        ValueError: a malformed entry.
    """
    if saved is None:
        return None, None, 0.0, 0, []
    if not isinstance(saved, Mapping) or saved.get("ewma") is None:
        raise ValueError("the drift state is not a mapping with an ewma")
    ewma = _sketch_rows(saved["ewma"], k, "the drift's ewma rows")
    m = ewma.shape[1]
    cov = None if saved.get("cov") is None else _sketch_rows(saved["cov"], m, "the drift covariance's rows")
    if cov is not None and (cov.shape != (m, m) or not np.isfinite(cov).all() or not np.allclose(cov, cov.T)):
        raise ValueError(f"the drift covariance is not a finite symmetric {m} x {m} matrix")
    weight, count = saved["cov_weight"], saved["cov_count"]
    if isinstance(weight, bool) or not isinstance(weight, int | float) or isinstance(count, bool) or \
            not isinstance(count, int):
        raise ValueError("the drift covariance's weight is not a number or its count not an int")
    if not (math.isfinite(weight) and weight >= 0 and count >= 0) or (cov is None) != (weight == 0):
        raise ValueError("the drift covariance's weight or count is out of range")
    if cov is not None and count >= 2 * m:  # in use: invertible once ridged, as the detector inverts it
        ridged = _ridged(cov, weight)  # (a singular Σ̂ is fine: drifts in fewer than m directions, as a
        np.linalg.cholesky(ridged)  # model of fewer than 14 parameters gives); LinAlgError when indefinite
        if not np.isfinite(np.linalg.inv(ridged)).all():
            raise ValueError("the drift covariance is 0 (or nearly): drift could not be measured with it")
    if not np.isfinite(ewma).all():
        raise ValueError("the drift's ewma holds a missing value")
    record = saved.get("record", [])
    if not isinstance(record, list):
        raise ValueError("the drift record is not a list of steps")
    steps = [_sketch_rows(step, len(step), "the drift record's rows") if isinstance(step, list) and step
             else None for step in record]
    if any(st is None or st.shape[1] != m or not np.isfinite(st).all() for st in steps):
        raise ValueError(f"a step of the drift record is not rows of {m} finite values")
    return ewma, cov, weight, count, steps


def _plain(row: np.ndarray) -> list[float | None]:
    return [float(v) if math.isfinite(v) else None for v in row]


_STATE_KEYS = frozenset({"version", "settings", "step", "pool", "stat", "start", "named", "tails", "recent",
                         "calibration", "fresh", "last", "drift"})


def _check_records(state: Mapping, saved: list[str], step: int, window: int, world: int, cov_count: int
                   ) -> None:
    """The records of a state agree with each other: only known keys, a record per saved signal and no
    other, every signal's pool the same length (each step pools every signal) and within ``window``,
    no record (pool, tail record) longer than the steps taken, the recent spread within its steps, and
    no more drifts in the covariance than ranks × steps.

    Raises:
        ValueError: naming what disagrees.
    """
    extra = sorted(set(state) - _STATE_KEYS)
    if extra:
        raise ValueError(f"unknown entries {extra[:3]}")
    for part in ("pool", "tails", "recent") if state["version"] >= 3 else ("pool",):
        got = state.get(part, {})
        if not isinstance(got, Mapping) or set(got) != set(saved):
            raise ValueError(f"its {part} has not one record per saved signal ({sorted(saved)})")
    lengths = {len(state["pool"][n]) for n in saved}
    if len(lengths) > 1 or max(lengths, default=0) > min(window, step):
        raise ValueError(f"its pools hold {sorted(lengths)} steps, not one length of at most the window "
                         f"({window}) and the steps taken ({step})")
    for part, most in (("tails", step), ("recent", min(step, RECENT_STEPS))):
        if state["version"] >= 3 and any(len(state[part][n]) > most for n in saved):
            raise ValueError(f"a {part} record holds more than {most} steps")
    if cov_count > world * step:
        raise ValueError(f"the drift covariance counts {cov_count} drifts, more than ranks × steps")


def _rows(rows: list, k: int, maxlen: int) -> deque[np.ndarray]:
    """A deque of (k,) float64 rows from their plain values (None as NaN; ``real_numbers``)."""
    if not isinstance(rows, list):
        raise TypeError(f"a record is {type(rows).__name__}, not a list of steps")
    return deque((real_numbers(row, "a pooled value").reshape(k) for row in rows), maxlen=maxlen)


SORTED_POOL = 1024
"""Up to this many pooled values per signal (window × K) the pooled medians of every signal come
from one sort of an (S, window × K) array each step (``pooled_stats``); above it each signal's pool
is kept in order as rows enter and leave it (``SortedPool``, since 2026-12-07; until then two
partitions of the pool per signal and step, most of a step's cost at K = 1024). Both give the same
values bit for bit but for the sign of a zero median (``SortedPool``)."""

DENSE_RANKS = 48
"""Up to this many ranks the leave-one-out medians sort each rank's copy of the others' values
(K small rows in one numpy call); above it ``_LeaveOneOut`` sorts once. Measured per signal and
step (the spread of 4 steps, this 2-core CPU, 2026-12-04): 28 vs 94 µs at K = 4, 64 vs 113 at
K = 32, 187 vs 128 at K = 64, 2,190 vs 164 at K = 128; at K = 1024 the copies made a step of
``Monitor.decide`` take 1 s. Both give the same values bit for bit (tests/test_monitor_detectors.py)."""


def _apart(z: np.ndarray) -> np.ndarray:
    """Two ranks' own-history z (2,) → sign(z_k)·min(|z_k|, |z_k − z_j|): a rank is scored by how far it
    moved from its own history *and* from the other rank's move, so a change both ranks make (the
    training trend, a loss spike, a new learning rate: common to both) scores near 0, while one rank's
    own jump keeps its z. Under a clean null |u_k| ≤ |z_k|, so the own-history test's false-alarm bound
    holds. Any other length (one rank), or a non-finite z, is returned as it is."""
    if z.shape != (2,) or not np.isfinite(z).all():
        return z
    return np.sign(z) * np.minimum(np.abs(z), np.abs(z - z[::-1]))


def _nan_median_rows(v: np.ndarray) -> np.ndarray:
    """(R,) the median of each row's finite values of an (R, n) array (NaN for a row with none; ±inf
    count as missing, as in ``_LeaveOneOut``);
    a sort instead of ``np.nanmedian`` (several times faster on these small rows, and silent)."""
    if v.shape[1] == 0:
        return np.full(len(v), np.nan)
    fin = np.isfinite(v)
    if fin.all():  # the same two order statistics by a partition
        n = v.shape[1]
        x = np.partition(v, ((n - 1) // 2, n // 2), axis=1)
        return x[:, (n - 1) // 2] if n % 2 else 0.5 * (x[:, n // 2 - 1] + x[:, n // 2])
    x = np.sort(np.where(fin, v, np.nan), axis=1)  # NaN (and ±inf: missing) last
    n = np.isfinite(x).sum(axis=1)
    rows = np.arange(len(x))
    lo, hi = x[rows, np.maximum(n - 1, 0) // 2], x[rows, np.maximum(n, 1) // 2]
    med = np.where(n % 2 == 1, lo, 0.5 * (lo + hi))
    return np.where(n > 0, med, np.nan)


@lru_cache(maxsize=8)
def _others(k: int) -> np.ndarray:
    """(K, K − 1) int, read-only: row r lists every rank but r, in order."""
    idx = np.arange(k)
    out = np.array([np.delete(idx, r) for r in range(k)]).reshape(k, k - 1)
    out.setflags(write=False)
    return out


def median_of_others(x: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """For each rank k, the median of x_j over the ranks j ≠ k in ``ref`` with finite x_j (NaN when
    there is none): the centring of every signal (see "Normalisation"), of one signal or several.

    Args:
        x: (K,) or (S, K) float64 values (S signals: each row on its own).
        ref: (K,) bool, the reference ranks.

    Returns:
        x's shape.
    """
    v = np.atleast_2d(np.where(ref & np.isfinite(x), x, np.nan))
    s, k = v.shape
    if k > DENSE_RANKS:
        out = np.stack([_LeaveOneOut(row[None, :]).median() for row in v])
    else:
        m = np.broadcast_to(v[:, None, :], (s, k, k)).copy()
        m[:, np.arange(k), np.arange(k)] = np.nan
        out = _nan_median_rows(m.reshape(s * k, k)).reshape(s, k)
    return out.reshape(np.shape(x))


def pooled_stats(v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's (median, 1.4826·MAD, n) of its finite values (0, NaN, 0 for a row with none), for
    (S, n) pooled values, in one pass over them all (``_nan_median_rows``: the detector's pools of up
    to ``SORTED_POOL`` values; larger ones are kept in order, ``SortedPool``)."""
    n = np.isfinite(v).sum(axis=1)
    med = _nan_median_rows(v)
    mad = _nan_median_rows(np.abs(v - med[:, None]))
    return np.where(n > 0, med, 0.0), MAD_SCALE * mad, n


class SortedPool:
    """The finite values of one signal's pool (a deque of (K,) rows) in ascending order, kept as rows
    enter and leave it: its median and MAD (``stats``) cost O(log n) per step, not the two partitions of
    n values (K × window: 65,536 at K = 1024) that ``pooled_stats`` makes.

    The values are the pool's own, a zero kept as +0.0, and the order statistics those a sort gives;
    the median and the MAD combine them as ``pooled_median`` does. So the results equal
    ``pooled_stats``'s bit for bit but for the sign of a zero median: ``pooled_stats`` returns −0.0 or
    +0.0 as its partition happens to order a pool holding both, this one +0.0, whatever order the values
    came in, so that a pool built afresh from a loaded state gives what the one kept step by step
    gives (tests/test_monitor_detectors.py; a pool that ever disagrees with its deque is sorted afresh).
    """

    def __init__(self, rows: Iterable[np.ndarray]) -> None:
        self.values = _sorted_finite(rows)

    def move(self, new: np.ndarray, old: np.ndarray | None, pool: deque[np.ndarray]) -> None:
        """Take ``old``'s finite values out (the row the deque drops; None: none) and put ``new``'s in;
        ``pool``: the deque before ``new`` is appended (sorted afresh from it, with ``new``, if ``old``'s
        values are not all found)."""
        if old is not None:
            out = np.sort(old[np.isfinite(old)] + 0.0)
            if len(out):  # the i-th copy of a value sits i places after the first
                at = np.searchsorted(self.values, out) + np.arange(len(out)) - np.searchsorted(out, out)
                if (at >= len(self.values)).any() or not (self.values[np.minimum(at, len(self.values) - 1)]
                                                          == out).all():
                    self.values = _sorted_finite([*list(pool)[1:], new])
                    return
                self.values = np.delete(self.values, at)
        add = np.sort(new[np.isfinite(new)] + 0.0)
        if len(add):
            self.values = np.insert(self.values, np.searchsorted(self.values, add), add)

    def stats(self) -> tuple[float, float, int]:
        """(median, MAD about it, n): ``pooled_median`` of the values and of their |v − median| (NaN,
        NaN, 0 for none)."""
        v, n = self.values, len(self.values)
        if n == 0:
            return math.nan, math.nan, 0
        h = n // 2
        med = float(v[h]) if n % 2 else float(0.5 * (v[h - 1] + v[h]))
        below = int(np.searchsorted(v, med))  # v[:below] < med ≤ v[below:]
        lo, hi = _kth_deviation(v, med, below, h - 1 if n % 2 == 0 else h)
        return med, (lo if n % 2 else 0.5 * (lo + hi)), n


def _sorted_finite(rows: Iterable[np.ndarray]) -> np.ndarray:
    """The rows' finite values in ascending order, a zero as +0.0 (``SortedPool``)."""
    rows = list(rows)
    v = np.concatenate(rows) if rows else np.zeros(0)
    return np.sort(v[np.isfinite(v)] + 0.0)


def _kth_deviation(v: np.ndarray, med: float, below: int, k: int) -> tuple[float, float]:
    """The k-th and (k + 1)-th smallest (0-based) of |v − med| over the ascending ``v``, of which
    v[:below] < med: the deviations below med ascend as v descends from v[below − 1] (A), those at or
    above it as v ascends from v[below] (B); the smallest k + 1 take i of A and k + 1 − i of B, i found
    by bisection (the k-th smallest of two sorted sequences), each deviation computed as
    ``np.abs(v − med)`` would."""
    n_a, n_b, t = below, len(v) - below, k + 1

    def a(i: int) -> float:
        return abs(float(v[below - 1 - i]) - med)

    def b(j: int) -> float:
        return abs(float(v[below + j]) - med)

    lo, hi = max(0, t - n_b), min(t, n_a)
    while lo < hi:
        i = (lo + hi) // 2
        if b(t - i - 1) > a(i):
            lo = i + 1
        else:
            hi = i
    i, j = lo, t - lo
    kth = max(a(i - 1) if i > 0 else -math.inf, b(j - 1) if j > 0 else -math.inf)
    nxt = min(a(i) if i < n_a else math.inf, b(j) if j < n_b else math.inf)
    return kth, nxt


def _stacked(rows: list[deque[np.ndarray]], k: int) -> np.ndarray:
    """(S, T, K) float64 of S deques of (K,) rows, the shorter ones padded with NaN rows in front."""
    t = max((len(r) for r in rows), default=0)
    if all(len(r) == t for r in rows):
        return np.array([list(r) for r in rows], dtype=np.float64).reshape(len(rows), t, k)
    out = np.full((len(rows), t, k), np.nan)
    for i, r in enumerate(rows):
        if r:
            out[i, t - len(r):] = np.array(r)
    return out


def _recent_spread(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``stats_of_others``'s counts and spreads of each of S signals' (T, K) rows: (S, K) each."""
    s, _, k = rows.shape
    if k > DENSE_RANKS:
        stats = [stats_of_others(r) for r in rows]
        return np.stack([c for c, _, _ in stats]), np.stack([loo for _, _, loo in stats])
    v = rows[:, :, _others(k)].transpose(0, 2, 1, 3).reshape(s * k, -1)  # (S·K, T·(K − 1))
    mid = _nan_median_rows(v)
    loo = MAD_SCALE * _nan_median_rows(np.abs(v - mid[:, None]))
    return np.isfinite(v).sum(axis=1).reshape(s, k), loo.reshape(s, k)


def stats_of_others(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each rank k, the finite values of the other ranks over the (T, K) ``rows`` (NaN where
    unused): how many, their median and 1.4826 · their MAD about it (NaN where there are none);
    each rank's scale from the others' recent spread (see "Scale that keeps up").

    Returns:
        (K,) int64 counts, (K,) float64 medians, (K,) float64 spreads.
    """
    k = rows.shape[1]
    if k > DENSE_RANKS:
        others = _LeaveOneOut(rows)
        mid = others.median()
        return others.count, mid, MAD_SCALE * others.mad(mid)
    v = rows[:, _others(k)].transpose(1, 0, 2).reshape(k, -1)  # (K, T·(K − 1))
    mid = _nan_median_rows(v)
    return np.isfinite(v).sum(axis=1), mid, MAD_SCALE * _nan_median_rows(np.abs(v - mid[:, None]))


class _LeaveOneOut:
    """Order statistics of a (T, K) array's finite values without column k, for every k at once.

    For each k the values are V ∖ C_k: V the sorted finite values of the whole array (n of them),
    C_k the finite values of column k (at most T). The i-th smallest of V ∖ C_k is V[j] for the
    j that skips C_k's positions in V (``_skip``), so a median costs one sort of n values and
    O(K · T) steps, not K sorts of n − T values (O(K² T log) at K ranks: 1 s per step at K = 1024).
    The values are V's own entries and medians average the same two order statistics as sorting
    each k's values would (``_nan_median_rows``), so the results are equal bit for bit.
    """

    def __init__(self, v: np.ndarray) -> None:
        fin = np.isfinite(v)
        self.sorted = np.sort(v[fin])  # (n,)
        cols = np.sort(np.where(fin, v, np.inf).T, axis=1)  # (K, T) column values, +inf where missing
        self.removed = _positions(self.sorted, cols)  # (K, T) their places in V, ascending (n: none)
        self.count = len(self.sorted) - fin.sum(axis=0)  # (K,) values without column k

    def median(self) -> np.ndarray:
        """(K,) the median of each V ∖ C_k (NaN where it is empty)."""
        rows = np.zeros(len(self.count), dtype=np.int64)
        return _median_skipping(self.sorted[None, :], rows, self.removed, self.count)

    def mad(self, mid: np.ndarray) -> np.ndarray:
        """(K,) the median of |w − mid_k| over w in V ∖ C_k (NaN where empty or mid_k is NaN).

        mid_k (a median of V ∖ C_k) takes few distinct values (removing at most T values moves the
        middle by at most T places): the deviations from each distinct value are sorted once, and
        C_k's places in V are carried to their places in that order.
        """
        n, out = len(self.sorted), np.full(len(mid), np.nan)
        ok = np.isfinite(mid)
        if n == 0 or not ok.any():
            return out
        mids, group = np.unique(mid[ok], return_inverse=True)
        dev = np.abs(self.sorted[None, :] - mids[:, None])  # (G, n)
        order = np.argsort(dev, axis=1, kind="stable")
        place = np.empty_like(order)  # place[g, i]: where V[i]'s deviation lands in the sorted row g
        np.put_along_axis(place, order, np.broadcast_to(np.arange(n), order.shape), axis=1)
        removed = self.removed[ok]
        at = np.where(removed < n, place[group[:, None], np.minimum(removed, n - 1)], n)
        at.sort(axis=1)
        out[ok] = _median_skipping(np.take_along_axis(dev, order, axis=1), group, at, self.count[ok])
        return out


def _positions(values: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """(K, T) ascending positions in the sorted ``values`` of each row's sorted ``cols`` (+inf: none,
    given position ``len(values)``). Copies of one value share its first position: ``_skip`` then
    steps over as many places as there are copies, which lands on the same values."""
    return np.where(np.isfinite(cols), np.searchsorted(values, cols, side="left"), len(values))


def _skip(index: np.ndarray, removed: np.ndarray) -> np.ndarray:
    """(K,) the position in the full sorted array of the index-th value left once each row's
    ``removed`` positions (K, T), ascending, are taken out."""
    j = index.copy()
    for t in range(removed.shape[1]):
        j += removed[:, t] <= j
    return j


def _median_skipping(values: np.ndarray, rows: np.ndarray, removed: np.ndarray, count: np.ndarray
                     ) -> np.ndarray:
    """(K,) for each k the median of the sorted row ``values[rows[k]]`` (values: (G, n)) without
    the positions ``removed[k]``, ``count[k]`` values remaining (NaN where none): the middle value,
    or the mean of the middle two."""
    last = values.shape[1] - 1
    if last < 0:
        return np.full(len(count), np.nan)
    n = np.maximum(count, 1)
    lo = values[rows, np.minimum(_skip((n - 1) // 2, removed), last)]
    hi = values[rows, np.minimum(_skip(n // 2, removed), last)]
    med = np.where(n % 2 == 1, lo, 0.5 * (lo + hi))
    return np.where(count > 0, med, np.nan)


@dataclass
class _Pass:
    """One scoring pass: (S, K) centred values y and normalised u (None: no rank was active),
    (S, K, 2) candidate CUSUM statistics and their starts, flags."""

    det: Detector
    y: np.ndarray | None
    u: np.ndarray | None
    cand: np.ndarray
    start: np.ndarray
    flags: list[Flag]
    parent: _Pass | None = None


@dataclass
class _View:
    """signal → (K,) u and signed CUSUM statistic of each rank, from the pass that decided the rank."""

    transient: dict[str, tuple[float, ...]]
    cusum: dict[str, tuple[float, ...]]

    @classmethod
    def of(cls, det: Detector, last: _Pass, kept: dict[int, _Pass]) -> _View:
        u = np.full(det.stat.shape[:2], np.nan) if last.u is None else last.u.copy()  # (S, K)
        c = last.cand.copy()  # (S, K, 2)
        for r, p in kept.items():
            u[:, r] = np.nan if p.u is None else p.u[:, r]
            c[:, r] = p.cand[:, r]
        signed = np.where(c[..., 1] > c[..., 0], -c[..., 1], c[..., 0])
        return cls({n: tuple(row) for n, row in zip(det.signals, u.tolist(), strict=True)},
                   {n: tuple(row) for n, row in zip(det.signals, signed.tolist(), strict=True)})


def _check_int(value: object, name: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise UsageError(f"must be an int >= {low}", field=name, value=value)
    if high is not None and value > high:
        raise UsageError(f"must be an int <= {high}", field=name, value=value)
    return int(value)


def _check_subset(values: Sequence[str], allowed: tuple[str, ...], name: str) -> tuple[str, ...]:
    try:
        vals = (values,) if isinstance(values, str) else tuple(values)
    except TypeError:  # None, a number: not a sequence of names
        vals = ()
    if not vals or any(v not in allowed for v in vals) or len(set(vals)) != len(vals):
        raise UsageError(f"use a non-empty subset of {', '.join(allowed)}", field=name, value=values)
    return vals
