"""Ranks for tests/test_monitor_accelerate.py: ``naig.monitor.accelerate.watch`` in real Accelerate loops
(DDP, gloo, CPU), started by torchrun with 3 processes::

    torchrun --standalone --nproc-per-node 3 -m tests.monitor_accelerate_ranks OUT.json

Every run prepares an MLP (8 → 32 → 4) and Adam with a new ``Accelerator(cpu=True)`` and trains
``STEPS`` optimizer steps on rank ``r``'s own batch of each step (``rank_batch``); at step
``BAD_STEP`` (the last) rank ``BAD_RANK``'s loss is ×1000. The runs, in turn:

- ``plain``: no monitor; ``log``: ``watch`` (must end bit-identical), ``save_state`` after step
  ``RESUME_STEP``;
- ``skip`` / ``raise``: that action (the last step must leave the parameters unchanged);
- ``accumulate``: ``gradient_accumulation_steps`` 2 under ``accelerator.accumulate`` (two
  micro-batches per step; the ×1000 in the second, the one that syncs);
- ``resumed``: ``load_state`` of the step-6 state, then steps 7 to 12; ``fresh``: the same from a
  copy without the monitor's file (loaded before ``watch``, so nothing of it is restored);
  ``plain_resumed``: that copy loaded and steps 7 to 12 run without the monitor.

Every collective outside Accelerate waits at most ``TIMEOUT`` seconds (Accelerate's group: the
same, ``InitProcessGroupKwargs``). Rank 0 writes what each rank saw.
"""

from __future__ import annotations

import gc
import json
import shutil
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
from torch import nn

from naig.errors import UsageError
from naig.monitor import BadRankError, Monitor
from naig.monitor.accelerate import watch
from tests.monitor_rank_tools import exit_after, gather_rows, rank_batch

WORLD, BAD_RANK, BAD_STEP, STEPS, RESUME_STEP, WINDOW, TIMEOUT = 3, 2, 12, 12, 6, 8, 30.0


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def _loss(model: nn.Module, rank: int, step: int, micro: int, accumulate: int) -> torch.Tensor:
    x, y = rank_batch(rank, 100 * step + micro, 16)
    loss = nn.functional.cross_entropy(model(x), y)
    bad = rank == BAD_RANK and step == BAD_STEP and micro == accumulate - 1
    return loss * 1000.0 if bad else loss


def _run(rank: int, tmp: Path, action: str | None, accumulate: int = 1, save: bool = False,
         resume: Path | None = None, load_first: bool = False) -> dict:
    acc = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=TIMEOUT))])
    acc.gradient_accumulation_steps = accumulate
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
    model, opt = acc.prepare(model, torch.optim.Adam(model.parameters(), lr=1e-2))
    masks, lines, hook = [], [], None
    if resume is not None and load_first:
        acc.load_state(str(resume))
    if action is not None:
        def seen(sig: object, d: object) -> None:
            mask = torch.zeros(WORLD)
            mask[list(d.ranks)] = 1.0
            masks.append(mask)
            lines.append(d.describe())

        hook = watch(acc, model, opt, Monitor(action=action, window=WINDOW, timeout=TIMEOUT, callback=seen))
    if resume is not None and not load_first:
        acc.load_state(str(resume))
    err, before = None, None
    for step in range(RESUME_STEP + 1 if resume else 1, STEPS + 1):
        before = _flat(model) if step == BAD_STEP else before
        try:
            for micro in range(accumulate):
                with acc.accumulate(model):
                    acc.backward(_loss(model, rank, step, micro, accumulate))
                    opt.step()
                    opt.zero_grad()
        except BadRankError as exc:
            err = str(exc)
            break
        if save and step == RESUME_STEP:
            acc.save_state(str(tmp / "state"))
    out: dict = {"params": _flat(model).tolist(), "error_text": err,
                 "error": gather_rows(torch.tensor([float(err is not None)]), WORLD, TIMEOUT),
                 "unchanged": gather_rows(torch.tensor([float(torch.equal(before, _flat(model)))]), WORLD,
                                          TIMEOUT)}
    if hook is not None:
        out["flagged"] = gather_rows(torch.stack(masks), WORLD, TIMEOUT)  # (K, steps, K)
        out["describe"] = lines
        out["hosts"] = list(hook.monitor.hosts)
        out["monitor_steps"] = hook.step
        hook.detach()
    return out


def _order(rank: int) -> dict:
    """``watch`` before ``prepare`` (``before``), twice on one prepared model (``again``), then again
    after ``detach`` (the new hook decides: ``steps``, the two hooks' step counts after one step)."""
    acc = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=TIMEOUT))])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    said: dict = {"before": None, "again": None}
    try:
        watch(acc, model, opt, Monitor(timeout=TIMEOUT))
    except UsageError as exc:
        said["before"] = str(exc)
    model, opt = acc.prepare(model, opt)
    first = watch(acc, model, opt, Monitor(timeout=TIMEOUT))
    try:
        watch(acc, model, opt, Monitor(timeout=TIMEOUT))
    except UsageError as exc:
        said["again"] = str(exc)
    first.detach()
    second = watch(acc, model, opt, Monitor(timeout=TIMEOUT))
    acc.backward(_loss(model, rank, 1, 0, 1))
    opt.step()
    said["steps"] = [first.step, second.step]
    second.detach()
    return said


def main(out: str) -> None:
    warnings.filterwarnings("ignore")
    tmp = Path(out).parent
    acc = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=TIMEOUT))])
    rank = acc.process_index
    runs = {"plain": _run(rank, tmp, None), "log": _run(rank, tmp, "log", save=True),
            "skip": _run(rank, tmp, "skip"), "accumulate": _run(rank, tmp, "log", accumulate=2),
            "accumulate_plain": _run(rank, tmp, None, accumulate=2)}
    if rank == 0:
        shutil.copytree(tmp / "state", tmp / "fresh")
        for f in (tmp / "fresh").glob("custom_checkpoint_*"):
            f.unlink()
    gather_rows(torch.zeros(1), WORLD, TIMEOUT)  # the copy exists before any rank reads it
    runs["resumed"] = _run(rank, tmp, "log", resume=tmp / "state")
    runs["fresh"] = _run(rank, tmp, "log", resume=tmp / "fresh", load_first=True)
    runs["plain_resumed"] = _run(rank, tmp, None, resume=tmp / "fresh")
    runs["raise"] = _run(rank, tmp, "raise")
    runs["order"] = _order(rank)
    if rank == 0:
        doc = {"world": WORLD, "bad_rank": BAD_RANK, "bad_step": BAD_STEP, "resume_step": RESUME_STEP,
               "runs": runs}
        Path(out).write_text(json.dumps(doc))
    acc.wait_for_everyone()
    gc.collect()  # every run's DDP model and reducer die before the group (examples/monitor_accelerate.py)
    acc.end_training()


if __name__ == "__main__":
    exit_after(main, sys.argv[1])
