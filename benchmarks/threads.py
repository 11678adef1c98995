"""torch's CPU threads for naig's training: 1 thread vs all cores, quiet and beside a busy process.

Runs server steps of ``naig simulate``'s default workload (gpt-nano, lags 0,10,20,35, hogwild:
K worker gradients and one Adam update per step) with ``torch.set_num_threads(1)`` and with
``torch.set_num_threads(cores)``, alternating every block of steps so that the speed drift of a
shared machine hits both alike; then the same with one more process spinning on a core (a
second job, another engineer's test run). It prints the median ms per step of each and the
ratio all-cores / 1 thread. ``naig.threads.DEFAULT_THREADS`` was chosen from this.

Then numpy's BLAS threads (OpenBLAS, one per core by default; ``threadpoolctl`` sets them) for the
monitor's small matrices: the detectors' refit of their thresholds (``cusum_threshold_sample`` on
4,096 pooled values, 100-state Brook-Evans chains; ``drift_threshold`` on 14-dim drifts) at 1
thread and at every core, and ``Monitor.decide`` at K = 4 as shipped (which runs on one BLAS thread
whatever the count outside, ``naig.threads.one_blas_thread``), quiet and beside a busy process.

Usage: python benchmarks/threads.py [--steps 40] [--rounds 5] [--part torch|blas|both]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from naig.monitor import Monitor
from naig.monitor.detectors import DRIFT_LAMBDA, cusum_threshold_sample, drift_threshold
from naig.simulate import SimulateConfig, Workload
from naig.simulate.engines import start

__all__ = ["main"]

SPIN = "import time\nend = time.time() + 600\nwhile time.time() < end: pass\n"
CONDITIONS = (("as the machine is", False), ("+ one busy process", True))


@contextmanager
def _beside(busy: bool) -> Iterator[None]:
    """Run the block beside one process spinning on a core (``busy``), or as the machine is."""
    spin = subprocess.Popen([sys.executable, "-c", SPIN]) if busy else None
    try:
        yield
    finally:
        if spin is not None:
            spin.kill()
            spin.wait()


def _block_ms(run: object, threads: int, steps: int) -> list[float]:
    """ms of each of ``steps`` server steps of ``run`` at ``threads`` torch threads."""
    torch.set_num_threads(threads)
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        run.step()  # type: ignore[attr-defined]
        out.append(1000 * (time.perf_counter() - t0))
    return out


def measure(steps: int, rounds: int, counts: tuple[int, ...]) -> dict[int, float]:
    """Median ms/step per thread count, the counts interleaved block by block."""
    cfg = SimulateConfig.from_options(steps=10**6, seeds=1)
    sim = Workload(cfg)
    runs = {n: start(cfg, sim, "hogwild", 0) for n in counts}
    times: dict[int, list[float]] = {n: [] for n in counts}
    for r in range(rounds):
        for n in (counts if r % 2 == 0 else tuple(reversed(counts))):
            times[n] += _block_ms(runs[n], n, steps)
    return {n: statistics.median(v) for n, v in times.items()}


def _refit_ms(threads: int, repeats: int) -> float:
    """Median ms of one refit's threshold fits (a CUSUM side, the drift test) at ``threads`` BLAS threads."""
    rng = np.random.default_rng(0)
    sample, drifts = rng.standard_normal(4096), rng.standard_normal((2048, 14))
    precision = np.linalg.inv(np.cov(drifts.T))
    out = []
    with threadpool_limits(threads, user_api="blas"):
        for _ in range(repeats):
            t0 = time.perf_counter()
            cusum_threshold_sample(sample, 1e-3 / 40)
            drift_threshold(drifts, precision, DRIFT_LAMBDA, 1e-3 / 40)
            out.append(1000 * (time.perf_counter() - t0))
    return statistics.median(out)


def _decide_ms(threads: int, steps: int) -> float:
    """Median ms of ``Monitor.decide`` at K = 4 past its warm-up, called with ``threads`` BLAS threads."""
    rng = np.random.default_rng(1)
    mon = Monitor(warmup=16, window=32)
    common = rng.standard_normal(14) * 3
    out = []
    with threadpool_limits(threads, user_api="blas"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the warm-up notice
        for i in range(80 + steps):
            rows = np.zeros((4, 16))
            rows[:, :14] = common + rng.standard_normal((4, 14))
            rows[:, 14] = 126 + rng.standard_normal(4)
            t0 = time.perf_counter()
            mon.decide(rows)
            if i >= 80:
                out.append(1000 * (time.perf_counter() - t0))
    return statistics.median(out)


def blas(steps: int, rounds: int, cores: int) -> None:
    """Print the monitor's refit and step at 1 BLAS thread and at all cores, quiet and beside a busy one."""
    print(f"\nnumpy's BLAS threads for the monitor's small matrices; {cores} cores; load average "
          f"{os.getloadavg()[0]:.2f}")
    print(f"{'condition':<24} {'what':<34} {'1 thread ms':>12} {f'{cores} threads ms':>13} {'ratio':>7}")
    for label, busy in CONDITIONS:
        with _beside(busy):
            for what, fn, n in (("refit: CUSUM + drift thresholds", _refit_ms, rounds),
                                ("Monitor.decide, K = 4 (as shipped)", _decide_ms, steps)):
                one, many = fn(1, n), fn(cores, n)
                print(f"{label:<24} {what:<34} {one:>12.2f} {many:>13.2f} {many / one:>6.2f}×")


def main() -> None:
    """Print ms/step at 1 thread and at every core, quiet and beside one busy process."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="steps per block (default 40)")
    ap.add_argument("--rounds", type=int, default=5, help="blocks per thread count (default 5)")
    ap.add_argument("--part", choices=("torch", "blas", "both"), default="both",
                    help="torch's threads for training, numpy's BLAS threads for the monitor, or both")
    a = ap.parse_args()
    cores = os.cpu_count() or 1
    if a.part != "blas":
        torch_part(a.steps, a.rounds, cores)
    if a.part != "torch":
        blas(a.steps, a.rounds, cores)


def torch_part(steps: int, rounds: int, cores: int) -> None:
    """Print naig simulate's ms/step at 1 torch thread and at every core, quiet and beside a busy process."""
    counts = (1, cores) if cores > 1 else (1,)
    print(f"naig simulate's default workload (gpt-nano, K = 4, hogwild), {rounds} × {steps} steps per "
          f"thread count; {cores} cores; load average at start {os.getloadavg()[0]:.2f}")
    print(f"{'condition':<24} {'1 thread ms/step':>17} {f'{cores} threads ms/step':>18} {'ratio':>7}")
    for label, busy in CONDITIONS:
        with _beside(busy):
            ms = measure(steps, rounds, counts)
        many = ms.get(cores, float("nan"))
        print(f"{label:<24} {ms[1]:>17.1f} {many:>18.1f} {many / ms[1]:>6.2f}×")


if __name__ == "__main__":
    main()
