"""From recorded runs to the figures of ``naig detect --protocol persistent`` (``naig.detect.sequential``).

**Detection** (fault runs, per method and fault kind, over the seeds of a role): for a fault
that begins at step s on rank r, the delay is the first step ≥ s at which the method names r,
minus s; P(N) is the fraction of seeds with a delay ≤ N (N = 0, 1, ``horizon``); the median
delay is over the seeds named within the horizon; *wrong* is the mean number of (step, rank)
namings of another rank in steps s..s + horizon per run.

**False alarms** (clean replays): a step is a false alarm when the method names any rank; the
rate is over the steps after the warm-up (``DEFAULT_WARMUP`` steps, in which the monitor tests
only non-finite values; the baselines' are skipped alike), with its Clopper–Pearson 95%
interval, per 1000 steps, and the mean run length between alarms (steps / alarms).

**The default** among ``CANDIDATES`` is chosen on the validation seeds: among the candidates
whose validation false-alarm rate (K = ``ranks``, batch ``batch_size``) is at most 2α, the one
with the highest mean over fault kinds of P(``horizon``) (when none is within 2α: the one with the
fewest false alarms); among those tied, the one with the fewest false alarms on every validation
pool (the mean per 1000 over their batch sizes and ``fa_ranks``, measured for the tied candidates
only), then the lower mean median delay; the test seeds never enter the choice. (Until 2026-12-05
a tie went to the lower delay straight away, and the batch-8 pool at K = ``ranks`` was the only one
the choice saw: with ``turn`` in ``all``, ``all/δ1`` tied on detection and won on delay with 2–5×
the other candidates' false alarms at K = 8 and at batch 64.)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np

from naig.detect import baselines
from naig.detect.calibrate import clopper_pearson
from naig.detect.sequential import Record, SequentialConfig, subset
from naig.monitor.detectors import DEFAULT_DELTA, DEFAULT_SIGNALS, DEFAULT_WARMUP, SIGNALS, null_draws_kept
from naig.monitor.observe import Monitor

__all__ = ["CANDIDATES", "METHODS", "method_names", "detection", "false_alarms", "replays", "summarise",
           "choose", "replay_seed", "CODE_DEFAULT"]

CANDIDATES: dict[str, dict] = {
    "nde/δ1": {"signals": ("norm", "distance", "energy"), "delta": 1.0},
    "nde/δ0.5": {"signals": ("norm", "distance", "energy"), "delta": 0.5},
    "ndep/δ1": {"signals": ("norm", "distance", "energy", "persistence"), "delta": 1.0},
    "ndep/δ0.5": {"signals": ("norm", "distance", "energy", "persistence"), "delta": 0.5},
    "ndew/δ1": {"signals": ("norm", "distance", "energy", "drift"), "delta": 1.0},
    "ndepw/δ1": {"signals": ("norm", "distance", "energy", "persistence", "drift"), "delta": 1.0},
    "ndepwt/δ1": {"signals": ("norm", "distance", "energy", "persistence", "drift", "turn"), "delta": 1.0},
    "all/δ1": {"signals": SIGNALS, "delta": 1.0},
    "all/δ0.5": {"signals": SIGNALS, "delta": 0.5},
}
"""The monitor settings the validation seeds choose among (signals, CUSUM reference δ)."""
CODE_DEFAULT = next(name for name, c in CANDIDATES.items()
                    if tuple(c["signals"]) == DEFAULT_SIGNALS and c["delta"] == DEFAULT_DELTA)
"""The candidate ``Monitor()``'s own defaults are (``DEFAULT_SIGNALS``, ``DEFAULT_DELTA``): ``ndepwt/δ1``."""
METHODS = ("monitor", "exact", *baselines.BASELINES)


