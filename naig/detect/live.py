"""The live check of ``naig detect``: the same scores from a real run of K gloo processes.

``python -m naig.detect.live OUT.json`` makes this process rank 0 of ``RANKS`` and starts the
other ranks (``naig.launch.process_group``). For each fault cell of ``CELLS`` and each
seed of ``SEEDS``, every rank trains the small GPT of the benchmark (the same text, model,
minibatch streams ``stream_seed(seed, rank)`` and Adam) in a custom data-parallel loop: it
computes its gradient, the rank drawn for this step (the same draw on every rank) replaces it by
the faulty one (``apply_gradient_fault``), every rank calls ``Monitor.observe`` with its
gradient by parameter name (the monitor's sketch of the benchmark's layout and seed, one
all-gather over gloo), then all-reduces what it observed (the faulty gradient enters the
mean, as in a real fault; the benchmark trains on the clean mean) and steps. The first
``WARMUP`` steps are clean. Rank 0 records, at each later step, the faulty rank and every rank's
relative z (against the other ranks at the step) of the signals the monitor derived
(``Monitor.signals``: ``norm`` and ``distance``): the benchmark's
``norm`` (its absolute value) and ``sketch-14`` scores, computed here by the monitor itself.

``compare(live, bench)`` applies the benchmark's calibrated thresholds to those scores: per
seed the detection rate and top-1 localisation of the faulty rank, their mean and 95%
t-interval over seeds, beside the benchmark's test-seed figures for the same cell.

Every collective waits at most ``TIMEOUT`` seconds; the children exit with rank 0.
"""

from __future__ import annotations

import json
import math
import sys
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from naig.detect.calibrate import rate_interval
from naig.detect.faults import FaultCell, apply_gradient_fault
from naig.detect.protocol import DetectConfig, build_workload
from naig.detect.scores import BLOCKS, DETECTORS, Scorer, StepStats, relative_z
from naig.monitor import Monitor
from naig.monitor.detectors import signal_values
from naig.monitor.signals import MonitorSketch
from naig.simulate.workload import fault_seed, make_optimizer, stream_seed

__all__ = ["RANKS", "CELLS", "SEEDS", "WARMUP", "STEPS", "TIMEOUT", "run_cell", "compare", "overlap", "main"]

RANKS, WARMUP, STEPS, TIMEOUT = 4, 20, 40, 30.0
CELLS = (FaultCell("scale", 10.0), FaultCell("noise", 3.0))
SEEDS = (100, 101, 102)
SCORES = {"norm": "norm", "sketch-14": "distance"}  # benchmark detector → the monitor's signal


def run_cell(cfg: DetectConfig, wl: object, cell: FaultCell, seed: int, rank: int, world: int, *,
             warmup: int = WARMUP, steps: int = STEPS, reference: bool = False) -> dict:
    """One live run (see the module); returns the faulty ranks and the scores per scored step.

    Args:
        cfg: the benchmark's settings (batch, context, lr, window, sketch seed).
        wl: its workload (``build_workload``).
        cell: the fault of the run.
        seed: the run seed (initialisation, streams, fault draws).
        rank: this process's rank; world: K.
        warmup: clean steps first; steps: scored steps after them.
        reference: also all-gather the observed gradients and compute the benchmark's ``Scorer``
            scores from them (``reference`` in the result, the same layout as ``scores``; a check).
    """
    theta = torch.nn.Parameter(wl.init_params(seed))
    opt = make_optimizer("adam", [theta], cfg.lr)
    stream = wl.generator(stream_seed(seed, rank))
    draws = np.random.default_rng(fault_seed(seed))  # the same on every rank
    gen = torch.Generator().manual_seed(fault_seed(seed, rank))
    monitor = Monitor(window=cfg.window, timeout=TIMEOUT, seed=cfg.sketch_seed)
    bad, scores, ref = [], {name: [] for name in SCORES}, {name: [] for name in SCORES}
    scorer = Scorer(world, cfg.window) if reference else None
    sketch = MonitorSketch.build(list(zip(wl.names, wl.sizes, strict=True)), cfg.sketch_seed, BLOCKS)
    for t in range(warmup + steps):
        x, y = wl.data.batch("train", cfg.batch_size, cfg.context, stream)
        flat = theta.detach().clone().requires_grad_(True)
        (g,) = torch.autograd.grad(wl.loss(flat, x, y), flat)
        who = int(draws.integers(world)) if t >= warmup else -1
        if rank == who:
            g = apply_gradient_fault(cell, g, gen, wl.sizes)
        monitor.observe(wl.params(g))
        if scorer is not None:
            every = [torch.empty_like(g) for _ in range(world)]
            dist.all_gather(every, g, async_op=True).wait(timeout=timedelta(seconds=TIMEOUT))
            mine = scorer.scores(StepStats.of(torch.stack(every), sketch), commit=t < warmup)
        if t >= warmup:
            bad.append(who)
            for name, signal in SCORES.items():
                z = relative_z(signal_values(monitor.signals, signal), monitor.signals.usable)
                scores[name].append((np.abs(z) if name == "norm" else z).tolist())
                if scorer is not None:
                    ref[name].append(mine[DETECTORS.index(name)].tolist())
        dist.all_reduce(g, async_op=True).wait(timeout=timedelta(seconds=TIMEOUT))
        theta.grad = g / world
        opt.step()
    out = {"fault": cell.kind, "magnitude": cell.magnitude, "seed": seed, "bad": bad, "scores": scores}
    return {**out, "reference": ref} if reference else out


