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
Last, warm and cold (R = 1, K = 2, 4, 8, the same payloads): the median ``decide`` alone, as above
(its code and data stay in the CPU's caches from one call to the next), after one ``gpt-nano``
training step in the same thread before each call (forward, backward, Adam: what a monitor hook
follows in training), and after writing 16 MB of other memory before each call; and the ratios.

Usage: python benchmarks/monitor_step_cost.py [--steps 300] [--warmup 1100] [--cold-only]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import numpy as np
import torch

import naig.monitor.detectors as detectors
from naig.monitor import Monitor
from naig.monitor.signals import rank_signals, unpack
from naig.simulate.model import GPT, get_preset, lm_loss

__all__ = ["main"]

RANKS = (2, 4, 8, 64, 256, 1024)


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=1100)
    p.add_argument("--cold-only", action="store_true", help="only the warm-and-cold part")
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


def _decide_times(k: int, blocks: int, args: argparse.Namespace, seed: int,
                  between: Callable[[], None] | None = None) -> tuple[list[float], np.ndarray]:
    """µs of CPU of each of ``args.steps`` calls of ``Monitor.decide`` after ``args.warmup`` calls,
    and the last payloads; ``between`` (untimed) runs before each timed call."""
    rng = np.random.default_rng(seed)
    monitor = Monitor(blocks=blocks)
    batches = [_payloads(rng, k, blocks) for _ in range(args.warmup + args.steps)]
    it = iter(batches)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(args.warmup):
            monitor.decide(next(it))
        if between is None:
            return _time(lambda m=monitor, i=it: m.decide(next(i)), args.steps), batches[-1]
        out = []
        for _ in range(args.steps):
            between()
            out += _time(lambda m=monitor, i=it: m.decide(next(i)), 1)
        return out, batches[-1]


def _training_step() -> Callable[[], None]:
    """One ``gpt-nano`` step (batch 8, Adam 1e-3) per call: forward, backward, optimizer step."""
    gen = torch.Generator().manual_seed(0)
    cfg = get_preset("gpt-nano")
    model = GPT(cfg, generator=gen)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> None:
        x = torch.randint(0, cfg.vocab, (8, cfg.context + 1), generator=gen)
        opt.zero_grad()
        lm_loss(model(x[:, :-1]), x[:, 1:]).backward()
        opt.step()
    return step


def _touch(megabytes: int) -> Callable[[], None]:
    """Write ``megabytes`` MB of memory per call (nothing the monitor reads)."""
    buf = np.zeros(megabytes * 2**20 // 8)

    def touch() -> None:
        buf.__iadd__(1.0)
    return touch


def _warm_and_cold(args: argparse.Namespace) -> None:
    print(f"\n{'K':>4} {'decide us alone':>16} {'after a step':>13} {'ratio':>6} {'after 16 MB':>12} "
          f"{'ratio':>6}  (R = 1, medians, the same payloads)")
    step, touch = _training_step(), _touch(16)
    for k in (2, 4, 8):
        alone = statistics.median(_decide_times(k, 1, args, seed=k)[0])
        stepped = statistics.median(_decide_times(k, 1, args, seed=k, between=step)[0])
        touched = statistics.median(_decide_times(k, 1, args, seed=k, between=touch)[0])
        print(f"{k:4d} {alone:16.1f} {stepped:13.1f} {stepped / alone:6.2f} {touched:12.1f} "
              f"{touched / alone:6.2f}")


def _every_32(recorded: int) -> int:
    """The refit cadence before 2026-12-06: 8 clean steps, then 32 whatever the record."""
    return detectors.RECALIBRATE * (1 if recorded < detectors.TAIL_STEPS // 16 else 4)


def main(argv: list[str]) -> None:
    args = _args(argv)
    torch.set_num_threads(1)
    if args.cold_only:
        _warm_and_cold(args)
        return
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
    _warm_and_cold(args)


if __name__ == "__main__":
    main(sys.argv[1:])
