"""Ranks for tests/test_monitor_observe.py: ``Monitor.observe`` in a custom loop on real processes.

``python -m tests.monitor_ranks OUT.json`` makes this process rank 0 of 3 and starts ranks 1 and
2 (the same module). For each corruption (``nan``, ``scale`` ×1000, ``flip`` of the sign) every
rank trains a tiny MLP on its own random batches (16 examples per rank; 1024 for
``flip_large_batch``, where the ranks' gradients agree: pairwise cosines near 1) with its own
all-reduce (mean) and SGD; at step
``BAD_STEP`` rank ``BAD_RANK`` corrupts its gradient before ``observe``. The run of a corruption
stops after that step's decision. Every collective of the script waits at most ``TIMEOUT``
seconds. Rank 0 writes every rank's flagged ranks per step, every rank's gradients per step (by
name), the gathered payloads and the signals it derived. Last, rank 0 calls ``observe`` alone
with a 1 s timeout and records the ``DataError`` it gets instead of a hang; before that, a state
loaded on rank 0 only (``_state_on_one_rank``) and a Monitor of another ``blocks`` on rank 1
(``_blocks_on_one_rank``).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from naig.distributed.launch import process_group
from naig.errors import DataError
from naig.monitor import SIGNALS, Monitor

WORLD, BAD_RANK, BAD_STEP, TIMEOUT = 3, 2, 40, 30.0
RUNS = {"nan": 16, "scale": 16, "flip": 16, "flip_large_batch": 1024}  # corruption: examples per rank


def _wait(work: dist.Work) -> None:
    work.wait(timeout=timedelta(seconds=TIMEOUT))


def _gather(x: torch.Tensor) -> torch.Tensor:
    out = [torch.empty_like(x) for _ in range(WORLD)]
    _wait(dist.all_gather(out, x, async_op=True))
    return torch.stack(out)


def _batch(rank: int, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 * rank + step)
    x = torch.randn(size, 8, generator=g)
    return x, (x[:, :4].sum(1) > 0).long() + 2 * (x[:, 4:].sum(1) > 0).long()


def _corrupt(model: nn.Module, kind: str) -> None:
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            if kind == "nan" and i == 0:
                p.grad.view(-1)[3] = float("nan")
            elif kind == "scale":
                p.grad.mul_(1000.0)
            elif kind.startswith("flip"):
                p.grad.neg_()


def _run(rank: int, kind: str, size: int) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # a one-step sign flip is seen by cos, which the default signals leave out (too heavy-tailed)
    monitor = Monitor(timeout=TIMEOUT, **({"signals": SIGNALS} if kind.startswith("flip") else {}))
    flagged, grads, payloads, signals = [], [], [], []
    for step in range(1, BAD_STEP + 1):
        x, y = _batch(rank, step, size)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        if rank == BAD_RANK and step == BAD_STEP:
            _corrupt(model, kind)
        named = {n: p.grad for n, p in model.named_parameters()}
        decision = monitor.observe(named)
        mask = torch.zeros(WORLD)
        mask[list(decision.ranks)] = 1.0
        flagged.append(_gather(mask).tolist())  # every rank's view of the flagged ranks
        every = _gather(torch.cat([g.reshape(-1) for g in named.values()]))
        grads.append(every.tolist())
        payloads.append(monitor.gathered.tolist())
        signals.append(monitor.signals.to_dict())
        if step == BAD_STEP:
            break
        for p in model.parameters():  # the user's own all-reduce
            _wait(dist.all_reduce(p.grad, async_op=True))
            p.grad.div_(WORLD)
        opt.step()
    shapes = {n: list(p.shape) for n, p in model.named_parameters()}
    return {"flagged": flagged, "grads": grads, "payloads": payloads, "signals": signals, "shapes": shapes,
            "hosts": list(monitor.hosts), "describe": monitor.decision.describe()}


def _state_on_one_rank(rank: int) -> dict:
    """Every rank observes 20 steps; then a new Monitor on every rank, the state loaded on rank 0 only
    (a resume that forgot the other ranks): each rank's next ``observe`` raises the same DataError."""
    first = Monitor(timeout=TIMEOUT)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(20):
        first.observe({"w": torch.randn(64, generator=gen)})
    resumed = Monitor(timeout=TIMEOUT)
    if rank == 0:
        resumed.load_state_dict(first.state_dict())
    try:
        resumed.observe({"w": torch.randn(64, generator=gen)})
    except DataError as exc:
        error = str(exc)
    else:
        error = None
    return {"errors": _gather_strings(error)}


def _blocks_on_one_rank(rank: int) -> dict:
    """A Monitor of another ``blocks`` on rank 1 (a wider payload): the first ``observe`` raises the same
    DataError on every rank (until 2026-12-08 the gather of mismatched sizes aborted the process)."""
    try:
        Monitor(blocks=2 if rank == 1 else 1, timeout=TIMEOUT).observe({"w": torch.ones(50)})
    except DataError as exc:
        error = str(exc)
    else:
        error = None
    return {"errors": _gather_strings(error)}


def _gather_strings(text: str | None) -> list[str | None]:
    out: list[str | None] = [None] * WORLD
    dist.all_gather_object(out, text)
    return out


def _missing_peer(rank: int) -> dict:
    """Last: rank 0 observes with a 1 s timeout while the other ranks never do (they wait, then leave)."""
    if rank != 0:
        time.sleep(2.5)
        return {}
    start = time.monotonic()
    try:
        Monitor(timeout=1.0).observe({"w": torch.ones(3)})
    except DataError as exc:
        return {"error": str(exc), "seconds": time.monotonic() - start}
    return {"error": None, "seconds": time.monotonic() - start}


def main(out: str) -> None:
    argv = [sys.executable, "-m", "tests.monitor_ranks", out]
    with process_group(WORLD, argv, timeout=TIMEOUT) as (rank, _):
        runs = {kind: _run(rank, kind, size) for kind, size in RUNS.items()}
        one_state = _state_on_one_rank(rank)
        blocks = _blocks_on_one_rank(rank)
        missing = _missing_peer(rank)
        if rank == 0:
            doc = {"world": WORLD, "bad_rank": BAD_RANK, "bad_step": BAD_STEP, "runs": runs,
                   "missing": missing, "one_state": one_state, "blocks": blocks}
            with open(out, "w") as fh:
                json.dump(doc, fh)


if __name__ == "__main__":
    main(sys.argv[1])
