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

__all__ = ["RunResult", "StrategySummary", "SimulateResult", "pi_stats", "summarise"]


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

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of everything (config included; NaN/Inf still need → null)."""
        return asdict(self)

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


def _summarise_one(runs: list[RunResult], name: str, hogwild: float | None) -> StrategySummary:
    mine = [r for r in runs if r.strategy == name]
    losses = [r.final_val_loss for r in mine]
    finite = all(math.isfinite(v) for v in losses)
    mean = statistics.fmean(losses) if finite else math.nan
    std = None if len(losses) < 2 else statistics.stdev(losses) if finite else math.nan

    def avg(attr: str) -> float:
        return float(_nanmean([getattr(r, attr) for r in mine]))

    curve = tuple((s, statistics.fmean(r.curve[i][1] for r in mine))
                  for i, (s, _) in enumerate(mine[0].curve))
    change = (100.0 * (mean - hogwild) / hogwild
              if hogwild is not None and math.isfinite(hogwild) and finite else None)
    return StrategySummary(
        name, mean, std, change,
        tuple(_nanmean([r.mean_pi for r in mine], axis=0).tolist()), avg("frozen_fraction"),
        avg("k_eff"), avg("entropy_first"), avg("entropy_last"), avg("ms_per_step"), curve,
        tuple(r.diverged_at for r in mine))


def summarise(runs: list[RunResult], names: tuple[str, ...]) -> tuple[StrategySummary, ...]:
    """One ``StrategySummary`` per strategy name, in ``names`` order."""
    hog = [r.final_val_loss for r in runs if r.strategy == "hogwild"]
    ref = statistics.fmean(hog) if hog else None
    return tuple(_summarise_one(runs, n, ref) for n in names)
