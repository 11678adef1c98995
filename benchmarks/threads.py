"""torch's CPU threads for naig's training: 1 thread vs all cores, quiet and beside a busy process.

Runs server steps of ``naig simulate``'s default workload (gpt-nano, lags 0,10,20,35, hogwild:
K worker gradients and one Adam update per step) with ``torch.set_num_threads(1)`` and with
``torch.set_num_threads(cores)``, alternating every block of steps so that the speed drift of a
shared machine hits both alike; then the same with one more process spinning on a core (a
second job, another engineer's test run). It prints the median ms per step of each and the
ratio all-cores / 1 thread. ``naig.threads.DEFAULT_THREADS`` was chosen from this.

Usage: python benchmarks/threads.py [--steps 40] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

from naig.simulate import SimulateConfig, Workload
from naig.simulate.engines import start

__all__ = ["main"]

SPIN = "import time\nend = time.time() + 600\nwhile time.time() < end: pass\n"


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


def main() -> None:
    """Print ms/step at 1 thread and at every core, quiet and beside one busy process."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="steps per block (default 40)")
    ap.add_argument("--rounds", type=int, default=5, help="blocks per thread count (default 5)")
    a = ap.parse_args()
    cores = os.cpu_count() or 1
    counts = (1, cores) if cores > 1 else (1,)
    print(f"naig simulate's default workload (gpt-nano, K = 4, hogwild), {a.rounds} × {a.steps} steps per "
          f"thread count; {cores} cores; load average at start {os.getloadavg()[0]:.2f}")
    print(f"{'condition':<24} {'1 thread ms/step':>17} {f'{cores} threads ms/step':>18} {'ratio':>7}")
    for label, busy in (("as the machine is", False), ("+ one busy process", True)):
        spin = subprocess.Popen([sys.executable, "-c", SPIN]) if busy else None
        try:
            ms = measure(a.steps, a.rounds, counts)
        finally:
            if spin is not None:
                spin.kill()
                spin.wait()
        many = ms.get(cores, float("nan"))
        print(f"{label:<24} {ms[1]:>17.1f} {many:>18.1f} {many / ms[1]:>6.2f}×")


if __name__ == "__main__":
    main()
