"""Results of a simulation: one ``RunResult`` per (strategy, seed), summaries over seeds.

Example:
    >>> import numpy as np
    >>> stats = pi_stats(np.array([[0.5, 0.5], [1.0, 0.0]]))
    >>> stats["mean_pi"], stats["frozen_fraction"], stats["k_eff"]
    ((0.75, 0.25), 0.25, 1.5)
"""

from __future__ import annotations

import math
import statistics
import warnings
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from naig.gibbs import FROZEN_FACTOR, effective_workers, normalized_entropy

if TYPE_CHECKING:
    from naig.simulate.config import SimulateConfig

__all__ = ["SCHEMA_VERSION", "RunResult", "StrategySummary", "SimulateResult", "pi_stats", "summarise",
           "choose_lr", "time_to_loss"]

SCHEMA_VERSION = 2  # of the simulate JSON document


@dataclass(frozen=True)
class RunResult:
    """One (strategy, seed) run."""

    strategy: str
    seed: int
    final_val_loss: float  # validation loss (nats/byte) after the last step; NaN if diverged
    curve: tuple[tuple[int, float], ...]  # (steps done, val loss), from (0, untrained); NaN after
    #                                       divergence
    mean_pi: tuple[float, ...]  # mean over steps of each worker's coefficient π_k
    frozen_fraction: float  # fraction of (step, worker) with normalised π_k < 0.01/K
    k_eff: float  # mean over steps of 1/Σπ̃_k² (π̃ = π normalised to sum 1)
    entropy_first: float  # mean normalised entropy of π̃ over the first 10% of steps
    entropy_last: float  # same over the last 10% of steps
    ms_per_step: float  # wall time per server step (K gradients + combine + update), ms
    diverged_at: int | None = None  # step t at which gradients/parameters became non-finite
    lr: float = math.nan  # the optimizer's learning rate of this run
    final_test_loss: float | None = None  # test loss at the end (learning-rate tuning only)
    curve_seconds: tuple[float, ...] = ()  # arrival mode: simulated seconds of each curve point
    updates: int = 0  # server updates applied
    staleness: dict[str, Any] | None = None  # arrival mode: measured τ (mean, per_worker, p_zero, max)
    # --- distributed engine (naig.distributed, docs/design.md §12) ---
    distributed: dict[str, Any] | None = None  # arrivals, lost workers, non-finite pushes, bytes, server ms
    # --- end distributed engine ---


@dataclass(frozen=True)
class StrategySummary:
    """A strategy's numbers over seeds (means; loss also with its standard deviation).

    The loss mean, std and change are NaN (None for the change) when any seed diverged:
    a mean over the surviving seeds alone would flatter the strategy. The π statistics
    and ms/step average over the steps that ran.
    """

    strategy: str
    val_loss_mean: float
    val_loss_std: float | None  # sample std over seeds; None for one seed (undefined)
    change_vs_hogwild_pct: float | None  # 100 (L − L_hogwild) / L_hogwild; None without hogwild
    mean_pi: tuple[float, ...]
    frozen_fraction: float
    k_eff: float
    entropy_first: float
    entropy_last: float
    ms_per_step: float
    curve: tuple[tuple[int, float], ...]  # validation curve, mean over seeds
    diverged_at: tuple[int | None, ...] = ()  # per seed: step of divergence, None if it ran
    lr: float = math.nan  # the learning rate reported (chosen on validation when tuned)
    lr_val_loss: dict[str, float] = field(default_factory=dict)  # tuning: lr → mean val loss
    test_loss_mean: float | None = None  # tuning: mean test loss at the chosen lr
    test_loss_std: float | None = None  # tuning: its sample std over seeds
    curve_seconds: tuple[float, ...] = ()  # arrival mode: mean simulated seconds of each curve point
    time_to_loss: float | None = None  # arrival mode: median over seeds of the simulated seconds
    #                                    to reach sync's final loss of the seed (None: not reached)
    reached: int | None = None  # arrival mode: seeds that reached sync's final loss
    staleness_mean: float | None = None  # arrival mode: mean measured τ over the strategy's runs