def monitor_names(record: Record, *, exact: bool, false_alarm: float, **settings: object
                  ) -> list[tuple[int, ...]]:
    """The ranks ``Monitor.decide`` names at each step of a record (its default settings but these)."""
    mon = Monitor(false_alarm=false_alarm, **settings)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for t in range(len(record.payload)):
            kw = {"dots": record.dots[t], "sq_dists": record.sq_dists[t]} if exact else {}
            if record.weights is not None and mon.weights_due():  # the replica check's steps
                kw["weights"] = record.weights[t]
            out.append(mon.decide(record.payload[t], **kw).ranks)
    return out


def method_names(method: str, record: Record, cfg: SequentialConfig, thresholds: dict[str, float],
                 settings: dict, false_alarm: float | None = None) -> list[tuple[int, ...]]:
    """The ranks a method names at each step (``monitor``/``exact``: with ``settings``)."""
    fa = cfg.false_alarm if false_alarm is None else false_alarm
    if method in ("monitor", "exact"):
        return monitor_names(record, exact=method == "exact", false_alarm=fa, **settings)
    if method == "nan-check":
        return baselines.nan_check(record.payload)
    if method == "megatron":
        return baselines.megatron(record.payload)
    if method == "norm-z":
        return baselines.norm_z(record.payload, thresholds["norm-z"])
    return baselines.norm_cusum(record.payload, thresholds["norm-cusum"])


def detection(named: list[tuple[int, ...]], record: Record, horizon: int) -> dict:
    """Delay (None if not named within ``horizon``), wrong namings from the onset, alarms before it."""
    s = record.onset
    delay = next((t + 1 - s for t in range(s - 1, min(len(named), s + horizon))
                  if record.bad in named[t]), None)
    wrong = sum(1 for t in range(s - 1, min(len(named), s + horizon)) for r in named[t] if r != record.bad)
    before = sum(1 for t in range(DEFAULT_WARMUP, s - 1) if named[t])
    return {"delay": delay, "wrong": wrong, "before": before}


def summarise(results: list[dict], horizon: int) -> dict:
    """P(0), P(1), P(horizon), median delay, mean wrong namings over runs (one fault kind, one method)."""
    n = len(results)
    delays = [r["delay"] for r in results if r["delay"] is not None]
    p = {f"p{m}": sum(d <= m for d in delays) / n for m in sorted({0, 1, horizon})}
    return {**p, "median_delay": float(np.median(delays)) if delays else None,
            "wrong": float(np.mean([r["wrong"] for r in results])),
            "before": int(sum(r["before"] for r in results)),
            "runs": n, "curve": [sum(d <= m for d in delays) / n for m in range(horizon + 1)]}


def replays(payload: np.ndarray, gram: np.ndarray, k: int, count: int, seed: int,
            weights: np.ndarray | None = None) -> list[Record]:
    """``count`` clean runs of K ranks from a pool: distinct fixed subsets of its M ranks (seeded),
    with the replica-check payloads of θ (``weights`` (T, 16)) when given."""
    m = payload.shape[1]
    rng = np.random.default_rng(seed)
    seen: set[tuple[int, ...]] = set()
    out = []
    limit = math.comb(m, k)
    while len(out) < min(count, limit):
        ranks = tuple(sorted(rng.choice(m, size=k, replace=False).tolist()))
        if ranks in seen:
            continue
        seen.add(ranks)
        out.append(subset(payload, gram, np.array(rng.permutation(ranks)), weights))
    return out


def replay_seed(k: int, pool_seed: int) -> int:
    """The seed of ``replays`` for the K-rank subsets of a test pool (``pool_seed``: its PoolSpec.seed)."""
    return 13 + 100 * k + pool_seed


