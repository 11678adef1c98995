"""Routing overhead of ``naig simulate``: naig step time / hogwild step time (docs/design.md §9).

Runs the default workload (gpt-nano, lags 0,10,20,35, default batch and
optimizer) with the ``naig`` and ``hogwild`` strategies in lockstep: one naig
server step, one hogwild server step, the order flipping every step, so that
the speed drift of a shared machine hits both alike. It prints the median ms
per server step of each and their ratio, for the whole step (K worker
gradients + combine + optimizer update) and for the combine alone. The ratio
measures the cost of the sketch, the energies and the Gibbs weights.
Target: ratio ≤ 1.05.

Usage: python benchmarks/simulate_overhead.py [--repeats 5] [--steps 100]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from naig.simulate import SimulateConfig, Workload
from naig.simulate.engines import start
from naig.simulate.model import GPT, get_preset
from naig.simulate.strategies import Batch, StrategyOptions, make_strategy
from naig.sketch.torch_sketch import TorchSketch

__all__ = ["main"]


def _lockstep_times(cfg: SimulateConfig, repeats: int) -> dict[str, list[float]]:
    """Per-step wall times (ms) of naig and hogwild runs advanced in alternation."""
    sim = Workload(cfg)  # the loop's own objects, so the step measured is the real one
    times: dict[str, list[float]] = {"naig": [], "hogwild": []}
    for seed in range(repeats):
        runs = {name: start(cfg, sim, name, seed) for name in times}
        for t in range(cfg.steps):
            for name in sorted(times, reverse=t % 2 == 1):
                t0 = time.perf_counter()
                runs[name].step()
                times[name].append(1000 * (time.perf_counter() - t0))
    return times


def _combine_ms(cfg: SimulateConfig, name: str, calls: int = 300) -> float:
    """Median ms of one ``combine`` call alone on random (K, n) gradients of the workload."""
    named = [(n, p.numel()) for n, p in GPT(get_preset(cfg.model)).named_parameters()]
    strategy = make_strategy(name, StrategyOptions(sketch=TorchSketch.build(named)))
    gen = torch.Generator().manual_seed(0)
    lags = cfg.setting.lags
    n, k = sum(s for _, s in named), len(lags)
    grads, stale = torch.randn(k, n, generator=gen), torch.randn(k, n, generator=gen)
    batch = Batch(grads, torch.tensor(lags), torch.arange(k), torch.randn(n, generator=gen), stale)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        strategy.combine(batch)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main() -> None:
    """Parse options, measure interleaved runs, print both medians and the ratio."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="seeds, one lockstep pair of runs each")
    ap.add_argument("--steps", type=int, default=100, help="server steps per run")
    args = ap.parse_args()
    cfg = SimulateConfig.from_options(steps=args.steps, seeds=1, eval_every=0, eval_batches=1)
    times = _lockstep_times(cfg, max(1, args.repeats))
    naig, hog = statistics.median(times["naig"]), statistics.median(times["hogwild"])
    print(
        f"workload: {cfg.model}, lags {cfg.setting.lags}, batch {cfg.batch_size}/worker, "
        f"{len(times['naig'])} lockstep steps each ({args.repeats} seeds x {args.steps} steps)"
    )
    print(f"hogwild median {hog:.2f} ms/step; naig median {naig:.2f} ms/step")
    print(f"ratio naig/hogwild = {naig / hog:.3f} (target <= 1.05)")
    c_naig, c_hog = _combine_ms(cfg, "naig"), _combine_ms(cfg, "hogwild")
    print(
        f"combine alone: naig {c_naig:.3f} ms, hogwild {c_hog:.3f} ms; routing cost "
        f"{c_naig - c_hog:.3f} ms = {100 * (c_naig - c_hog) / hog:.1f}% of a hogwild step"
    )


if __name__ == "__main__":
    main()
