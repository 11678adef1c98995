"""Ranks for tests/test_monitor_compose.py: ``MonitorHook(comm_hook=...)`` wrapping torch's own DDP
communication hooks, and ``detach()`` of the DDP and FSDP2 integrations, on 3 real gloo processes.

``python -m tests.monitor_compose_ranks OUT.json`` makes this process rank 0 of 3 and starts ranks 1
and 2. Every rank trains a small MLP (8 → 64 → 64 → 4, 5 kB DDP buckets: several per step) with
Adam on its own batches for ``STEPS`` steps (PowerSGD: one bucket, see ``_run``), in these runs:

- ``bf16`` / ``powersgd``: the inner hook alone (``bf16_compress_hook``; ``powerSGD_hook`` of rank
  1, compressing from step 2); ``bf16_log`` / ``powersgd_log``: the monitor (``log``) wrapping it;
  each pair must end bit-identical (the hook alone is registered through a lambda: DDP refuses a
  function named ``bf16_compress_hook`` without NCCL, although gloo reduces bfloat16);
- ``bf16_skip`` / ``powersgd_raise``: at step ``BAD_STEP`` (the last) rank ``BAD_RANK``'s first
  parameter gets one NaN entry (a tensor hook, before DDP sees it), with that action;
- ``detach``: ``raise``, detached after step ``DETACH_STEP``; a NaN at ``BAD_STEP`` then
  raises nothing, the monitor counts no further step, and the parameters end bit-identical to
  ``plain`` up to the NaN step (compared through ``params_before_bad``);
- ``fsdp_detach``: the same with ``fully_shard_monitor`` (each Linear and the root sharded; the
  bad rank's loss × NaN: FSDP2 accumulates sharded gradients past the parameters' tensor hooks).

Every collective of the script waits at most ``TIMEOUT`` seconds. Rank 0 writes what each rank saw.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from naig.distributed.launch import process_group
from naig.monitor import BadRankError, Monitor, MonitorHook
from naig.monitor.fsdp import fully_shard_monitor
from tests.monitor_rank_tools import exit_after, gather_rows, rank_batch

WORLD, BAD_RANK, BAD_STEP, STEPS, DETACH_STEP, WINDOW, TIMEOUT = 3, 2, 6, 6, 3, 3, 30.0
BUCKET_MB = 0.005


def _rows(x: torch.Tensor) -> list[list]:
    return gather_rows(x, WORLD, TIMEOUT)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1)
                      for p in model.parameters()])


def _inner(name: str | None) -> tuple[Callable | None, object]:
    if name == "bf16":
        return default_hooks.bf16_compress_hook, None
    if name == "powersgd":
        return powerSGD_hook.powerSGD_hook, powerSGD_hook.PowerSGDState(
            None, matrix_approximation_rank=1, start_powerSGD_iter=2, min_compression_rate=0.5, random_seed=0)
    return None, None


def _nan_hook(rank: int, state: dict) -> Callable[[torch.Tensor], torch.Tensor]:
    def fn(g: torch.Tensor) -> torch.Tensor:
        if state["nan"] and rank == BAD_RANK and state["step"] == BAD_STEP:
            g = g.clone()
            g.view(-1)[3] = float("nan")
        return g
    return fn


def _run(rank: int, inner: str | None = None, action: str | None = None, nan: bool = False,
         detach: bool = False, fsdp: bool = False) -> dict:
    model = _model()
    comm_hook, comm_state = _inner(inner)
    if fsdp:
        for i in (0, 2, 4):
            fully_shard(model[i])
        fully_shard(model)
        net = model
    else:
        # PowerSGD: one bucket. With several, powerSGD_hook alone hangs on gloo here (torch 2.13: its
        # callbacks start the next collectives from gloo's threads, in no fixed order across ranks)
        net = DistributedDataParallel(model, bucket_cap_mb=25.0 if inner == "powersgd" else BUCKET_MB)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    watch = None
    if action is not None:
        mon = Monitor(window=WINDOW, action=action, timeout=TIMEOUT)
        watch = fully_shard_monitor(model, mon) if fsdp else \
            MonitorHook(model, mon, comm_hook=comm_hook, comm_state=comm_state).register(net)
        watch.attach(opt)
    elif comm_hook is not None:  # by another name: DDP refuses "bf16_compress_hook" by name without NCCL
        net.register_comm_hook(comm_state, lambda s, bucket: comm_hook(s, bucket))
    state = {"step": 0, "nan": nan}
    model[0].weight.register_hook(_nan_hook(rank, state))
    out: dict = {"flagged": [], "describe": []}
    for step in range(1, STEPS + 1):
        state["step"] = step
        x, y = rank_batch(rank, step, 16)
        opt.zero_grad()
        bad = fsdp and nan and rank == BAD_RANK and step == BAD_STEP  # FSDP2 bypasses tensor hooks
        (nn.functional.cross_entropy(net(x), y) * (float("nan") if bad else 1.0)).backward()
        before = _flat(model).clone()
        err = None
        try:
            opt.step()
        except BadRankError as exc:
            err = str(exc)
        if watch is not None and not watch.detached:
            mask = torch.zeros(WORLD)
            mask[list(watch.decision.ranks)] = 1.0
            out["flagged"].append(_rows(mask))
            out["describe"].append(watch.decision.describe())
        if detach and step == DETACH_STEP:
            watch.detach()
        if step == BAD_STEP:
            out["params_before_bad"] = before.tolist()
            out["unchanged"] = _rows(torch.tensor([float(torch.equal(before, _flat(model)))]))
            out["error"] = _rows(torch.tensor([float(err is not None)]))
            out["error_text"] = err
            out["finite"] = _rows(torch.tensor([float(torch.isfinite(_flat(model)).all())]))
    out["params"] = _flat(model).tolist()
    if watch is not None:
        out["hosts"] = list(watch.monitor.hosts)
        out["monitor_steps"] = watch.step
    return out


RUNS = {
    "plain": dict(),
    "bf16": dict(inner="bf16"),
    "bf16_log": dict(inner="bf16", action="log"),
    "powersgd": dict(inner="powersgd"),
    "powersgd_log": dict(inner="powersgd", action="log"),
    "bf16_skip": dict(inner="bf16", action="skip", nan=True),
    "powersgd_raise": dict(inner="powersgd", action="raise", nan=True),
    "detach": dict(action="raise", nan=True, detach=True),
    "fsdp_plain": dict(fsdp=True),
    "fsdp_detach": dict(action="raise", nan=True, detach=True, fsdp=True),
}


def main(out: str) -> None:
    argv = [sys.executable, "-m", "tests.monitor_compose_ranks", out]
    with process_group(WORLD, argv, timeout=TIMEOUT) as (rank, _):
        only = os.environ.get("NAIG_RUNS", "").split(",")
        runs = {name: _run(rank, **args) for name, args in RUNS.items() if only == [""] or name in only}
        if rank == 0:
            doc = {"world": WORLD, "bad_rank": BAD_RANK, "bad_step": BAD_STEP, "detach_step": DETACH_STEP,
                   "runs": runs}
            with open(out, "w") as fh:
                json.dump(doc, fh)


if __name__ == "__main__":
    exit_after(main, sys.argv[1])