def compare(live: dict, bench: dict) -> list[dict]:
    """Per cell and score: live detection and top-1 (mean, t-interval over seeds) beside the benchmark's.

    Args:
        live: the document ``main`` wrote.
        bench: a ``naig detect --json`` document with K = ``live["ranks"]`` and these cells.

    Returns:
        Rows {fault, magnitude, detector, threshold, live: {detection, top1}, bench: {detection, top1},
        agree: whether each metric's two intervals overlap}.
    """
    rows = []
    for cell in {(r["fault"], r["magnitude"]) for r in live["runs"]}:
        runs = [r for r in live["runs"] if (r["fault"], r["magnitude"]) == cell]
        brow = next(r for r in bench["rows"] if (r["fault"], r["magnitude"]) == cell)
        for name in SCORES:
            thr = bench["detectors"][name]["threshold"]
            det, top = [], []
            for r in runs:
                s = np.where(np.isnan(np.array(r["scores"][name], float)), -np.inf, r["scores"][name])
                idx = np.arange(len(r["bad"]))
                own = s[idx, r["bad"]]
                others = s.copy()
                others[idx, r["bad"]] = -np.inf
                det.append(float(np.mean(own > thr)))
                top.append(float(np.mean(own > others.max(axis=1))))
            mine = {"detection": list(rate_interval(np.array(det))),
                    "top1": list(rate_interval(np.array(top)))}
            theirs = {m: brow["detectors"][name][m] for m in ("detection", "top1")}
            rows.append({"fault": cell[0], "magnitude": cell[1], "detector": name, "threshold": thr,
                         "live": mine, "bench": theirs,
                         "agree": {m: overlap(mine[m], theirs[m]) for m in mine}})
    return sorted(rows, key=lambda r: (r["fault"], r["magnitude"], r["detector"]))


def overlap(a: list[float], b: list[float]) -> bool:
    """Whether the intervals [a_low, a_high] and [b_low, b_high] meet (a degenerate one is its mean)."""
    lo_a, hi_a = (a[1], a[2]) if math.isfinite(a[1]) else (a[0], a[0])
    lo_b, hi_b = (b[1], b[2]) if b[1] is not None and math.isfinite(b[1]) else (b[0], b[0])
    return lo_a <= hi_b + 1e-12 and lo_b <= hi_a + 1e-12


def main(out: str) -> None:
    """Run every cell and seed on ``RANKS`` gloo processes; rank 0 writes ``out`` (JSON)."""
    from naig.launch import process_group

    torch.set_num_threads(1)
    cfg = DetectConfig(ranks=RANKS, faults=("scale", "noise"), calibration=12, validation=0, test=3)
    argv = [sys.executable, "-m", "naig.detect.live", out]
    with process_group(RANKS, argv, timeout=TIMEOUT) as (rank, world):
        wl = build_workload(cfg)
        runs = [run_cell(cfg, wl, cell, seed, rank, world) for cell in CELLS for seed in SEEDS]
        if rank == 0:
            with open(out, "w") as fh:
                json.dump({"ranks": world, "warmup": WARMUP, "steps": STEPS, "seeds": list(SEEDS),
                           "config": cfg.to_dict(), "runs": runs}, fh)


if __name__ == "__main__":
    main(sys.argv[1])
