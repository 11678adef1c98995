"""The monitor's fixed per-step cost alone: signals and detectors from the gathered payloads.

docs/monitor.md ("Overhead and memory"). What every rank computes once per step after the
all-gather, whatever the model size: ``rank_signals`` on the (K, 14·R + 2) payloads, and
``Monitor.decide`` (unpack, signals, the detectors' update and decision), for K = 2, 4, 8, 64, 256, 1024 ranks
and R = 1, 4. Payloads are drawn as K noisy copies of one gradient's sketch (no rank flagged).
Each configuration first runs ``--warmup`` steps (past the detectors' 32-step window and their
one-off calibration), then ``--steps`` timed steps; printed: the median µs per step (this thread's
CPU time, ``time.thread_time``, so that other load on a shared machine does not count), the 90th
percentile, and for ``decide`` the mean, which carries the detectors' periodic refits of their
thresholds (every 8 clean steps, every 32 once 64 steps are recorded; at K ≥ 3 each refit runs the
``drift`` threshold's bootstrap, ~11 ms): what a training step pays on average.

Usage: python benchmarks/monitor_step_cost.py [--steps 300] [--warmup 80]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings

import numpy as np
import torch

from naig.monitor import Monitor
from naig.monitor.signals import rank_signals, unpack

__all__ = ["main"]

RANKS = (2, 4, 8, 64, 256, 1024)


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=80)
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


def main(argv: list[str]) -> None:
    args = _args(argv)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    print(f"{'K':>3} {'R':>2} {'signals us':>11} {'p90':>7} {'decide us':>10} {'p90':>7} {'mean':>7}")
    for k in RANKS:
        for blocks in (1, 4):
            monitor = Monitor(blocks=blocks)
            batches = [_payloads(rng, k, blocks) for _ in range(args.warmup + args.steps)]
            it = iter(batches)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for _ in range(args.warmup):
                    monitor.decide(next(it))
                dec = _time(lambda m=monitor, i=it: m.decide(next(i)), args.steps)
            rows = batches[-1]
            sig = _time(lambda rows=rows: rank_signals(*unpack(rows)), args.steps)
            print(f"{k:3d} {blocks:2d} {statistics.median(sig):11.1f} {np.percentile(sig, 90):7.1f} "
                  f"{statistics.median(dec):10.1f} {np.percentile(dec, 90):7.1f} {statistics.mean(dec):7.1f}")


if __name__ == "__main__":
    main(sys.argv[1:])
