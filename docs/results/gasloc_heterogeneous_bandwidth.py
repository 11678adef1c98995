"""GASLoC vs DiLoCo vs all-reduce under heterogeneous bandwidth, on naig's simulated clock.

The experiment of docs/results/gasloc-heterogeneous-bandwidth.md (issue 21, item 4). K = 4
workers, each inner step 1 simulated second (``const:1``), H = 10 inner steps per round,
the same ``steps × K`` minibatch gradients for every method. Links: every worker sends at
``FAST`` bytes/s except the slow ones (``FAST / SLOWDOWN``). The outer lr of diloco and gasloc
(η) and the lr of allreduce are each chosen on validation (final loss, mean over seeds) from
a small grid; the chosen run is reported on the test split (the learning-rate tuning
protocol of docs/design.md §8, applied to the outer lr). Bandwidth changes only the clock,
never the training (the same samples in the same order), so the choice made with one slow
link holds for the other scenarios, which run the chosen settings only.

Run (about 15 minutes on 2 shared cores, one torch thread)::

    nice -n 5 python docs/results/gasloc_heterogeneous_bandwidth.py --out docs/results --png docs

Writes ``gasloc-heterogeneous-bandwidth.json`` (every run's curves) into ``--out`` and
``gasloc-heterogeneous-bandwidth.png`` into ``--png``, and prints the tables in Markdown.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from naig.simulate import SimulateConfig, Workload
from naig.simulate.engines import start
from naig.simulate.experiment import RunContext, drive

__all__ = ["main"]

K = 4
N_BYTES = 4 * 120_576  # one gpt-nano parameter message, 4n bytes
FAST = N_BYTES / 0.1  # a fast link moves the model in 0.1 s
SLOWDOWN = 50.0  # a slow link moves it in 5 s (half a round of compute)
SCENARIOS = {"one slow link": (3,), "two slow links": (2, 3), "uniform (control)": ()}
ETAS = (0.1, 0.2, 0.4, 0.7, 1.0)  # outer lr grid of diloco and gasloc (0.7: DiLoCo's published value)
ALLREDUCE_LRS = (1e-3, 3e-3)  # allreduce's only lr (AdamW)
METHODS = ("allreduce", "diloco", "gasloc")


@dataclass
class Run:
    """One run's curves (validation loss at each evaluation point) and its test loss."""

    method: str
    setting: float  # η, or allreduce's lr
    seed: int
    scenario: str
    losses: list[float]
    seconds: list[float]
    mbytes: list[float]  # MB sent per worker (mean over workers)
    samples: list[int]
    test: float


def _config(scenario: str, method: str, setting: float, args: argparse.Namespace) -> SimulateConfig:
    bandwidth = tuple(FAST / SLOWDOWN if w in SCENARIOS[scenario] else FAST for w in range(K))
    lr = (setting, 9e-3) if method == "allreduce" else (1e-3, 9e-3)  # a 2nd lr only makes the test split
    local = {} if method == "allreduce" else {"outer_lr": setting, "local_steps": (args.h,)}
    return SimulateConfig.from_options(arrivals=",".join(["const:1"] * K), bandwidth=bandwidth, lr=lr,
                                       strategies=(method,), steps=args.steps, seeds=args.seeds,
                                       batch_size=args.batch_size, eval_every=args.eval_every,
                                       eval_batches=args.eval_batches, **local)


def _run(scenario: str, method: str, setting: float, seed: int, args: argparse.Namespace) -> Run:
    c = _config(scenario, method, setting, args)
    w = Workload(c.workload)
    val, test = w.val_batches(seed), w.test_batches(seed)
    ctx = RunContext(val, test, w.evaluate(w.init_params(seed), val))
    lr = setting if method == "allreduce" else 1e-3
    r = drive(c, w, start(c, w, method, seed, lr), ctx)
    return Run(method, setting, seed, scenario, [loss for _, loss in r.curve], list(r.curve_seconds),
               [b / 1e6 for b in r.curve_bytes], list(r.curve_samples), float(r.final_test_loss or math.nan))


