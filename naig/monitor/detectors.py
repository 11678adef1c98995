"""Per-rank detectors: robust scores against the other ranks and against the rank's own history.

For each signal of ``naig.monitor.signals`` a detector looks at one value per rank and step,
on a scale where ordinary variation is roughly symmetric and nothing blows up:

============ ====================== ================ =========================================
signal       value x_k              flagged when     meaning
============ ====================== ================ =========================================
``norm``     log ‖g_k‖              z > t or z < −t  a gradient far larger or smaller (zero)
``cos``      arccos cos(g_k, ḡ)     z > t            a rank pointing away from the mean (radians)
``distance`` log ‖g_k − ḡ‖²         z > t            a rank far from the mean
``energy``   E_k^(1/3)              z > t            a large Fano–Fisher drift energy
============ ====================== ================ =========================================

(a norm of 0 is taken as 1e-150 before the log, so a zero gradient is an extreme low norm). The
angle rather than log(1 − cos) because a sketched cosine near 1 would send the log to −∞; the
cube root of the energy (Wilson–Hilferty: near-normal for χ² laws, E_k is about (8/3)‖Δ‖²/14·χ²₄)
rather than its log, whose long lower tail would disturb the centring below.

**Scores.** Both are the robust z of a value against reference values r_1..r_n,

    z = (x − median(r)) / max(1.4826 · MAD(r), ``min_scale``),   MAD(r) = median |r_i − median(r)|

(1.4826 = 1/Φ⁻¹(3/4) makes the MAD a standard deviation for normal data):

- ``relative``: x = x_k, r = the other ranks' values at the same step (n = K − 1 when all are
  usable; needs n ≥ 2, so K ≥ 3);
- ``individual``: x = y_k = x_k − median_{j≠k} x_j (centred on the other ranks at the same step
  when K ≥ 3; y_k = x_k for K ≤ 2), r = the rank's own last ``window`` values of y_k, scored once
  the window is full. Centring removes what moves every rank at once (a learning-rate change, a
  loss spike of the global batch, the trend of training): the question is whether *this* rank
  moved away from the others, compared with its own recent past. Histories take a step's values
  only when no rank is flagged at it, so a rank that stays bad stays flagged.

**Naming one rank.** cos, distance and energy are measured against the mean, which a bad rank
pulls: with K = 3 and one rank ×1000, ḡ is a third of that rank and every rank's distance to it
jumps. So when ranks are flagged, each flagged rank c is tried: it is left out of the mean
(``RankSignals.with_reference``) and the other ranks are scored again; the rank whose exclusion
leaves the fewest (then the least) flags is named, and the search goes on among the rest until
no rank is flagged. A bad rank is named alone, not with the ranks it displaced.

**Thresholds from a false-alarm rate.** ``false_alarm`` is the probability that a clean step
flags any rank. It is split evenly (Bonferroni, valid whatever the dependence) over the tests
of a step: α = false_alarm / (K · signals · scores). The threshold of each test is the
(1 − α) quantile of its robust z under the null "x and r_1..r_n independent N(μ, σ²)". That
law does not depend on μ, σ (z is location-scale invariant) but only on n: for n = 2 it is
(√3/1.4826)·Cauchy in closed form; for n ≥ 3 it is computed from 400,000 (fewer for large n,
n·N ≤ 4·10⁶) seeded draws of (median, MAD) of n normals, integrating x exactly:
P(z > t) = E[Φ̄(m + c·s·t)] (two-sided: plus E[Φ̄(c·s·t − m)]). Small n has heavy tails (the
MAD of few values can be tiny): at α = 4·10⁻⁵ the upper threshold is ≈ 8,700 for n = 2,
190 for n = 4, 23 for n = 8, 5.8 for n = 32 (normal: 3.9). This calibration rather than a
normal quantile keeps the stated rate at small n; it assumes Gaussian variation on the
transformed scale, which the transforms make closer to true. The relative score at K = 3 has
n = 2 references (threshold ≈ 8,700 at α = 4·10⁻⁵): it sees only enormous departures, and the
individual score does the work. For n > 256 the n = 256 threshold is used (slightly
conservative: the tails shrink with n from n = 4 on).
``tests/test_monitor_detectors.py`` measures the rate on clean synthetic training streams.

**Two ranks.** With K = 2 the mean-relative signals are symmetric: d₀ = −d₁ against the mean,
so both ranks have the same distance and energy and mirrored angles, and nothing measured against
the mean can say which rank departed; the individual history is uncentred (y_k = x_k) and follows
the trend of training, which gave false alarms on clean runs (4 in 40 steps of
``examples/monitor_ddp.py --nproc 2 --window 16``). So at K = 2 only non-finite ranks and the
``norm`` (each rank's own gradient norm, against its own history) are scored; cos, distance and
energy are not (their z are NaN), and the detector warns once (``TWO_RANKS``, a ``UserWarning``).
Use 3 ranks or more to compare ranks.

**Non-finite** ranks (a NaN/Inf entry, norm or sketch) are always flagged, with signal
``nonfinite`` and score +inf; they are left out of every reference.

**Determinism.** A ``Detector`` is a pure function of the sequence of ``RankSignals`` it was
given (seeded calibration, numpy medians), so ranks fed the same gathered data reach the same
``Decision`` without another collective.

**Actions** (``ACTIONS``, a closed choice; integrations apply them): ``log`` records only;
``warn`` also emits one line naming rank, host and signal; ``skip`` applies no update this step
on any rank; ``exclude`` weights the flagged ranks 0 in the mean where the framework allows it;
``raise`` raises ``BadRankError`` on every rank before the optimizer step.

Example:
    >>> import numpy as np
    >>> from naig.monitor.signals import rank_signals
    >>> det = Detector(3, false_alarm=0.01, window=4)
    >>> sq = np.array([1.0, 1.1, np.nan]); bad = np.array([0, 0, 5])
    >>> det.update(rank_signals(np.ones((3, 14)), sq, bad)).ranks
    (2,)
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from naig.errors import DataError, UsageError
from naig.monitor.signals import RankSignals

__all__ = ["ACTIONS", "SCORES", "SIDES", "SIGNALS", "MAD_SCALE", "DEFAULT_DETECTOR", "DEFAULT_SIGNALS",
           "DEFAULT_SCORES", "TWO_RANKS", "BadRankError", "Decision", "Detector", "Flag", "check_action",
           "null_tail", "robust_threshold", "robust_z", "signal_values"]

SIGNALS = ("norm", "cos", "distance", "energy")
SCORES = ("relative", "individual")
ACTIONS = ("log", "warn", "skip", "exclude", "raise")
SIDES = {"norm": "both", "cos": "upper", "distance": "upper", "energy": "upper"}
MAD_SCALE = 1.482602218505602  # 1 / Φ⁻¹(3/4)
TINY = 1e-300  # a squared norm of 0 before the log
NULL_DRAWS, NULL_BUDGET, NULL_MAX_N, NULL_SEED = 400_000, 4_000_000, 256, 20180601
TWO_RANKS = ("monitor with 2 ranks: cos, distance and energy are measured against the mean, where "
             "d_0 = -d_1, so they cannot tell the two ranks apart and are not scored; only non-finite "
             "gradients and the norm are; use 3 or more ranks to compare ranks")
"""The one-line warning of a 2-rank ``Detector`` (see "Two ranks" in the module docstring)."""
MAX_WINDOW = 100_000
"""The longest individual history (memory: K × signals × window floats, and a median over it per step)."""
DEFAULT_DETECTOR = "monitor"
"""The per-rank score ``naig detect`` chose on its validation seeds (a name of
``naig.detect.scores.DETECTORS``: the combined rule, every signal and both scores; docs/detect.md,
"The default detector"). As ``Detector`` arguments: ``DEFAULT_SIGNALS`` and ``DEFAULT_SCORES``."""
DEFAULT_SIGNALS = SIGNALS
"""The signals of ``DEFAULT_DETECTOR`` (``Detector(signals=...)``)."""
DEFAULT_SCORES = SCORES
"""The scores of ``DEFAULT_DETECTOR`` (``Detector(scores=...)``)."""


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
    if name == "norm":
        return 0.5 * np.log(np.maximum(sig.sq_norm, TINY))
    if name == "cos":
        return np.arccos(sig.cos)
    if name == "distance":
        return np.log(np.maximum(sig.sq_dist, TINY))
    if name == "energy":
        return np.cbrt(sig.energy)
    raise UsageError(f"use one of {', '.join(SIGNALS)}", field="signals", value=name)


def robust_z(x: float, ref: np.ndarray, min_scale: float = 0.0) -> float:
    """(x − median(ref)) / max(1.4826 · MAD(ref), min_scale); NaN when the scale is 0.

    Args:
        x: the value scored.
        ref: (n,) finite reference values, n ≥ 1.
        min_scale: a floor on the scale, in x's units.
    """
    med = float(np.median(ref))
    scale = max(MAD_SCALE * float(np.median(np.abs(ref - med))), min_scale)
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


@lru_cache(maxsize=64)
def _null(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded draws of (median, 1.4826·MAD) of n standard normals, sorted by the scale."""
    draws = min(NULL_DRAWS, NULL_BUDGET // n)
    x = np.random.default_rng(NULL_SEED + n).standard_normal((draws, n))
    m = _median_rows(x)
    s = MAD_SCALE * _median_rows(np.abs(x - m[:, None]))
    order = np.argsort(s, kind="stable")
    return m[order], s[order]


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
    m, s = _null(min(n, NULL_MAX_N))
    cut = int(np.searchsorted(s, (9.0 + float(np.abs(m).max())) / t, side="right")) if t > 0 else len(s)
    mm, ss = m[:cut], s[:cut]  # beyond the cut Φ̄ < 1e-19: nothing to add
    tail = _sf(mm + ss * t)
    if two:
        tail = tail + _sf(ss * t - mm)
    return float(tail.sum()) / len(m)


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
    lo, hi = math.log(1e-3), math.log(1e15)
    for _ in range(50):  # bisection on log t: the tail is decreasing in t
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if null_tail(math.exp(mid), n, side) > alpha else (lo, mid)
    return math.exp(hi)


@dataclass(frozen=True)
class Flag:
    """One test that fired.

    Attributes:
        rank: the rank named.
        signal: ``nonfinite`` or one of ``SIGNALS``.
        score: ``relative`` or ``individual``; for the signal ``nonfinite``: ``nonfinite`` (NaN/Inf
            entries) or ``overflow`` (every entry finite, but ‖g‖² beyond float64).
        z: the robust z (+inf for non-finite).
        threshold: the threshold it passed (0 for non-finite).
    """

    rank: int
    signal: str
    score: str
    z: float
    threshold: float


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
        relative: signal → (K,) relative z per rank (NaN where not scored).
        individual: signal → (K,) individual z per rank (NaN where not scored).
        hosts: each rank's host name, when the integration knows them (else empty).
        where: rank → where its gradient departs most (e.g. a DDP bucket and its parameters),
            when the integration knows it (else empty).
    """

    step: int
    world: int
    action: str
    flags: tuple[Flag, ...]
    relative: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    individual: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
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

    def describe(self) -> str:
        """One line: the step, then each flagged rank (host, where) with the tests that fired."""
        if not self.flags:
            return f"step {self.step}: no rank flagged"
        parts = []
        for r in self.ranks:
            host = f" on {self.hosts[r]}" if r < len(self.hosts) and self.hosts[r] else ""
            host += f" in {self.where[r]}" if r in self.where else ""
            tests = ", ".join(_NOT_FINITE.get(f.score, "non-finite gradient") if f.signal == "nonfinite" else
                              f"{f.signal} {f.score} z={f.z:+.3g} (threshold {f.threshold:.3g})"
                              for f in self.flags if f.rank == r)
            parts.append(f"rank {r}{host}: {tests}")
        return f"step {self.step}: " + "; ".join(parts)

    def error(self) -> BadRankError:
        """The ``BadRankError`` of this decision (for the ``raise`` action)."""
        return BadRankError(self)


_NOT_FINITE = {"overflow": "gradient beyond float64 (no non-finite entry; its squared norm overflows)"}


class Detector:
    """Relative and individual robust scores per rank, thresholds from a false-alarm rate.

    Args:
        world: K, the number of ranks.
        false_alarm: the probability that a clean step flags any rank, in (0, 1).
        window: the individual history length (values scored once it is full), in [3, ``MAX_WINDOW``].
        signals: the signals scored (a subset of ``SIGNALS``).
        scores: the scores used (a subset of ``SCORES``).
        action: one of ``ACTIONS``, carried by every ``Decision``.
        min_scale: a floor on the robust scale (log units: 1e-6 is a relative change of 1e-6).
        quiet: no ``TWO_RANKS`` warning (integrations warn on rank 0 only).

    Raises:
        UsageError: for a bad argument, naming it.

    Warns:
        UserWarning: ``TWO_RANKS`` when ``world`` is 2 and a signal other than ``norm`` is asked
            for: only non-finite ranks and the norm are scored then (see "Two ranks").
    """

    def __init__(self, world: int, *, false_alarm: float = 1e-3, window: int = 32,
                 signals: Sequence[str] = DEFAULT_SIGNALS, scores: Sequence[str] = DEFAULT_SCORES,
                 action: str = "log",
                 min_scale: float = 1e-6, quiet: bool = False) -> None:
        self.world = _check_int(world, "world", 1)
        self.window = _check_int(window, "window", 3)
        if self.window > MAX_WINDOW:
            raise UsageError(f"must be <= {MAX_WINDOW:,} (each rank keeps window values per signal, and "
                             "every step takes their median)", field="window", value=window)
        self.signals = _check_subset(signals, SIGNALS, "signals")
        self.scores = _check_subset(scores, SCORES, "scores")
        if isinstance(false_alarm, bool) or not isinstance(false_alarm, int | float) or not (
                0 < false_alarm < 1):
            raise UsageError("must be a probability in (0, 1), e.g. 0.001", field="false_alarm",
                             value=false_alarm)
        if isinstance(min_scale, bool) or not isinstance(min_scale, int | float) or not (
                math.isfinite(min_scale) and min_scale >= 0):
            raise UsageError("must be a finite float >= 0", field="min_scale", value=min_scale)
        self.false_alarm, self.min_scale = float(false_alarm), float(min_scale)
        self.action = check_action(action)
        self.alpha = self.false_alarm / (self.world * len(self.signals) * len(self.scores))
        self.step = 0
        self.blind = frozenset(s for s in self.signals if s != "norm") if self.world == 2 else frozenset()
        if self.blind and not quiet:
            warnings.warn(TWO_RANKS, UserWarning, stacklevel=2)
        self.history = {s: [deque(maxlen=self.window) for _ in range(self.world)] for s in self.signals}

    def update(self, sig: RankSignals) -> Decision:
        """Score one step, decide which ranks are bad, update the histories.

        The ranks are scored against the mean of every usable rank; while any is flagged, the
        flagged rank whose exclusion from the mean best explains the others' flags is named and
        left out, and the rest are scored again (see the module: "Naming one rank"). Histories
        take the step's values only when no rank is flagged. ``Decision.relative`` and
        ``individual`` hold the first pass's z (against the mean of every usable rank); each
        ``Flag`` holds the z of the pass that named its rank.

        Raises:
            UsageError: when ``sig`` is for another number of ranks.
        """
        if sig.world != self.world:
            raise UsageError(f"signals of {sig.world} ranks for a detector of {self.world}", field="world",
                             value=sig.world)
        self.step += 1
        flags = [Flag(r, "nonfinite", "nonfinite" if sig.nonfinite[r] else "overflow", math.inf, 0.0)
                 for r in range(self.world) if not sig.usable[r]]  # overflow: finite entries, ‖g‖² > float64
        active = sig.usable.copy()
        cur = sig if np.array_equal(sig.reference, active) else sig.with_reference(active)
        scored = self._score(cur, active)
        first = scored
        while scored.flags:
            worst, active, scored = self._explain(sig, active, scored)
            flags += worst
        if not flags:
            for name, y in first.centred.items():
                for r in np.flatnonzero(np.isfinite(y)):
                    self.history[name][r].append(float(y[r]))
        flags.sort(key=lambda f: (f.rank, f.signal != "nonfinite", f.score, f.signal))
        return Decision(self.step, self.world, self.action, tuple(flags), first.relative, first.individual)

    def _explain(self, sig: RankSignals, active: np.ndarray, scored: _Scored
                 ) -> tuple[list[Flag], np.ndarray, _Scored]:
        """Name the flagged rank whose exclusion from the mean leaves the others cleanest.

        For each flagged rank c, the other active ranks are scored again against the mean
        without c; c is named when that leaves the fewest flagged ranks (then the smallest total
        |z|/threshold, then c's own largest |z|/threshold, then the lowest rank).

        Returns:
            c's flags, the active ranks without c, and their scores.
        """
        best = None
        for c in sorted({f.rank for f in scored.flags}):
            rest = active.copy()
            rest[c] = False
            trial = self._score(sig.with_reference(rest), rest) if rest.any() else _Scored.empty(self)
            own = max(abs(f.z) / f.threshold for f in scored.flags if f.rank == c)
            key = (len({f.rank for f in trial.flags}), sum(abs(f.z) / f.threshold for f in trial.flags),
                   -own, c)
            if best is None or key < best[0]:
                best = (key, c, rest, trial)
        _, c, rest, trial = best
        return [f for f in scored.flags if f.rank == c], rest, trial

    def _score(self, sig: RankSignals, active: np.ndarray) -> _Scored:
        """Relative and individual z of the ``active`` ranks against the mean in ``sig``."""
        out = _Scored({}, {}, {}, [])
        for name in self.signals:
            if name in self.blind:  # K = 2: symmetric against the mean, not scored
                nan = np.full(self.world, np.nan)
                out.centred[name] = nan
                out.relative[name] = out.individual[name] = tuple(nan.tolist())
                continue
            x = np.where(active, signal_values(sig, name), np.nan)
            ok = np.isfinite(x)
            y = self._centred(x, ok)
            zr = self._relative(x, ok) if "relative" in self.scores else np.full(self.world, np.nan)
            zi = self._individual(name, y) if "individual" in self.scores else np.full(self.world, np.nan)
            out.centred[name] = y
            out.relative[name], out.individual[name] = tuple(zr.tolist()), tuple(zi.tolist())
            out.flags += self._fired(name, "relative", zr, int(ok.sum()) - 1)
            out.flags += self._fired(name, "individual", zi, self.window)
        return out

    def _centred(self, x: np.ndarray, ok: np.ndarray) -> np.ndarray:
        """x_k − median of the other ranks' x (K ≥ 3; NaN without another), or x itself (K ≤ 2)."""
        if self.world <= 2:
            return x
        y = np.full(self.world, np.nan)
        for r in np.flatnonzero(ok):
            others = x[ok & (np.arange(self.world) != r)]
            if len(others):
                y[r] = x[r] - float(np.median(others))
        return y

    def _relative(self, x: np.ndarray, ok: np.ndarray) -> np.ndarray:
        z = np.full(self.world, np.nan)
        for r in np.flatnonzero(ok):
            others = x[ok & (np.arange(self.world) != r)]
            if len(others) >= 2:
                z[r] = robust_z(float(x[r]), others, self.min_scale)
        return z

    def _individual(self, name: str, y: np.ndarray) -> np.ndarray:
        z = np.full(self.world, np.nan)
        for r in range(self.world):
            hist = self.history[name][r]
            if len(hist) == self.window and math.isfinite(y[r]):
                z[r] = robust_z(float(y[r]), np.fromiter(hist, float, len(hist)), self.min_scale)
        return z

    def _fired(self, name: str, score: str, z: np.ndarray, n: int) -> list[Flag]:
        """The flags of one signal and score; n reference values behind every z."""
        side, out = SIDES[name], []
        for r in np.flatnonzero(~np.isnan(z)):
            t = robust_threshold(self.alpha, n, side)
            v = float(z[r])
            if (v > t) or (side == "both" and v < -t):
                out.append(Flag(int(r), name, score, v, t))
        return out


@dataclass
class _Scored:
    """One scoring pass: z per signal and rank, the centred values, the flags."""

    relative: dict[str, tuple[float, ...]]
    individual: dict[str, tuple[float, ...]]
    centred: dict[str, np.ndarray]
    flags: list[Flag]

    @classmethod
    def empty(cls, det: Detector) -> _Scored:
        nan = tuple([math.nan] * det.world)
        return cls({n: nan for n in det.signals}, {n: nan for n in det.signals}, {}, [])


def _check_int(value: object, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise UsageError(f"must be an int >= {low}", field=name, value=value)
    return int(value)


def _check_subset(values: Sequence[str], allowed: tuple[str, ...], name: str) -> tuple[str, ...]:
    vals = (values,) if isinstance(values, str) else tuple(values)
    if not vals or any(v not in allowed for v in vals) or len(set(vals)) != len(vals):
        raise UsageError(f"use a non-empty subset of {', '.join(allowed)}", field=name, value=values)
    return vals