@dataclass(frozen=True)
class SimulateResult:
    """All runs of a simulation and their per-strategy summaries."""

    config: SimulateConfig
    device: str  # device actually used
    n_params: int  # scalar parameters n
    untrained_val_loss: float  # validation loss at θ_0, mean over seeds (≈ ln 256)
    routing_bytes: int  # per worker per step: 14 × 4
    gradient_bytes: int  # per worker per step: n × element size
    runs: tuple[RunResult, ...]
    summaries: tuple[StrategySummary, ...]
    saved_files: tuple[str, ...] = field(default=())
    environment: dict[str, Any] = field(default_factory=dict)  # versions, threads, device
    interrupted: bool = False  # Ctrl-C: only the runs that finished are here
    # --- distributed engine (naig.distributed, docs/design.md §12) ---
    distributed: dict[str, Any] | None = None  # processes, launcher, lost workers, determinism note
    # --- end distributed engine ---

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of everything (config included; NaN/Inf still need → null)."""
        return {"schema_version": SCHEMA_VERSION, **asdict(self)}

    @property
    def diverged(self) -> tuple[RunResult, ...]:
        """The runs that diverged (non-finite gradients or parameters)."""
        return tuple(r for r in self.runs if r.diverged_at is not None)


def pi_stats(pis: np.ndarray) -> dict[str, Any]:
    """Mean π, frozen fraction, K_eff and annealing entropies of a (steps, K) history.

    Args:
        pis: (steps, K) coefficients, one row per step that ran; NaN where a worker had
            not joined (its coefficient is undefined, not zero). Rows of all NaN (steps
            without an update) are left out.

    Returns:
        The ``RunResult`` fields ``mean_pi`` (per worker, over the steps it was active),
        ``frozen_fraction`` (over active (step, worker) pairs, π̃ < 0.01/K_t),
        ``k_eff``, ``entropy_first`` and ``entropy_last`` (entropy normalised by ln K_t,
        over the first and last 10% of the updates); all NaN when no update ran.
    """
    active = ~np.isnan(pis)
    pis = pis[active.any(-1)]  # (U, K): the steps that made an update
    active = ~np.isnan(pis)
    if len(pis) == 0:  # diverged at step 0, or no worker ever joined
        nan = math.nan
        return dict(mean_pi=(nan,) * pis.shape[1], frozen_fraction=nan, k_eff=nan,
                    entropy_first=nan, entropy_last=nan)
    norm = np.where(active, pis, 0.0)
    norm = norm / norm.sum(-1, keepdims=True)  # π̃, inactive workers 0
    k_t = active.sum(-1)  # (U,) active workers per update
    frozen = (norm < FROZEN_FACTOR / k_t[:, None]) & active
    w = max(1, len(pis) // 10)
    ent = np.array([normalized_entropy(row[a]) for row, a in zip(norm, active, strict=True)])
    return dict(mean_pi=tuple(_nanmean(pis, axis=0).tolist()),
                frozen_fraction=float(frozen.sum() / active.sum()),
                k_eff=float(np.mean([effective_workers(p) for p in norm])),
                entropy_first=float(ent[:w].mean()), entropy_last=float(ent[-w:].mean()))


def _nanmean(values: Any, axis: int | None = None) -> Any:
    """Mean ignoring NaN (runs that diverged before a statistic existed); NaN if none."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(np.asarray(values, dtype=np.float64), axis=axis)


def _loss_stats(losses: list[float]) -> tuple[float, float | None]:
    """Mean and sample std; NaN when any is NaN (a diverged seed); std None for one value."""
    finite = all(math.isfinite(v) for v in losses)
    mean = statistics.fmean(losses) if finite else math.nan
    std = None if len(losses) < 2 else statistics.stdev(losses) if finite else math.nan
    return mean, std


def time_to_loss(run: RunResult, target: float) -> float:
    """Simulated seconds until a run's validation curve first reaches ``target``.

    Linear interpolation between evaluation points; ``inf`` when it never does.

    Example:
        >>> r = RunResult("x", 0, 2.0, ((0, 5.0), (10, 3.0), (20, 2.0)), (), 0.0, 1.0, 0.0, 0.0, 1.0,
        ...               curve_seconds=(0.0, 4.0, 8.0))
        >>> time_to_loss(r, 2.5), time_to_loss(r, 1.0)
        (6.0, inf)
    """
    points = list(zip(run.curve_seconds, (loss for _, loss in run.curve), strict=False))
    for (t0, l0), (t1, l1) in zip(points, points[1:], strict=False):
        if math.isfinite(l1) and l1 <= target:
            return t1 if not (math.isfinite(l0) and l0 > l1) else t0 + (t1 - t0) * (l0 - target) / (l0 - l1)
    return math.inf


