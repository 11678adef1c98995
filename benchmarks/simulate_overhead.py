"""Routing overhead of ``naig simulate``: naig step time / hogwild step time (SPEC §4).

Runs the default workload (gpt-nano, lags 0,10,20,35, default batch and
optimizer) alternately with the ``naig`` and ``hogwild`` strategies — the order
flips every repeat so warm-up and machine noise hit both alike — and prints the
median ms per server step of each and their ratio. A step is K worker
gradients + combine + optimizer update, so the ratio measures exactly the cost
of the sketch, the energies and the Gibbs weights. Target: ratio ≤ 1.05.

Usage: python benchmarks/simulate_overhead.py [--repeats 7] [--steps 60]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from naig.model import GPT, get_preset
from naig.simulate import SimulateConfig, run_simulation
from naig.sketch_torch import TorchSketch
from naig.strategies import StrategyOptions, make_strategy

__all__ = ["main"]


def _step_times(cfg: SimulateConfig, repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"naig": [], "hogwild": []}
    for i in range(repeats):
        order = ("naig", "hogwild") if i % 2 == 0 else ("hogwild", "naig")
        result = run_simulation(dataclasses.replace(cfg, strategies=order))
        for run in result.runs:
            times[run.strategy].append(run.ms_per_step)
    return times


def _combine_ms(cfg: SimulateConfig, name: str, calls: int = 300) -> float:
    """Median ms of one ``combine`` call alone on random (K, n) gradients of the workload."""
    named = [(n, p.numel()) for n, p in GPT(get_preset(cfg.model)).named_parameters()]
    strategy = make_strategy(name, StrategyOptions(sketch=TorchSketch.build(named)))
    gen = torch.Generator().manual_seed(0)
    n, k = sum(s for _, s in named), len(cfg.lags)
    args = (torch.randn(k, n, generator=gen), torch.tensor(cfg.lags),
            torch.randn(n, generator=gen), torch.randn(k, n, generator=gen))
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        strategy.combine(*args)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main() -> None:
    """Parse options, measure interleaved runs, print both medians and the ratio."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7, help="runs of each strategy (>= 5)")
    ap.add_argument("--steps", type=int, default=60, help="server steps per run")
    args = ap.parse_args()
    cfg = SimulateConfig(steps=args.steps, seeds=1, eval_every=0, eval_batches=1)
    times = _step_times(cfg, max(5, args.repeats))
    naig, hog = statistics.median(times["naig"]), statistics.median(times["hogwild"])
    print(f"workload: {cfg.model}, lags {cfg.lags}, batch {cfg.batch_size}/worker, "
          f"{args.steps} steps, {len(times['naig'])} interleaved runs each")
    print(f"hogwild median {hog:.2f} ms/step; naig median {naig:.2f} ms/step")
    print(f"ratio naig/hogwild = {naig / hog:.3f} (target <= 1.05)")
    c_naig, c_hog = _combine_ms(cfg, "naig"), _combine_ms(cfg, "hogwild")
    print(f"combine alone: naig {c_naig:.3f} ms, hogwild {c_hog:.3f} ms; routing cost "
          f"{c_naig - c_hog:.3f} ms = {100 * (c_naig - c_hog) / hog:.1f}% of a hogwild step")


if __name__ == "__main__":
    main()
