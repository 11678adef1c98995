"""Step time of DDP and FSDP2 training with and without the monitor, 2 ranks, the small GPT.

docs/monitor.md ("Overhead"). Two ranks on this machine (this process is rank 0 and starts
rank 1) train ``gpt-nano`` (naig.simulate.model) on random bytes. For each framework every
variant has its own model and optimizer, built once:

- DDP: ``plain`` (no hook), ``log`` (``MonitorHook``, one all-gather per bucket), ``log-step``
  (``per_bucket=False``: one all-gather per step), ``exact`` (exact dots: a gradient copy, a
  wait for the last all-reduce and a second all-gather of 2 floats);
- FSDP2 (``fully_shard`` on each block and the root): ``plain``, ``log`` (one all-gather per FSDP
  module), ``log-step``.

The variants are timed in interleaved blocks (``--repeats`` rounds; in each, every variant of the
framework runs ``--steps`` steps; before the rounds each variant runs ``--warmup`` untimed steps,
past the detectors' 32-step window: the first step with a full window calibrates the detectors'
thresholds, a one-off of about a second per process, cached afterwards), so load drifting on a shared
machine hits them alike. A block's time is rank 0's wall time between two barriers, divided by
its steps. Printed per variant: the median step time over the rounds (ms), its ratio to
``plain``'s median (target ≤ 1.05), the median and the range of the paired ratios (each round's
variant over that round's plain: less sensitive to load that changes between rounds), rank 0's
main-thread CPU time per step and its ratio (waiting excluded: the monitor's own compute), and the
bytes each rank sends per step beyond the framework's own, next to
the gradient bytes the framework itself reduces per step.

Usage: python benchmarks/monitor_overhead.py [--repeats 15] [--steps 20] [--warmup 40] [--batch 8]
[--preset gpt-nano]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from naig.distributed.launch import process_group
from naig.monitor import Monitor, MonitorHook
from naig.monitor.fsdp import fully_shard_monitor
from naig.simulate.model import GPT, get_preset, lm_loss

__all__ = ["main"]

TARGET = 1.05


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=40,
                   help="untimed steps first: past the detectors' 32-step window, whose first full step "
                        "calibrates the thresholds once per process (about 1 s)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--preset", default="gpt-nano", help="naig.simulate.model preset (gpt-micro: 7x larger)")
    return p.parse_args(argv)


class Variant:
    """One model + optimizer (+ monitor) and a step function."""

    def __init__(self, name: str, framework: str, rank: int, batch: int, preset: str) -> None:
        self.name, self.framework = name, framework
        cfg = get_preset(preset)
        model = GPT(cfg, generator=torch.Generator().manual_seed(0))
        self.n_params = sum(p.numel() for p in model.parameters())
        self.watch = None
        if framework == "ddp":
            self.model = DistributedDataParallel(model)
            if name != "plain":
                self.watch = MonitorHook(model, Monitor(), exact=name == "exact",
                                         per_bucket=name != "log-step").register(self.model)
        else:
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
            self.model = model
            if name != "plain":
                self.watch = fully_shard_monitor(model, Monitor(), per_bucket=name != "log-step")
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.gen = torch.Generator().manual_seed(1000 + rank)
        self.batch, self.context = batch, cfg.context

    def step(self) -> None:
        x = torch.randint(0, 256, (self.batch, self.context + 1), generator=self.gen)
        self.opt.zero_grad()
        lm_loss(self.model(x[:, :-1]), x[:, 1:]).backward()
        self.opt.step()

    @property
    def extra_bytes(self) -> int:
        return 0 if self.watch is None else self.watch.extra_bytes


def _block(v: Variant, steps: int) -> tuple[float, float]:
    """ms per step of ``steps`` steps: rank 0's wall time between two barriers, its main thread's CPU time.

    (On the CPU the forward, the backward with the hooks and the optimizer step all run on the
    calling thread; the CPU time leaves out waiting, so it is far less sensitive to other load.)
    """
    dist.barrier()
    t0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(steps):
        v.step()
    c1 = time.thread_time()
    dist.barrier()
    return 1000 * (time.perf_counter() - t0) / steps, 1000 * (c1 - c0) / steps


def _framework(name: str, variants: list[str], args: argparse.Namespace, rank: int,
               out: Callable[[str], None]) -> None:
    vs = [Variant(v, name, rank, args.batch, args.preset) for v in variants]
    for v in vs:
        for _ in range(args.warmup):
            v.step()
    times: dict[str, list[float]] = {v.name: [] for v in vs}
    cpu: dict[str, list[float]] = {v.name: [] for v in vs}
    for _ in range(args.repeats):
        for v in vs:
            wall, used = _block(v, args.steps)
            times[v.name].append(wall)
            cpu[v.name].append(used)
    base = statistics.median(times["plain"])
    grad_bytes = vs[0].n_params * 4
    out(f"{name.upper()} (2 ranks, {args.preset} {vs[0].n_params} parameters, batch {args.batch}; "
        f"the framework reduces {grad_bytes} B of float32 gradient per rank per step)")
    cpu_base = statistics.median(cpu["plain"])
    out(f"  {'variant':<9} {'ms/step':>8} {'ratio':>6} {'paired':>7} {'round ratios':>14} "
        f"{'cpu ms':>7} {'ratio':>6} {'extra B/step':>13}")
    for v in vs:
        med, used = statistics.median(times[v.name]), statistics.median(cpu[v.name])
        rounds = [t / p for t, p in zip(times[v.name], times["plain"], strict=True)]
        out(f"  {v.name:<9} {med:8.1f} {med / base:6.3f} {statistics.median(rounds):7.3f} "
            f"{min(rounds):6.3f}-{max(rounds):<7.3f} {used:7.1f} {used / cpu_base:6.3f} {v.extra_bytes:13d}")
    parts = {v.name: len(v.watch.parts) for v in vs if v.watch is not None}
    out(f"  parts gathered per step: {parts} (buckets for DDP, FSDP modules for FSDP2)")


def main(argv: list[str]) -> None:
    args = _args(argv)
    with process_group(2, [sys.executable, __file__, *argv]) as (rank, _):
        torch.set_num_threads(1)
        lines: list[str] = []
        out = lines.append if rank == 0 else (lambda s: None)
        _framework("ddp", ["plain", "log", "log-step", "exact"], args, rank, out)
        _framework("fsdp2", ["plain", "log", "log-step"], args, rank, out)
        if rank == 0:
            print("\n".join(lines))
            print(f"target: ratio <= {TARGET} (log); {args.repeats} rounds x {args.steps} steps interleaved")


if __name__ == "__main__":
    main(sys.argv[1:])
