"""Ranks for tests/test_monitor_detectors_ranks.py: a persistent fault, a resumed monitor, and two ranks.

``python -m tests.monitor_persistent_ranks OUT.json`` makes this process rank 0 of ``WORLD`` (4)
and starts the others (the tests start all ``WORLD`` ranks, as torchrun does:
``tests.conftest.run_ranks``). Every rank trains a tiny MLP on its own batches (64 examples per rank)
with ``Monitor.observe`` before its own all-reduce (mean) and SGD, for ``STEPS`` steps:

- ``persistent``: from step ``ONSET`` on, rank ``BAD_RANK`` sends its gradient ×2 (and the
  mean it enters is trained on);
- ``whole`` and ``resumed``: the same clean-then-×1.15 run (a change the CUSUM, not the transient
  test, has to find) twice: once uninterrupted, once with the monitor's ``state_dict()`` saved
  after step ``CUT`` (``torch.save`` on rank 0; every rank loads rank 0's file), a new Monitor built
  and the state loaded, as a job restarted from a checkpoint would;
- ``two``: ranks 0 and 1 only, in their own group (``dist.new_group``), with a ×1000 rank 1 at
  ``ONSET`` and a ×2 rank 1 from ``ONSET + 5`` on: the two-rank rules (only non-finite and norm).

Every collective waits at most ``TIMEOUT`` seconds; rank 0 writes every rank's named ranks per
step and each decision's text.
"""

from __future__ import annotations

import json
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from naig.distributed.launch import process_group
from naig.monitor import Monitor
from tests.monitor_rank_tools import exit_after, gather_rows, rank_batch

WORLD, BAD_RANK, ONSET, STEPS, CUT, TIMEOUT = 4, 2, 30, 42, 32, 30.0


def _train(rank: int, world: int, factor: float, monitor: Monitor, steps: range, model: nn.Module,
           opt: torch.optim.Optimizer, group: dist.ProcessGroup | None = None, spike: bool = False
           ) -> list[dict]:
    out = []
    for step in steps:
        x, y = rank_batch(rank, step, 64)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        if rank == (1 if group is not None else BAD_RANK):
            with torch.no_grad():
                for p in model.parameters():
                    p.grad.mul_(1000.0 if spike and step == ONSET else factor if step >= ONSET + (
                        5 if spike else 0) else 1.0)
        decision = monitor.observe({n: p.grad for n, p in model.named_parameters()})
        mask = torch.zeros(world)
        mask[list(decision.ranks)] = 1.0
        views = gather_rows(mask, world, TIMEOUT) if group is None else _gather_in(mask, world, group)
        out.append({"step": decision.step, "views": views, "describe": decision.describe(),
                    "since": {str(r): decision.since(r) for r in decision.ranks}})
        for p in model.parameters():
            dist.all_reduce(p.grad, group=group, async_op=True).wait(timeout=timedelta(seconds=TIMEOUT))
            p.grad.div_(world)
        opt.step()
    return out


def _gather_in(x: torch.Tensor, world: int, group: dist.ProcessGroup) -> list[list]:
    out = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(out, x, group=group, async_op=True).wait(timeout=timedelta(seconds=TIMEOUT))
    return torch.stack(out).tolist()


def _fresh() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def _resumed(rank: int, tmp: Path) -> list[dict]:
    """Steps 1..CUT, save (rank 0), a new monitor loads rank 0's state, steps CUT+1..STEPS."""
    model, opt = _fresh()
    first = Monitor(timeout=TIMEOUT)
    out = _train(rank, WORLD, 1.15, first, range(1, CUT + 1), model, opt)
    path = tmp / "monitor-state.pt"
    if rank == 0:
        torch.save(first.state_dict(), path)
    dist.barrier(async_op=True).wait(timeout=timedelta(seconds=TIMEOUT))
    again = Monitor(timeout=TIMEOUT)
    again.load_state_dict(torch.load(path, weights_only=True))
    return out + _train(rank, WORLD, 1.15, again, range(CUT + 1, STEPS + 1), model, opt)


def main(out: str) -> None:
    argv = [sys.executable, "-m", "tests.monitor_persistent_ranks", out]
    warnings.simplefilter("ignore", UserWarning)  # the warm-up line (tested on its own)
    with process_group(WORLD, argv, timeout=TIMEOUT) as (rank, _):
        runs = {}
        model, opt = _fresh()
        steps = range(1, STEPS + 1)
        runs["persistent"] = _train(rank, WORLD, 2.0, Monitor(timeout=TIMEOUT), steps, model, opt)
        model, opt = _fresh()
        runs["whole"] = _train(rank, WORLD, 1.15, Monitor(timeout=TIMEOUT), range(1, STEPS + 1), model, opt)
        runs["resumed"] = _resumed(rank, Path(out).parent)
        pair = dist.new_group([0, 1])
        if rank < 2:
            model, opt = _fresh()
            runs["two"] = _train(rank, 2, 2.0, Monitor(process_group=pair, timeout=TIMEOUT),
                                 range(1, STEPS + 1), model, opt, group=pair, spike=True)
        dist.barrier(async_op=True).wait(timeout=timedelta(seconds=TIMEOUT))
        if rank == 0:
            doc = {"world": WORLD, "bad_rank": BAD_RANK, "onset": ONSET, "cut": CUT, "runs": runs}
            Path(out).write_text(json.dumps(doc))


if __name__ == "__main__":
    exit_after(main, sys.argv[1])