def false_alarms(named_runs: list[list[tuple[int, ...]]], recorded: int) -> dict:
    """Flagged steps after the warm-up over clean runs: rate, Clopper–Pearson interval, per 1000, run
    length."""
    flagged = sum(1 for run in named_runs for step in run[DEFAULT_WARMUP:] if step)
    total = sum(max(0, len(run) - DEFAULT_WARMUP) for run in named_runs)
    rate, low, high = clopper_pearson(flagged, total)
    return {"flagged": flagged, "steps": total, "recorded_steps": recorded, "runs": len(named_runs),
            "rate": rate, "low": low, "high": high, "per_1000": 1000 * rate,
            "per_1000_low": 1000 * low, "per_1000_high": 1000 * high,
            "run_length": total / flagged if flagged else None}


def choose(validation: dict[str, dict], alpha: float,
           everywhere: Callable[[str], float] | None = None) -> str:
    """The default among the candidates from their validation figures (see the module).

    Args:
        validation: candidate → its ``run_all`` validation entry.
        alpha: the false-alarm rate asked for.
        everywhere: candidate → its mean false alarms per 1000 over every validation pool and K,
            called for the candidates tied on detection only (None: ties go to the delay).
    """
    def first(name: str) -> tuple:
        v = validation[name]
        within = v["false_alarm"]["rate"] <= 2 * alpha
        # within the bound: the most detection; else (none within): the fewest false alarms
        return (within, v["mean_p"] if within else -v["false_alarm"]["rate"])

    def delay(name: str) -> float:
        delays = [d for d in validation[name]["median_delays"] if d is not None]
        return -float(np.mean(delays)) if delays else -1e9

    best = max(first(n) for n in CANDIDATES)
    tied = [n for n in CANDIDATES if first(n) == best]
    if len(tied) > 1 and everywhere is not None:
        fa = {n: everywhere(n) for n in tied}
        tied = [n for n in tied if fa[n] == min(fa.values())]
    return max(tied, key=delay)


@null_draws_kept()  # the candidates and false-alarm rates below each walk the pool sizes again
def run_all(cfg: SequentialConfig, faults: dict[str, list[Record]], pools: dict[tuple, tuple],
            tick: Callable[[str], None] | None = None) -> dict:
    """Every figure of the report from the recorded runs (see the module and ``naig.detect.sequential``).

    Args:
        faults: role → its fault-run records.
        pools: (batch, role, seed) → (payload, gram, weights) of the clean pools.
        tick: called with a short label as each part starts (progress).
    """
    say = tick or (lambda _: None)
    k, alpha = cfg.ranks, cfg.false_alarm
    say("calibrating the baselines")
    cal = [r for (b, role, s), (p, g, w) in pools.items() if role == "calibration" and b == cfg.batch_size
           for r in replays(p, g, k, cfg.replays, 7 + s, w)]
    cal_payload = np.stack([r.payload for r in cal])
    thresholds = {"norm-z": baselines.calibrate_z(cal_payload, alpha),
                  "norm-cusum": baselines.calibrate_cusum(cal_payload, alpha)}
    val_pool = [r for (b, role, s), (p, g, w) in pools.items() if role == "validation" and b == cfg.batch_size
                for r in replays(p, g, k, cfg.replays, 11 + s, w)]
    validation = {}
    for name, settings in CANDIDATES.items():
        say(f"validation: {name}")
        kinds = {kind: summarise([detection(method_names("monitor", r, cfg, thresholds, settings), r,
                                            cfg.horizon) for r in faults["validation"] if r.kind == kind],
                                 cfg.horizon)
                 for kind in cfg.faults}
        fa = false_alarms([method_names("monitor", r, cfg, thresholds, settings) for r in val_pool],
                          sum(len(p) for (b, role, _), (p, *_) in pools.items()
                              if role == "validation" and b == cfg.batch_size))
        validation[name] = {"kinds": kinds, "false_alarm": fa,
                            "mean_p": float(np.mean([v[f"p{cfg.horizon}"] for v in kinds.values()])),
                            "median_delays": [v["median_delay"] for v in kinds.values()]}
    seen_by: dict[str, list[dict]] = {}

    def everywhere(name: str) -> float:
        seen_by[name] = _pool_false_alarms(cfg, pools, "validation", thresholds, CANDIDATES[name], say)
        validation[name]["false_alarms_everywhere"] = seen_by[name]
        return float(np.mean([r["per_1000"] for r in seen_by[name]]))

    default = choose(validation, alpha, everywhere) if faults["validation"] else CODE_DEFAULT
    settings = CANDIDATES[default]
    test = {}
    for method in METHODS:
        say(f"test: {method}")
        test[method] = {kind: summarise([detection(method_names(method, r, cfg, thresholds, settings), r,
                                                   cfg.horizon) for r in faults["test"] if r.kind == kind],
                                        cfg.horizon) for kind in cfg.faults}
    seen = seen_by.get(default) or _pool_false_alarms(cfg, pools, "validation", thresholds, settings, say)
    rates = _test_false_alarms(cfg, pools, thresholds, settings, say)
    return {"config": cfg.to_dict(), "thresholds": thresholds, "validation": validation, "default": default,
            "validation_false_alarms": seen,
            "default_settings": {k2: list(v) if isinstance(v, tuple) else v for k2, v in settings.items()},
            "test": test, "false_alarms": rates,
            "skipped": {kind: int(sum(r.skipped for r in faults["test"] if r.kind == kind))
                        for kind in cfg.faults}}