def _ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval."""
    m = statistics.fmean(values)
    if len(values) < 2:
        return m, math.nan
    return m, float(stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values)))


def _loss_at(run: Run, t: float) -> float:
    """Validation loss reached by simulated second t (the last evaluation at or before t)."""
    done = [loss for s, loss in zip(run.seconds, run.losses, strict=True) if s <= t + 1e-9]
    return done[-1]


def _table(runs: list[Run], scenario: str, chosen: dict[str, float]) -> list[str]:
    """Per method: test loss at equal samples, seconds, MB, and the val loss reached by the time the
    fastest method finished; with the per-seed (paired) difference to diloco, mean ± 95% CI."""
    mine = {m: sorted((r for r in runs if r.scenario == scenario and r.method == m
                       and r.setting == chosen[m]), key=lambda r: r.seed) for m in METHODS}
    horizon = min(statistics.fmean(r.seconds[-1] for r in rs) for rs in mine.values())
    lines = [f"**{scenario}** (slow workers: {list(SCENARIOS[scenario]) or 'none'}; T = {horizon:,.0f} s, "
             "when the fastest method finished its budget)", "",
             "| method | chosen | test loss, equal samples | Δ vs diloco (paired) | simulated s to finish | "
             "MB sent / worker | val loss by T | Δ vs diloco by T (paired) |",
             "|---|---|---|---|---|---|---|---|"]
    ref = mine["diloco"]
    for m, rs in mine.items():
        test, secs = _ci([r.test for r in rs]), _ci([r.seconds[-1] for r in rs])
        at = _ci([_loss_at(r, horizon) for r in rs])
        d_test = _ci([r.test - q.test for r, q in zip(rs, ref, strict=True)])
        d_at = _ci([_loss_at(r, horizon) - _loss_at(q, horizon) for r, q in zip(rs, ref, strict=True)])
        delta = ("—", "—") if m == "diloco" else (f"{d_test[0]:+.4f} ± {d_test[1]:.4f}",
                                                   f"{d_at[0]:+.4f} ± {d_at[1]:.4f}")
        name = "lr" if m == "allreduce" else "η"
        lines.append(f"| {m} | {name} {chosen[m]:g} | {test[0]:.4f} ± {test[1]:.4f} | {delta[0]} | "
                     f"{secs[0]:,.0f} ± {secs[1]:,.0f} | {statistics.fmean(r.mbytes[-1] for r in rs):.1f} | "
                     f"{at[0]:.4f} ± {at[1]:.4f} | {delta[1]} |")
    return lines


def _choose(runs: list[Run]) -> tuple[dict[str, float], list[str]]:
    """Each method's setting with the lowest mean final validation loss; the selection table."""
    chosen, lines = {}, ["| method | setting | final val loss (mean over seeds) |", "|---|---|---|"]
    for m in METHODS:
        grid = ALLREDUCE_LRS if m == "allreduce" else ETAS
        val = {s: statistics.fmean(r.losses[-1] for r in runs if r.method == m and r.setting == s)
               for s in grid}
        chosen[m] = min(val, key=lambda s: val[s] if math.isfinite(val[s]) else math.inf)
        lines += [f"| {m} | {'lr' if m == 'allreduce' else 'η'} {s:g}{' (chosen)' if s == chosen[m] else ''} "
                  f"| {v:.4f} |" for s, v in val.items()]
    return chosen, lines


def _plot(runs: list[Run], chosen: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(SCENARIOS)  # one panel per scenario against seconds; bytes do not depend on bandwidth
    fig, axes = plt.subplots(1, len(scenarios) + 1, figsize=(4.5 * (len(scenarios) + 1), 4), sharey=True)
    for col, sc in enumerate([*scenarios, scenarios[0]]):
        for m in METHODS:
            rs = [r for r in runs if r.scenario == sc and r.method == m and r.setting == chosen[m]]
            n = min(len(r.losses) for r in rs)
            y = np.array([r.losses[:n] for r in rs])
            mean = y.mean(0)
            half = stats.t.ppf(0.975, len(rs) - 1) * y.std(0, ddof=1) / math.sqrt(len(rs))
            xs = [r.seconds[:n] for r in rs] if col < len(scenarios) else [r.mbytes[:n] for r in rs]
            x, first = np.mean(xs, axis=0), 1  # log axes: from the first evaluation on
            (line,) = axes[col].plot(x[first:], mean[first:], marker="o", ms=2.5, lw=1.2, label=m)
            axes[col].fill_between(x[first:], (mean - half)[first:], (mean + half)[first:],
                                   color=line.get_color(), alpha=0.2, lw=0)
        if col < len(scenarios):
            axes[col].set(title=sc, xlabel="simulated seconds", xscale="log")
    axes[-1].set(title="any scenario (bytes do not depend on bandwidth)", xlabel="MB sent per worker",
                 xscale="log")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].set(ylabel="validation loss (nats/byte)", ylim=(2.2, 4.5))
    axes[0].legend(fontsize=8)
    fig.suptitle("gpt-nano, K = 4, H = 10, const:1 s/step; fast link 0.1 s/model, slow 5 s/model; "
                 f"mean ± 95% CI over {len({r.seed for r in runs})} seeds", fontsize=9)
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    """Run the grid, choose, run the other scenarios, write JSON + PNG, print Markdown tables."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--h", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--out", type=Path, default=Path("docs/results"))
    p.add_argument("--png", type=Path, default=Path("docs"))
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: no spinning when shared)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    began, runs = time.time(), []
    first = next(iter(SCENARIOS))
    for m in METHODS:  # the grid, on the first scenario's clock
        for s in ALLREDUCE_LRS if m == "allreduce" else ETAS:
            for seed in range(args.seeds):
                runs.append(_run(first, m, s, seed, args))
                print(f"{time.time() - began:7.0f} s  {first}: {m} {s:g} seed {seed}: "
                      f"val {runs[-1].losses[-1]:.4f}", flush=True)
    chosen, selection = _choose(runs)
    for sc in list(SCENARIOS)[1:]:
        for m in METHODS:
            for seed in range(args.seeds):
                runs.append(_run(sc, m, chosen[m], seed, args))
                print(f"{time.time() - began:7.0f} s  {sc}: {m} seed {seed}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / "gasloc-heterogeneous-bandwidth"
    doc = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": platform.platform(),
           "wall_seconds": time.time() - began, "args": {k: str(v) for k, v in vars(args).items()},
           "chosen": chosen, "runs": [vars(r) for r in runs]}
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    _plot(runs, chosen, args.png / "gasloc-heterogeneous-bandwidth.png")
    print("\n".join(["", *selection, ""]))
    for sc in SCENARIOS:
        print("\n".join([*_table(runs, sc, chosen), ""]))
    print(f"wall {time.time() - began:.0f} s")


if __name__ == "__main__":
    main()
