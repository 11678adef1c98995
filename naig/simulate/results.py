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
from naig.simulate.stats import best_baseline, best_by_validation, paired, summarize, time_to_loss

if TYPE_CHECKING:
    from naig.simulate.config import SimulateConfig

__all__ = ["SCHEMA_VERSION", "RunResult", "StrategySummary",
           "SimulateResult", "pi_stats", "summarise", "choose_lr"]

SCHEMA_VERSION = 5  # of the simulate JSON document (3: RunResult.complete, not_run, one `faults`;
#                     4: `gasloc` is GASLoC's accelerated gossip, 3's gasloc is `gossip-adam`;
#                     5: `warnings`, what the CLI says on stderr, in the document too)


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
    correction: float | None = None  # mean ‖g̃ − g‖/‖g‖ of a correcting rule (dc-asgd, gap-aware)
    # Local updates (docs/design.md §13)
    curve_samples: tuple[int, ...] = ()  # sequences consumed (gradients × batch_size) at each curve point
    curve_bytes: tuple[float, ...] = ()  # mean over workers of the bytes sent by each curve point
    bytes_per_worker: tuple[float, ...] = ()  # bytes each worker sent in the whole run
    local: dict[str, Any] | None = None  # local-update runs: method, H, outer steps, busy fractions
    # Distributed engine (naig.distributed, docs/design.md §14)
    distributed: dict[str, Any] | None = None  # arrivals, lost workers, non-finite pushes, bytes, server ms
    # True: the run ended by itself, at its budget or at its divergence (``diverged_at``); False: cut short
    # from outside (workers lost, Ctrl-C) and not summarised
    complete: bool = True


@dataclass(frozen=True)
class StrategySummary:
    """A strategy's numbers over seeds (means; loss also with its standard deviation).

    The loss mean and std are NaN when any seed diverged: a mean over the surviving seeds
    alone would flatter the strategy (``loss`` then holds the median, with diverged seeds
    as +∞, and the count). The π statistics and ms/step average over the steps that ran.
    """

    strategy: str
    val_loss_mean: float  # final validation loss, mean over seeds (NaN if any diverged)
    val_loss_std: float | None  # sample std over seeds; None for one seed (undefined)
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
    loss: dict[str, Any] = field(default_factory=dict)  # the headline loss (test when tuned, else
    #                                                     validation) over seeds: n, mean, std,
    #                                                     ci95, median (diverged = +∞), diverged
    ci95: tuple[float, float] = (math.nan, math.nan)  # 95% t-interval of the headline loss
    paired_vs_hogwild: dict[str, Any] | None = None  # paired per-seed difference: diff, ci95, p_value
    paired_vs_best: dict[str, Any] | None = None  # the same against the best non-oracle baseline
    correction: float | None = None  # mean ‖g̃ − g‖/‖g‖ (dc-asgd, dc-asgd-a, gap-aware)
    # Local updates (docs/design.md §13)
    curve_samples: tuple[float, ...] = ()  # mean over seeds of the samples at each curve point
    curve_bytes: tuple[float, ...] = ()  # mean over seeds of the bytes sent per worker by each point
    bytes_per_worker: tuple[float, ...] = ()  # mean over seeds of the bytes each worker sent


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
    best_baseline: str | None = None  # the best non-oracle baseline, chosen on validation
    # Distributed engine (naig.distributed, docs/design.md §14)
    distributed: dict[str, Any] | None = None  # processes, launcher, lost workers, determinism note
    not_run: tuple[str, ...] = ()  # "rule seed S lr L" of the runs that could not start (no worker left)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of everything (config included; NaN/Inf still need → null)."""
        out = {"schema_version": SCHEMA_VERSION, **asdict(self)}
        out["config"] = self.config.to_dict()  # the tree that loads back (SimulateConfig.load)
        out["warnings"] = list(self.warnings)
        return out

    @property
    def warnings(self) -> tuple[str, ...]:
        """One-line warnings, options named as fields in backticks: rules that run degraded in this
        setting, options set that no listed rule uses (both known before training), then
        ``run_warnings``."""
        return (*self.config.warnings(), *self.run_warnings)

    @property
    def run_warnings(self) -> tuple[str, ...]:
        """One-line warnings of the runs: the ones that applied no update, and the ones that diverged."""
        idle = [f"{x.strategy} seed {x.seed}" for x in self.finished
                if x.updates == 0 and x.diverged_at is None]
        out = []
        if idle:
            out.append(f"{'; '.join(idle)} applied no update (the rule left every gradient out): the loss "
                       "shown is the untrained one")
        if self.diverged:
            which = "; ".join(f"{d.strategy} seed {d.seed} at step {d.diverged_at}" for d in self.diverged)
            out.append(f"{len(self.diverged)} of {len(self.runs)} runs diverged (non-finite gradients or "
                       f"parameters): {which}; their loss is NaN (null in JSON)")
        return tuple(out)

    @property
    def diverged(self) -> tuple[RunResult, ...]:
        """The runs that diverged (non-finite gradients or parameters)."""
        return tuple(r for r in self.runs if r.diverged_at is not None)

    @property
    def finished(self) -> tuple[RunResult, ...]:
        """The runs that spent their budget (or diverged): the ones summarised."""
        return tuple(r for r in self.runs if r.complete)

    @property
    def incomplete(self) -> tuple[RunResult, ...]:
        """The runs that stopped before the end of their budget (workers lost, Ctrl-C)."""
        return tuple(r for r in self.runs if not r.complete)


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
    with np.errstate(invalid="ignore", divide="ignore"):  # a zero-sum update (drop-stale) gives NaN
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


