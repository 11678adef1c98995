"""Step time, CPU time, peak memory and bytes of DDP and FSDP2 training with and without the monitor.

docs/monitor.md ("Overhead and memory"). Two ranks on this machine (this process is rank 0 and
starts rank 1) train ``--preset``: ``gpt-nano`` (naig.simulate.model, Adam, random bytes) or
``mlp-113m``, a wide MLP of 113M parameters (1024 → 8192 → 8192 → 4096 → 1024, GELU, mean
squared error on random data, plain SGD so that two variants' models fit in memory; use few
steps), or ``gpt2-small``: GPT-2 small's shape and vocabulary (12 layers, width 768, 1024-token
context, 50,257 tokens, tied head: 124,439,808 parameters; Adam, random tokens, full-length
sequences: a step of real language-model compute, seconds per step on one CPU core). For each
framework every variant has its own model and optimizer, built once:

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
bytes each rank sends per step beyond the framework's own (the mean over every step run), next
to the gradient bytes the framework itself reduces per step.

With ``--rss``, each variant also runs alone in a fresh pair of processes (``--warmup`` + ``--steps``
steps) and reports the larger of the two ranks' peak resident set (``VmHWM``); printed with its
ratio to ``plain``'s (``--rss-only``: that part alone). Targets: ``log`` ≤ 1.05× step time at
gpt-nano, ≤ 1.02× step time and peak RSS at ≥ 100M parameters.

Usage: python benchmarks/monitor_overhead.py [--repeats 15] [--steps 20] [--warmup 40] [--batch 8]
[--preset gpt-nano|mlp-113m|gpt2-small] [--variants plain,log] [--window 32] [--rss]
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from naig.distributed.launch import process_group
from naig.errors import UsageError
from naig.monitor import Monitor, MonitorHook
from naig.monitor.fsdp import fully_shard_monitor
from naig.simulate.model import GPT, GPTConfig, get_preset, lm_loss

__all__ = ["main"]

TARGET = {"gpt-nano": 1.05, "mlp-113m": 1.02, "gpt2-small": 1.02}
GPT2_SMALL = GPTConfig(layers=12, heads=12, d_model=768, context=1024, vocab=50257)  # 124,439,808 parameters
MLP_WIDTHS = (1024, 8192, 8192, 4096, 1024)  # 113.3M parameters
VARIANTS = {"ddp": ("plain", "log", "log-step", "exact"), "fsdp2": ("plain", "log", "log-step")}


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=_positive, default=15)
    p.add_argument("--steps", type=_positive, default=20)
    p.add_argument("--warmup", type=int, default=40,
                   help="untimed steps first: past the detectors' 32-step window, whose first full step "
                        "calibrates the thresholds once per process (about 1 s)")
    p.add_argument("--batch", type=_positive, default=8)
    p.add_argument("--preset", default="gpt-nano",
                   help="naig.simulate.model preset (gpt-micro: 7x larger), mlp-113m, or gpt2-small "
                        "(GPT-2 small: gpt2-124m's shape with its 50,257-token vocabulary, 124M parameters)")
    p.add_argument("--variants", default=None,
                   help="comma-separated subset of log, log-step, exact (DDP only) (default: all; plain "
                        "always runs)")
    p.add_argument("--window", type=_positive, default=32, help="the detectors' window (Monitor(window=))")
    p.add_argument("--rss", action="store_true",
                   help="also each variant's peak RSS, alone in fresh processes")
    p.add_argument("--rss-only", action="store_true", help="only the peak RSS part (no timing)")
    p.add_argument("--only", default=None, help=argparse.SUPPRESS)  # framework:variant, for --rss
    args = p.parse_args(argv)
    known = {v for names in VARIANTS.values() for v in names}
    unknown = sorted(set(args.variants.split(",")) - known) if args.variants is not None else []
    if unknown:
        p.error(f"--variants: unknown {', '.join(map(repr, unknown))}; use a subset of "
                f"{', '.join(sorted(known - {'plain'}))}")
    if args.warmup < 0:
        p.error(f"--warmup: must be at least 0, got {args.warmup}")
    try:  # what the monitor and the model builder refuse, refused here in one line
        Monitor(window=args.window)
        if args.preset not in TARGET:
            get_preset(args.preset)
    except UsageError as exc:
        option = "--window" if exc.field == "window" else "--preset"
        extra = "" if option == "--window" else f" (or {', '.join(t for t in TARGET if t != 'gpt-nano')})"
        p.error(f"{option}: {exc.message}{extra}")
    return args


def _variants(args: argparse.Namespace, framework: str) -> list[str]:
    if args.variants is None:
        return list(VARIANTS[framework])
    asked = args.variants.split(",")
    return ["plain"] + [v for v in VARIANTS[framework] if v in asked and v != "plain"]


class _MLP(nn.Module):
    """The wide MLP of ``mlp-113m`` (Linear + GELU; the last layer linear)."""

    def __init__(self, widths: tuple[int, ...], generator: torch.Generator) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:], strict=True))
        with torch.no_grad():
            for layer in self.layers:
                layer.weight.normal_(0, layer.in_features ** -0.5, generator=generator)
                layer.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            x = nn.functional.gelu(x) if i + 1 < len(self.layers) else x
        return x


class Variant:
    """One model + optimizer (+ monitor) and a step function."""

    def __init__(self, name: str, framework: str, rank: int, batch: int, preset: str, window: int) -> None:
        self.name, self.framework, self.mlp = name, framework, preset == "mlp-113m"
        gen = torch.Generator().manual_seed(0)
        if self.mlp:
            model, self.context, self.vocab = _MLP(MLP_WIDTHS, gen), 0, 0
            blocks = list(model.layers)
        else:
            cfg = GPT2_SMALL if preset == "gpt2-small" else get_preset(preset)
            model, self.context, self.vocab = GPT(cfg, generator=gen), cfg.context, cfg.vocab
            blocks = list(model.blocks)
        self.n_params = sum(p.numel() for p in model.parameters())
        self.watch = None
        monitor = Monitor(window=window)
        if framework == "ddp":
            self.model = DistributedDataParallel(model)
            if name != "plain":
                self.watch = MonitorHook(model, monitor, exact=name == "exact",
                                         per_bucket=name != "log-step").register(self.model)
        else:
            for block in blocks:
                fully_shard(block)
            fully_shard(model)
            self.model = model
            if name != "plain":
                self.watch = fully_shard_monitor(model, monitor, per_bucket=name != "log-step")
        params = self.model.parameters()
        self.opt = torch.optim.SGD(params, lr=1e-3) if self.mlp else torch.optim.Adam(params, lr=1e-3)
        self.gen = torch.Generator().manual_seed(1000 + rank)
        self.batch = batch
        self.sent, self.steps = 0, 0

    def step(self) -> None:
        self.opt.zero_grad()
        if self.mlp:
            x = torch.randn(self.batch, MLP_WIDTHS[0], generator=self.gen)
            y = torch.randn(self.batch, MLP_WIDTHS[-1], generator=self.gen)
            nn.functional.mse_loss(self.model(x), y).backward()
        else:
            x = torch.randint(0, self.vocab, (self.batch, self.context + 1), generator=self.gen)
            lm_loss(self.model(x[:, :-1]), x[:, 1:]).backward()
        self.opt.step()
        self.sent, self.steps = self.sent + self.extra_bytes, self.steps + 1

    @property
    def extra_bytes(self) -> int:
        """Bytes this rank sent beyond the framework's own in the latest step."""
        return 0 if self.watch is None else self.watch.extra_bytes

    @property
    def mean_extra_bytes(self) -> float:
        """The same, averaged over every step so far (the host names ride the first step only)."""
        return self.sent / self.steps if self.steps else 0.0


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
    vs = [Variant(v, name, rank, args.batch, args.preset, args.window) for v in variants]
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
            f"{min(rounds):6.3f}-{max(rounds):<7.3f} {used:7.1f} {used / cpu_base:6.3f} "
            f"{v.mean_extra_bytes:13.0f}")
    parts = {v.name: len(v.watch.parts) for v in vs if v.watch is not None}
    out(f"  parts gathered per step: {parts} (buckets for DDP, FSDP modules for FSDP2)")
    del vs
    gc.collect()


