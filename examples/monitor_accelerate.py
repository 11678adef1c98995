"""naig's monitor in a Hugging Face Accelerate loop: one line after ``prepare``, ``watch(...)``.

``naig.monitor.accelerate.watch(accelerator, model, optimizer, monitor)`` registers the monitor's
DDP communication hook on the prepared model, attaches it to the torch optimizer inside
Accelerate's (``skip`` / ``raise`` before the update) and registers the monitor for
``accelerator.save_state``. The loop itself is Accelerate's usual one.

A small MLP on random 8-feature, 4-class data; each process gets its own shard (the prepared
DataLoader). At step ``--bad-step`` rank ``--bad-rank`` corrupts its gradient with ``--fault``, a kind of
``naig.faults`` (``scale:1000`` the default, ``nan:1`` one NaN entry, ``signflip:1`` the sign),
through a tensor hook on every parameter, before DDP's bucket sees it. Rank 0 writes the monitor's
JSONL and CSV (``OUT/monitor.jsonl``,
``OUT/monitor.csv``) and saves the final parameters (``OUT/params.pt``); every rank writes the
ranks it saw flagged per step (``OUT/ranks/rank{k}.json``).

On CPU (gloo), several processes on one machine (torchrun; Accelerate reads its environment):

    torchrun --standalone --nproc-per-node 3 examples/monitor_accelerate.py OUT
    naig monitor report OUT/monitor.jsonl

On GPUs, Accelerate's own launcher: ``accelerate launch --multi_gpu --num_processes 4
examples/monitor_accelerate.py OUT`` (drop ``cpu=True`` below). ``accelerate launch --cpu
--num_processes N`` starts one process unless mpirun is set up (accelerate 1.15's simple launcher),
so there is nothing to compare; ``watch`` says so.

``--no-monitor`` trains the same run without the monitor (to compare parameters with ``log``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from naig.errors import UsageError, run_main
from naig.faults import corrupted, parse_kind
from naig.monitor import Monitor
from naig.monitor.accelerate import watch
from naig.monitor.records import CsvRecords, JsonlRecords, Records
from naig.threads import DEFAULT_THREADS, check_threads

TIMEOUT = 30.0  # seconds, every collective (the process group's and the monitor's; 30 is the most)


def _in(value: int, low: int, high: int | None, option: str, why: str) -> None:
    """Refuse ``option value`` outside [low, high] (no upper bound: None) in one line (``UsageError``)."""
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        raise UsageError(f"{option} {value}: must be {bound} ({why})")


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path, help="a directory for the records (created if missing)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=16, help="examples per process per step")
    p.add_argument("--bad-rank", type=int, default=1)
    p.add_argument("--bad-step", type=int, default=24, help="1-based; after the detectors' window fills")
    p.add_argument("--fault", default="scale:1000", metavar="KIND[:ARG]",
                   help="a kind of naig.faults (nan:1, signflip:1, bitflip32:30, ...), or none")
    p.add_argument("--action", choices=("log", "warn", "skip", "raise"), default="warn")
    p.add_argument("--window", type=int, default=16, help="the detectors' individual history")
    p.add_argument("--no-monitor", action="store_true", help="train without the monitor")
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                   help="torch CPU threads per rank (default 1: a model this small only loses time to more)")
    args = p.parse_args(argv)
    torch.set_num_threads(check_threads(args.threads, "--threads"))
    world = int(os.environ.get("WORLD_SIZE", 1))
    _in(args.steps, 1, None, "--steps", "training steps")
    args.fault = None if args.fault == "none" else parse_kind(args.fault, field="--fault")
    if args.fault is not None and world > 1:
        _in(args.bad_rank, 0, world - 1, "--bad-rank", f"a rank of the {world} processes")
        _in(args.bad_step, 1, args.steps, "--bad-step", f"a step of --steps {args.steps}")
    for name in ("monitor.jsonl", "monitor.csv"):  # checked on every process, before any collective
        if not args.no_monitor and (args.out / name).exists():
            raise UsageError(f"{args.out / name} exists: pass another folder, or remove it")
    return args


def _fault(args: argparse.Namespace, rank: int, step: list[int]):
    """A tensor hook: rank ``bad_rank`` corrupts its gradient at step ``bad_step`` (step[0] is current)."""
    gen = torch.Generator().manual_seed(rank)

    def hook(grad: torch.Tensor) -> torch.Tensor:
        if args.fault is None or rank != args.bad_rank or step[0] != args.bad_step:
            return grad
        return corrupted(grad, *args.fault, gen)

    return hook


def main(argv: list[str]) -> None:
    args = _args(argv)
    group = _train(args)
    gc.collect()  # the Accelerator, its DDP model and DDP's reducer are gone (their cycles too)...
    del group  # ...so this is the group's last reference: its gloo threads are joined without the GIL


def _train(args: argparse.Namespace) -> object:
    """Train; return the (destroyed) process group, for ``main`` to let go of last.

    A group that dies inside DDP's reducer is torn down with the GIL held, while a gloo thread may
    still need the GIL to free its last work item: a deadlock at exit, seen under load.
    """
    args.out.mkdir(parents=True, exist_ok=True)
    acc = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=TIMEOUT))])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.steps * args.batch_size * acc.num_processes, 8, generator=g)
    y = (x[:, :4].sum(1) > 0).long() + 2 * (x[:, 4:].sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(1))
    model, opt, loader = acc.prepare(model, opt, loader)
    step = [0]
    for p in model.parameters():
        p.register_hook(_fault(args, acc.process_index, step))
    seen: list[list[int]] = []
    records = None
    if not args.no_monitor:
        monitor = Monitor(action=args.action, window=args.window, timeout=TIMEOUT,
                          callback=lambda sig, d: seen.append(list(d.ranks)))
        records = Records(JsonlRecords(args.out / "monitor.jsonl"), CsvRecords(args.out / "monitor.csv"))
        records.attach(monitor)  # rank 0 writes; the other ranks' records do nothing
        watch(acc, model, opt, monitor)  # one process: says there is nothing to compare
    for xb, yb in loader:
        step[0] += 1
        loss = nn.functional.cross_entropy(model(xb), yb)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        if step[0] == args.steps:
            break
    if records is not None:
        records.close()
        (args.out / "ranks").mkdir(exist_ok=True)
        (args.out / "ranks" / f"rank{acc.process_index}.json").write_text(json.dumps(
            {"rank": acc.process_index, "flagged": seen, "hosts": list(monitor.hosts)}))
    if acc.is_main_process:
        state = acc.unwrap_model(model).state_dict()
        torch.save({k: v.detach().clone() for k, v in state.items()}, args.out / "params.pt")
        flagged = {i + 1: r for i, r in enumerate(seen) if r}
        print(f"{acc.num_processes} processes, {step[0]} steps; flagged steps: {flagged or 'none'}")
    acc.wait_for_everyone()  # no process leaves while another still talks to it
    group = torch.distributed.group.WORLD
    acc.end_training()
    return group


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