def _time_stats(mine: list[RunResult], sync_runs: list[RunResult]) -> dict[str, Any]:
    """Median simulated time to sync's final loss of the same seed, and how many seeds got there."""
    if not mine or not mine[0].curve_seconds or not sync_runs:
        return {}
    target = {r.seed: r.final_val_loss for r in sync_runs}
    times = [time_to_loss(r.curve_seconds, [loss for _, loss in r.curve[:len(r.curve_seconds)]],
                          target[r.seed]) for r in mine if r.seed in target]
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
    """The learning rate chosen on validation: fewest diverged seeds, then lowest mean loss.

    Args:
        runs: one strategy's runs, every lr and seed.

    Returns:
        ``(lr, {repr(lr): mean validation loss over the seeds that did not diverge})``.
    """
    by_lr: dict[float, list[float]] = {}
    for r in runs:
        by_lr.setdefault(r.lr, []).append(r.final_val_loss)
    table = {repr(lr): float(_nanmean(v)) for lr, v in by_lr.items()}
    return best_by_validation(by_lr), table


def _headline(r: RunResult, tuned: bool) -> float:
    """The loss a strategy is judged by: test with learning-rate tuning, else validation."""
    return r.final_test_loss if tuned and r.final_test_loss is not None else r.final_val_loss


def _paired(mine: list[RunResult], base: list[RunResult] | None, name: str | None,
            tuned: bool) -> dict[str, Any] | None:
    """The paired per-seed difference to a baseline over the seeds both have."""
    if not base or name is None:
        return None
    theirs = {r.seed: _headline(r, tuned) for r in base}
    seeds = [r for r in mine if r.seed in theirs]
    return paired([_headline(r, tuned) for r in seeds], [theirs[r.seed] for r in seeds], name).to_dict()


def _summarise_one(name: str, mine: list[RunResult], table: dict[str, float], picked: dict[str, list],
                   best: str | None) -> StrategySummary:
    tuned = len(table) > 1
    mean, std = _loss_stats([r.final_val_loss for r in mine])
    test_mean, test_std = _loss_stats([r.final_test_loss for r in mine]) if tuned else (None, None)
    loss = summarize([_headline(r, tuned) for r in mine])

    def avg(attr: str) -> float:
        return float(_nanmean([getattr(r, attr) for r in mine]))

    curve = tuple((s, statistics.fmean(r.curve[i][1] for r in mine))
                  for i, (s, _) in enumerate(mine[0].curve))
    corrections = [r.correction for r in mine if r.correction is not None]
    return StrategySummary(
        name, mean, std, tuple(_nanmean([r.mean_pi for r in mine], axis=0).tolist()), avg("frozen_fraction"),
        avg("k_eff"), avg("entropy_first"), avg("entropy_last"), avg("ms_per_step"), curve,
        tuple(r.diverged_at for r in mine), mine[0].lr, table if tuned else {}, test_mean, test_std,
        loss=loss.to_dict(), ci95=loss.ci95,
        paired_vs_hogwild=_paired(mine, picked.get("hogwild"), "hogwild", tuned),
        paired_vs_best=_paired(mine, picked.get(best), best, tuned),
        correction=statistics.fmean(corrections) if corrections else None,
        **{**_communication_stats(mine), **_time_stats(mine, picked.get("sync", []))})


# Local updates (docs/design.md §13)
def _communication_stats(mine: list[RunResult]) -> dict[str, Any]:
    """Means over seeds of the curves' samples, seconds and bytes, and of the bytes per worker
    (curves up to the shortest: a diverged run stops early)."""
    points = min(len(r.curve_bytes) for r in mine)

    def mean_curve(attr: str) -> tuple[float, ...]:
        if any(len(getattr(r, attr)) < points for r in mine):
            return ()
        return tuple(statistics.fmean(getattr(r, attr)[i] for r in mine) for i in range(points))

    per_worker = np.mean([r.bytes_per_worker for r in mine], axis=0) if mine[0].bytes_per_worker else ()
    return dict(curve_samples=mean_curve("curve_samples"), curve_bytes=mean_curve("curve_bytes"),
                curve_seconds=mean_curve("curve_seconds") if mine[0].curve_seconds else (),
                bytes_per_worker=tuple(float(v) for v in per_worker))


def summarise(runs: list[RunResult], names: tuple[str, ...],
              mode: str = "lockstep") -> tuple[tuple[StrategySummary, ...], str | None]:
    """One ``StrategySummary`` per strategy that has runs (in ``names`` order), and the best baseline.

    Each strategy is reported at its learning rate chosen on validation (``choose_lr``);
    the best non-oracle baseline is chosen on validation too (``stats.best_baseline``), and
    every strategy gets its paired difference to Hogwild! and to that baseline.

    Args:
        runs: every finished run.
        names: the strategies in table order.
        mode: ``"lockstep"`` or ``"arrivals"`` (which rules are oracles).
    """
    runs = [r for r in runs if r.complete]
    present = [n for n in names if any(r.strategy == n for r in runs)]
    chosen = {n: choose_lr([r for r in runs if r.strategy == n]) for n in present}
    picked = {n: sorted((r for r in runs if r.strategy == n and r.lr == chosen[n][0]), key=lambda r: r.seed)
              for n in present}
    best = best_baseline({n: [r.final_val_loss for r in picked[n]] for n in present}, mode)
    return tuple(_summarise_one(n, picked[n], chosen[n][1], picked, best) for n in present), best