def _alone(framework: str, variant: str, args: argparse.Namespace, rank: int) -> int:
    """Peak RSS (bytes, the larger of the ranks') of one variant run alone in this process group."""
    v = Variant(variant, framework, rank, args.batch, args.preset, args.window)
    for _ in range(args.warmup + args.steps):
        v.step()
    peak = torch.tensor([_peak_rss()], dtype=torch.float64)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return int(peak.item())


def _peak_rss() -> int:
    """This process's peak resident set in bytes: VmHWM of /proc/self/status (Linux).

    Not ``getrusage``'s ``ru_maxrss``: Linux keeps that across ``execve``, so a rank forked from a
    process that had grown larger would report the parent's peak.
    """
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # not Linux: the best there is


def _rss(argv: list[str], args: argparse.Namespace, out: Callable[[str], None]) -> None:
    """Each variant alone in a fresh pair of processes: peak RSS and its ratio to plain's."""
    for framework in VARIANTS:
        peaks = {}
        for variant in _variants(args, framework):
            r = subprocess.run([sys.executable, __file__, *argv, "--only", f"{framework}:{variant}"],
                               capture_output=True, text=True, timeout=3600, check=True)
            peaks[variant] = int(r.stdout.split("PEAK_RSS ")[1].split()[0])
        line = ", ".join(f"{v} {b / 2**20:.0f} MiB ({b / peaks['plain']:.3f}x)" for v, b in peaks.items())
        out(f"{framework.upper()} peak RSS, each variant alone (max over 2 ranks): {line}")


def _say(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str]) -> None:
    args = _args(argv)
    with process_group(2, [sys.executable, __file__, *argv]) as (rank, _):
        torch.set_num_threads(1)
        if args.only is not None:
            framework, variant = args.only.split(":")
            peak = _alone(framework, variant, args, rank)
            if rank == 0:
                print(f"PEAK_RSS {peak}")
            return
        out = _say if rank == 0 else (lambda s: None)
        for framework in VARIANTS if not args.rss_only else ():
            absent = sorted(set(args.variants.split(",")) - set(VARIANTS[framework])) if args.variants else []
            if absent:
                out(f"{framework.upper()}: {', '.join(absent)} not run (no such variant under {framework})")
            _framework(framework, _variants(args, framework), args, rank, out)
    if rank == 0:
        if args.rss or args.rss_only:
            _rss(argv, args, _say)
        target = TARGET.get(args.preset, TARGET["gpt-nano"])
        rss = ", and peak RSS" if TARGET.get(args.preset) == 1.02 else ""
        print(f"target: ratio <= {target} (log{rss}); "
              f"{args.repeats} rounds x {args.steps} steps interleaved; "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


if __name__ == "__main__":
    main(sys.argv[1:])
