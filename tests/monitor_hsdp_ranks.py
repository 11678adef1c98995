"""Ranks for tests/test_monitor_fsdp.py's HSDP test: ``fully_shard`` on a 2 × 2 (replicate × shard) mesh.

``python -m tests.monitor_hsdp_ranks OUT.json`` makes this process rank 0 of 4 and starts ranks
1..3. Each rank trains a small MLP (``fully_shard`` on each Linear and the root, mesh
``("replicate", "shard")`` of 2 × 2) for ``STEPS`` steps, without and with the monitor (whose
all-gather runs over every rank: both replicas); in the monitored run rank ``BAD_RANK`` multiplies
its loss by NaN at the last step, whose update neither run applies. Each rank also records its
own gradient from an unsharded twin. Every collective of the script waits at most ``TIMEOUT`` seconds.
"""

from __future__ import annotations

import json
import sys

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from naig.distributed.launch import process_group
from naig.monitor import Monitor
from naig.monitor.fsdp import fully_shard_monitor
from tests.monitor_fsdp_ranks import full_state_dict
from tests.monitor_rank_tools import exit_after, gather_rows, rank_batch

WORLD, BAD_RANK, STEPS, TIMEOUT = 4, 3, 6, 30.0


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 5))


def _run(rank: int, monitored: bool) -> dict:
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    model = _model()
    for i in (0, 2):
        fully_shard(model[i], mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    watch = fully_shard_monitor(model, Monitor(window=3, timeout=TIMEOUT)) if monitored else None
    twin = _model()
    out: dict = {"flagged": [], "grads": [], "payloads": []}
    for step in range(1, STEPS + 1):
        x, y = rank_batch(rank, step, 16)
        factor = float("nan") if monitored and rank == BAD_RANK and step == STEPS else 1.0
        twin.load_state_dict(full_state_dict(model))
        twin.zero_grad()
        (nn.functional.cross_entropy(twin(x), y) * factor).backward()
        grad = torch.cat([p.grad.reshape(-1) for p in twin.parameters()])
        out["grads"].append(gather_rows(grad, WORLD, TIMEOUT))
        opt.zero_grad()
        (nn.functional.cross_entropy(model(x), y) * factor).backward()
        if step < STEPS:  # the last step's (NaN) gradient is not applied, in either run
            opt.step()
        if watch is not None:
            mask = torch.zeros(WORLD)
            mask[list(watch.decision.ranks)] = 1.0
            out["flagged"].append(gather_rows(mask, WORLD, TIMEOUT))
            out["payloads"].append(watch.monitor.gathered.tolist())
            out["describe"] = watch.decision.describe()
    out["params"] = torch.cat([v.reshape(-1) for v in full_state_dict(model).values()]).tolist()
    out["shapes"] = {n: list(p.shape) for n, p in twin.named_parameters()}
    return out


def main(out: str) -> None:
    argv = [sys.executable, "-m", "tests.monitor_hsdp_ranks", out]
    with process_group(WORLD, argv, timeout=TIMEOUT) as (rank, _):
        runs = {"plain": _run(rank, False), "log": _run(rank, True)}
        if rank == 0:
            with open(out, "w") as fh:
                json.dump({"world": WORLD, "bad_rank": BAD_RANK, "steps": STEPS, "runs": runs}, fh)


if __name__ == "__main__":
    exit_after(main, sys.argv[1])
