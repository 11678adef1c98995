"""Ranks for tests/test_monitor_fsdp.py: ``fully_shard_monitor`` inside FSDP2 on real processes (gloo, CPU).

``python -m tests.monitor_fsdp_ranks OUT.json`` makes this process rank 0 of 3 and starts ranks 1
and 2. Every rank trains a small MLP (8 → 64 → 64 → 5; ``fully_shard`` on each Linear and on the
root; the last layer's 5 rows are padded to 6 for 3 ranks) with Adam on its own random batches
for ``STEPS`` steps, in these runs:

- ``plain``: FSDP2 without the monitor; ``log``: with it; ``log`` must end bit-identical;
- ``scale`` / ``flip``: at step ``BAD_STEP`` rank ``BAD_RANK``'s loss is multiplied by 1000 or
  −1 (its whole gradient); ``flip`` with 1024 examples per rank (the ranks agree);
- ``skip`` / ``raise``: its loss multiplied by NaN, with that action;
- ``unused``: every rank leaves the middle Linear (module ``2``) out at steps ``UNUSED`` (no
  gradient: FSDP skips its reduce-scatter); ``set_reduce_scatter_unused_params(True)`` is set on it
  only from step ``UNUSED[1]`` on, and rank ``BAD_RANK``'s loss is NaN at step ``UNUSED_NAN`` with
  ``skip``: each rank records per step the error ``backward`` ended with, the decision's step and
  the ranks named.

Each rank also computes its own gradient on an unsharded twin of the model at the same
parameters (for the float64 comparison). Every collective of the script waits at most
``TIMEOUT`` seconds. Rank 0 writes what each rank saw.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.checkpoint import checkpoint

from naig.distributed.launch import process_group
from naig.errors import DataError
from naig.monitor import SIGNALS, BadRankError, Monitor
from naig.monitor.fsdp import fully_shard_monitor
from tests.monitor_rank_tools import exit_after, gather_rows, rank_batch

WORLD, BAD_RANK, BAD_STEP, STEPS, WINDOW, TIMEOUT = 3, 2, 10, 10, 8, 30.0
FACTOR = {"nan": float("nan"), "scale": 1000.0, "flip": -1.0}
UNUSED, UNUSED_NAN = (3, 5), 6


def _rows(x: torch.Tensor) -> list[list]:
    return gather_rows(x, WORLD, TIMEOUT)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 5))


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([v.reshape(-1) for v in full_state_dict(model).values()])


def _run(rank: int, kind: str, action: str | None = None, size: int = 16) -> dict:
    model = _model()
    for i in (0, 2, 4):
        fully_shard(model[i])
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    watch = None
    if action is not None:
        extra = {"signals": SIGNALS} if kind == "flip" else {}  # a one-step flip: cos, not a default
        watch = fully_shard_monitor(model, Monitor(window=WINDOW, action=action, timeout=TIMEOUT, **extra))
        watch.attach(opt)
    twin = _model()
    out: dict = {"flagged": [], "describe": [], "grads": [], "payloads": [], "signals": []}
    for step in range(1, STEPS + 1):
        x, y = rank_batch(rank, step, size)
        factor = FACTOR.get(kind, 1.0) if rank == BAD_RANK and step == BAD_STEP else 1.0
        twin.load_state_dict(full_state_dict(model))
        twin.zero_grad()
        (nn.functional.cross_entropy(twin(x), y) * factor).backward()
        out["grads"].append(_rows(torch.cat([p.grad.reshape(-1) for p in twin.parameters()])))
        opt.zero_grad()
        (nn.functional.cross_entropy(model(x), y) * factor).backward()
        before = _flat(model) if step == BAD_STEP else None
        err = None
        try:
            opt.step()
        except BadRankError as exc:
            err = str(exc)
        if watch is not None:
            mask = torch.zeros(WORLD)
            mask[list(watch.decision.ranks)] = 1.0
            out["flagged"].append(_rows(mask))
            out["describe"].append(watch.decision.describe())
            out["payloads"].append(watch.monitor.gathered.tolist())
            out["signals"].append(watch.monitor.signals.to_dict())
        if step == BAD_STEP:
            out["unchanged"] = _rows(torch.tensor([float(torch.equal(before, _flat(model)))]))
            out["error"] = _rows(torch.tensor([float(err is not None)]))
            out["error_text"] = err
    out["params"] = _flat(model).tolist()
    out["shapes"] = {n: list(p.shape) for n, p in twin.named_parameters()}
    if watch is not None:
        out["hosts"] = list(watch.monitor.hosts)
        out["modules"] = [c.fqn for c in watch.comms]
        out["extra_bytes"] = watch.extra_bytes
    return out


class _LeavesOut(nn.Sequential):
    """``_model``'s layers; with ``leave_out`` set, the middle Linear and its Tanh are left out (the
    root's own forward, so FSDP's root hooks run); with ``reentrant``, the last Linear runs under
    reentrant activation checkpointing (its backward, where the step's first reduce-scatter is
    issued, is a backward pass nested in the step's)."""

    leave_out = False
    reentrant = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self[1](self[0](x))
        if self.leave_out:
            return self[4](h)
        h = self[3](self[2](h))
        return checkpoint(self[4], h, use_reentrant=True) if self.reentrant else self[4](h)


def _reentrant(rank: int) -> dict:
    """Every step's errors and decision steps with the last Linear checkpointed (reentrant)."""
    model = _LeavesOut(*_model())
    model.reentrant = True
    for i in (0, 2, 4):
        fully_shard(model[i])
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    watch = fully_shard_monitor(model, Monitor(window=WINDOW, timeout=TIMEOUT)).attach(opt)
    out: dict = {"errors": [], "decided": []}
    for step in range(1, 5):
        x, y = rank_batch(rank, step, 16)
        opt.zero_grad()
        try:
            nn.functional.cross_entropy(model(x), y).backward()
            out["errors"].append(None)
        except DataError as exc:
            out["errors"].append(str(exc))
        opt.step()
        out["decided"].append(watch.decision.step if watch.decision is not None else 0)
    return out


def _unused(rank: int) -> dict:
    model = _LeavesOut(*_model())
    for i in (0, 2, 4):
        fully_shard(model[i])
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    watch = fully_shard_monitor(model, Monitor(window=WINDOW, action="skip", timeout=TIMEOUT)).attach(opt)
    out: dict = {"errors": [], "decided": [], "named": []}
    for step in range(1, STEPS + 1):
        if step == UNUSED[1]:
            model[2].set_reduce_scatter_unused_params(True)
        x, y = rank_batch(rank, step, 16)
        model.leave_out = step in UNUSED
        logits = model(x)
        factor = float("nan") if rank == BAD_RANK and step == UNUSED_NAN else 1.0
        opt.zero_grad()
        try:
            (nn.functional.cross_entropy(logits, y) * factor).backward()
            err = None
        except DataError as exc:
            err = str(exc)
        if err is None:
            opt.step()
        out["errors"].append(err)
        out["decided"].append(watch.decision.step if watch.decision is not None else 0)
        out["named"].append(list(watch.decision.ranks) if watch.decision is not None else [])
    out["finite"] = bool(torch.isfinite(_flat(model)).all())
    return out


def _accumulate(rank: int, sync_each: bool, micro: int = 2, skip_step: int | None = None) -> dict:
    """``micro`` micro-batches per optimizer step (skip) for 4 steps, rank BAD_RANK's first of step 3
    ×1000: each reduced (``sync_each``), or all but the last under ``set_requires_gradient_sync(False)``;
    no ``optimizer.step()`` at ``skip_step`` (a GradScaler's non-finite step). Rank 0 records the
    "decided twice" warnings (until 2026-12-08 never given under FSDP2 with 2 micro-batches, where each
    micro-batch is a decision, and skip acts on the last one's only)."""
    import warnings

    model = _model()
    for i in (0, 2, 4):
        fully_shard(model[i])
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    watch = fully_shard_monitor(model, Monitor(window=3, action="skip", timeout=TIMEOUT)).attach(opt)
    decisions = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(1, 5):
            opt.zero_grad()
            for m in range(micro):
                model.set_requires_gradient_sync(sync_each or m == micro - 1)
                x, y = rank_batch(rank, micro * step + m, 16)
                scale = 1000.0 if (rank, step, m) == (BAD_RANK, 3, 0) else 1.0
                (scale * nn.functional.cross_entropy(model(x), y)).backward()
                decisions.append(watch.decision.step if watch.decision is not None else 0)
            if step != skip_step:
                opt.step()
    said = [str(w.message) for w in caught if "one gradient tensor" in str(w.message)]
    return {"decisions": decisions, "warnings": said}


RUNS = {
    "plain": dict(kind="none"),
    "log": dict(kind="none", action="log"),
    "scale": dict(kind="scale", action="log"),
    "flip": dict(kind="flip", action="log", size=1024),
    "skip": dict(kind="nan", action="skip"),
    "raise": dict(kind="nan", action="raise"),
}


def main(out: str) -> None:
    argv = [sys.executable, "-m", "tests.monitor_fsdp_ranks", out]
    with process_group(WORLD, argv, timeout=TIMEOUT) as (rank, _):
        runs = {name: _run(rank, **args) for name, args in RUNS.items()}
        every: list = [None] * WORLD
        dist.all_gather_object(every, _unused(rank))  # the group's timeout: TIMEOUT
        runs["unused"] = {"ranks": every}
        every = [None] * WORLD
        dist.all_gather_object(every, _reentrant(rank))
        runs["reentrant"] = {"ranks": every}
        runs["accumulate"] = _accumulate(rank, sync_each=True)
        runs["accumulate_no_sync"] = _accumulate(rank, sync_each=False)
        runs["skipped_step"] = _accumulate(rank, sync_each=True, micro=1, skip_step=2)
        if rank == 0:
            doc = {"world": WORLD, "bad_rank": BAD_RANK, "bad_step": BAD_STEP, "runs": runs}
            with open(out, "w") as fh:
                json.dump(doc, fh)


if __name__ == "__main__":
    exit_after(main, sys.argv[1])