def _time_stats(mine: list[RunResult], runs: list[RunResult], sync_lr: float | None) -> dict[str, Any]:
    """Median time to sync's final loss of the same seed, and how many seeds got there."""
    if not mine or not mine[0].curve_seconds or sync_lr is None:
        return {}
    target = {r.seed: r.final_val_loss for r in runs if r.strategy == "sync" and r.lr == sync_lr}
    times = [time_to_loss(r, target[r.seed]) for r in mine if r.seed in target]
    if not times:
        return {}
    median = statistics.median(times)
    points = min(len(r.curve_seconds) for r in mine)  # a diverged run stops early
    seconds = tuple(statistics.fmean(r.curve_seconds[i] for r in mine) for i in range(points))
    tau = [r.staleness["mean"] for r in mine if r.staleness]
    return dict(curve_seconds=seconds, time_to_loss=median if math.isfinite(median) else None,
                reached=sum(math.isfinite(t) for t in times),
                staleness_mean=statistics.fmean(tau) if tau else None)


def choose_lr(runs: list[RunResult]) -> tuple[float, dict[str, float]]:
    """The learning rate with the lowest mean final validation loss over seeds.

    A diverged seed counts as +∞, so an lr that diverged on any seed loses to one that
    did not; ties go to the first lr run.

    Args:
        runs: one strategy's runs, every lr and seed.

    Returns:
        ``(lr, {repr(lr): mean validation loss})``.
    """
    by_lr: dict[float, list[float]] = {}
    for r in runs:
        by_lr.setdefault(r.lr, []).append(r.final_val_loss if math.isfinite(r.final_val_loss) else math.inf)
    means = {lr: statistics.fmean(v) for lr, v in by_lr.items()}
    best = min(means, key=lambda lr: means[lr])
    return best, {repr(lr): m for lr, m in means.items()}


def _summarise_one(runs: list[RunResult], name: str, hogwild: float | None,
                   sync_lr: float | None) -> StrategySummary:
    lr, table = choose_lr([r for r in runs if r.strategy == name])
    mine = [r for r in runs if r.strategy == name and r.lr == lr]
    mean, std = _loss_stats([r.final_val_loss for r in mine])
    tuned = len(table) > 1
    test_mean, test_std = _loss_stats([r.final_test_loss for r in mine]) if tuned else (None, None)

    def avg(attr: str) -> float:
        return float(_nanmean([getattr(r, attr) for r in mine]))

    curve = tuple((s, statistics.fmean(r.curve[i][1] for r in mine))
                  for i, (s, _) in enumerate(mine[0].curve))
    headline = test_mean if tuned else mean
    change = (100.0 * (headline - hogwild) / hogwild
              if hogwild is not None and math.isfinite(hogwild) and math.isfinite(headline) else None)
    return StrategySummary(
        name, mean, std, change,
        tuple(_nanmean([r.mean_pi for r in mine], axis=0).tolist()), avg("frozen_fraction"),
        avg("k_eff"), avg("entropy_first"), avg("entropy_last"), avg("ms_per_step"), curve,
        tuple(r.diverged_at for r in mine), lr, table if tuned else {}, test_mean, test_std,
        **_time_stats(mine, runs, sync_lr))


def summarise(runs: list[RunResult], names: tuple[str, ...]) -> tuple[StrategySummary, ...]:
    """One ``StrategySummary`` per strategy name that has runs, in ``names`` order."""
    present = [n for n in names if any(r.strategy == n for r in runs)]
    sync_lr = choose_lr([r for r in runs if r.strategy == "sync"])[0] if "sync" in present else None
    hog = _summarise_one(runs, "hogwild", None, sync_lr) if "hogwild" in present else None
    ref = None if hog is None else hog.val_loss_mean if hog.test_loss_mean is None else hog.test_loss_mean
    return tuple(_summarise_one(runs, n, ref, sync_lr) for n in present)
