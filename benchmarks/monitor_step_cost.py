"""The monitor's fixed per-step cost alone: signals and detectors from the gathered payloads.

docs/monitor.md ("Overhead and memory"). What every rank computes once per step after the
all-gather, whatever the model size: ``rank_signals`` on the (K, 14·R + 2) payloads, and
``Monitor.decide`` (unpack, signals, the detectors' update and decision), for K = 2, 4, 8, 64, 256, 1024 ranks
and R = 1, 4. Payloads are drawn as K noisy copies of one gradient's sketch (no rank flagged).
Each configuration first runs ``--warmup`` steps (past the detectors' 32-step window, their
one-off calibration and, by default, a full tail record of 1024 steps: the steady state of a long
run), then ``--steps`` timed steps; printed: the median µs per step (this thread's CPU time,
``time.thread_time``, so that other load on a shared machine does not count), the 90th
percentile, and for ``decide`` the mean, which carries the detectors' periodic refits of their
thresholds (``naig.monitor.detectors.refit_every``: every 8 clean steps, 32 once 64 steps are
recorded, 128 once the record is full; at K ≥ 3 each refit runs the ``drift`` threshold's
bootstrap, ~11 ms): what a training step pays on average. Then, side by side for R = 1 at
K = 4, 8, 64: the mean with a refit every 32 clean steps whatever the record (the cadence before
2026-12-06) and the ratio of the two, over max(``--steps``, 1024) steps (8 refits at 128).

Usage: python benchmarks/monitor_step_cost.py [--steps 300] [--warmup 1100]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings

import numpy as np
import torch

import naig.monitor.detectors as detectors
from naig.monitor import Monitor
from naig.monitor.signals import rank_signals, unpack

__all__ = ["main"]

RANKS = (2, 4, 8, 64, 256, 1024)


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=1100)
    return p.parse_args(argv)


def _payloads(rng: np.random.Generator, k: int, blocks: int) -> np.ndarray:
    m = 14 * blocks
    common = rng.standard_normal(m) * 3
    rows = np.empty((k, m + 2))
    rows[:, :m] = common + rng.standard_normal((k, m))
    rows[:, m] = 9 * m + rng.standard_normal(k)
    rows[:, m + 1] = 0
    return rows


def _time(fn, steps: int) -> list[float]:  # noqa: ANN001 (a step function)
    out = []
    for _ in range(steps):
        t0 = time.thread_time()
        fn()
        out.append(1e6 * (time.thread_time() - t0))
    return out


def _decide_times(k: int, blocks: int, args: argparse.Namespace, seed: int
                  ) -> tuple[list[float], np.ndarray]:
    """µs of CPU of each of ``args.steps`` calls of ``Monitor.decide`` after ``args.warmup`` calls,
    and the last payloads."""
    rng = np.random.default_rng(seed)
    monitor = Monitor(blocks=blocks)
    batches = [_payloads(rng, k, blocks) for _ in range(args.warmup + args.steps)]
    it = iter(batches)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(args.warmup):
            monitor.decide(next(it))
        return _time(lambda m=monitor, i=it: m.decide(next(i)), args.steps), batches[-1]


def _every_32(recorded: int) -> int:
    """The refit cadence before 2026-12-06: 8 clean steps, then 32 whatever the record."""
    return detectors.RECALIBRATE * (1 if recorded < detectors.TAIL_STEPS // 16 else 4)


def main(argv: list[str]) -> None:
    args = _args(argv)
    torch.set_num_threads(1)
    print(f"{'K':>4} {'R':>2} {'signals us':>11} {'p90':>7} {'decide us':>10} {'p90':>7} {'mean':>7}")
    for k in RANKS:
        for blocks in (1, 4):
            dec, rows = _decide_times(k, blocks, args, seed=k)
            sig = _time(lambda rows=rows: rank_signals(*unpack(rows)), args.steps)
            print(f"{k:4d} {blocks:2d} {statistics.median(sig):11.1f} {np.percentile(sig, 90):7.1f} "
                  f"{statistics.median(dec):10.1f} {np.percentile(dec, 90):7.1f} {statistics.mean(dec):7.1f}")
    print(f"\n{'K':>4} {'mean us, refit every 128':>25} {'every 32':>9} {'ratio':>6}  (R = 1, same payloads)")
    current, long = detectors.refit_every, argparse.Namespace(warmup=args.warmup, steps=max(args.steps, 1024))
    for k in (4, 8, 64):
        now = statistics.mean(_decide_times(k, 1, long, seed=k)[0])
        detectors.refit_every = _every_32
        try:
            before = statistics.mean(_decide_times(k, 1, long, seed=k)[0])
        finally:
            detectors.refit_every = current
        print(f"{k:4d} {now:25.1f} {before:9.1f} {now / before:6.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