def _pool_false_alarms(cfg: SequentialConfig, pools: dict[tuple, tuple], role: str,
                       thresholds: dict[str, float], settings: dict, say: Callable[[str], None]
                       ) -> list[dict]:
    """The chosen default's false alarms on a role's pools, per batch size and K, at ``false_alarm``
    (validation: what the choice could see, at every batch size, before the test pools are read)."""
    out = []
    for b in sorted({b for (b, r, _) in pools if r == role}):
        mine = [(p, g, s, w) for (bb, r, s), (p, g, w) in pools.items() if r == role and bb == b]
        for k in cfg.fa_ranks:
            say(f"{role} false alarms: batch {b}, K={k}")
            runs = [r for p, g, s, w in mine for r in replays(p, g, k, cfg.replays, 11 + s, w)]
            named = [method_names("monitor", r, cfg, thresholds, settings) for r in runs]
            row = false_alarms(named, sum(len(p) for p, *_ in mine))
            out.append({"batch": b, "ranks": k, "alpha": cfg.false_alarm, **row})
    return out


def _test_false_alarms(cfg: SequentialConfig, pools: dict[tuple, tuple], thresholds: dict[str, float],
                       settings: dict, say: Callable[[str], None]) -> list[dict]:
    """False alarms on the test pools: the default monitor at every (batch, K, α); every method at the
    main one."""
    out = []
    batches = sorted({b for (b, role, _) in pools if role == "test"})
    for b in batches:
        mine = [(p, g, s, w) for (bb, role, s), (p, g, w) in pools.items() if role == "test" and bb == b]
        recorded = sum(len(p) for p, *_ in mine)
        for k in cfg.fa_ranks:
            runs = [r for p, g, s, w in mine
                    for r in replays(p, g, k, cfg.replays, replay_seed(k, s), w)]
            main = b == cfg.batch_size and k == cfg.ranks
            for rate in cfg.fa_rates:
                methods = METHODS if main and rate == cfg.false_alarm else ("monitor",)
                for method in methods:
                    say(f"false alarms: batch {b}, K={k}, α={rate:g}, {method}")
                    named = [method_names(method, r, cfg, thresholds, settings, rate) for r in runs]
                    row = false_alarms(named, recorded)
                    met = row["low"] <= 2 * rate and row["high"] >= rate / 2
                    established = row["low"] >= rate / 2 and row["high"] <= 2 * rate
                    out.append({"batch": b, "ranks": k, "alpha": rate, "method": method, **row,
                                "in_range": rate / 2 <= row["rate"] <= 2 * rate, "consistent": met,
                                "established": established})
    return out
