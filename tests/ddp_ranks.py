"""Ranks for tests/test_distributed_ddp.py: DDP with and without ``NaigCommHook`` on real processes.

``python -m tests.ddp_ranks OUT.json`` makes this process rank 0 of 3 and starts ranks 1
and 2 (the same module); every rank trains a tiny GPT on its own random bytes

1. with plain DDP, 2. with the hook (route=False), 3. one step with the hook (route=True),
4. one step with route=True where rank 2's gradient is NaN,

and rank 0 writes what the tests compare: whether 1 and 2 end bit-identical on every rank,
the hook's records, every rank's own bucket gradients (as lists) and the routed result.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from naig.distributed.ddp import HookRecord, NaigCommHook
from naig.distributed.launch import process_group
from naig.simulate.model import GPT, GPTConfig, lm_loss

CFG = GPTConfig(layers=1, heads=2, d_model=32, context=16)
STEPS, WORLD, BUCKET_MB = 3, 3, 0.02  # 0.02 MB buckets: several buckets per step


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randint(0, 256, (4, CFG.context + 1), generator=g)
    return x[:, :-1], x[:, 1:]


def _local_grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, nan: bool) -> dict:
    """This rank's own gradient at the model's current parameters (no DDP), by name."""
    twin = copy.deepcopy(model)
    loss = lm_loss(twin(x), y)
    (loss * float("nan") if nan else loss).backward()
    return {n: p.grad.detach().clone() for n, p in twin.named_parameters()}


def _train(rank: int, make_hook: Callable[[torch.nn.Module], NaigCommHook] | None, steps: int,
           nan_rank: int | None = None) -> tuple:
    model = GPT(CFG, generator=torch.Generator().manual_seed(0))
    ddp = DistributedDataParallel(model, bucket_cap_mb=BUCKET_MB)
    if make_hook is not None:
        make_hook(model).register(ddp)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    local = []
    for step in range(steps):
        x, y = _batch(rank, step)
        nan = rank == nan_rank
        local.append(_local_grads(model, x, y, nan))
        opt.zero_grad()
        loss = lm_loss(ddp(x), y)
        (loss * float("nan") if nan else loss).backward()
        synced = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
    return model, local, synced


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _gather_grads(local: list[dict]) -> list[list[dict]]:
    """Every rank's per-step gradients, on rank 0 (lists, for JSON)."""
    mine = [{n: g.tolist() for n, g in step.items()} for step in local]
    out: list = [None] * WORLD
    dist.all_gather_object(out, mine)
    return out


def _record(rec: HookRecord) -> dict:
    return {"step": rec.step, "bucket": rec.bucket, "energies": list(rec.energies), "pi": list(rec.pi),
            "cos": None if rec.cos is None else list(rec.cos), "beta": rec.beta,
            "parameters": list(rec.parameters)}


def main(out: str) -> None:
    with process_group(WORLD, [sys.executable, "-m", "tests.ddp_ranks", out], timeout=30.0) as (rank, world):
        plain, _, _ = _train(rank, None, STEPS)
        records: list[HookRecord] = []
        hooked, local, _ = _train(rank, lambda m: NaigCommHook(m, callback=records.append), STEPS)
        same = torch.equal(_flat(plain), _flat(hooked))
        flags: list = [None] * world
        dist.all_gather_object(flags, same)
        grads = _gather_grads(local)
        every: list = [None] * world  # every rank's (energies, pi) records: identical?
        dist.all_gather_object(every, [(r.energies, r.pi, r.cos) for r in records])
        routed_records: list[HookRecord] = []
        _, routed_local, routed = _train(rank, lambda m: NaigCommHook(m, route=True,
                                                                      callback=routed_records.append), 1)
        routed_grads = _gather_grads(routed_local)
        nan_records: list[HookRecord] = []
        def nan_hook(m: torch.nn.Module) -> NaigCommHook:
            return NaigCommHook(m, route=True, callback=nan_records.append)

        nan_model, _, nan_synced = _train(rank, nan_hook, 1, nan_rank=2)
        if rank == 0:
            doc = {"bit_identical": flags, "records": [_record(r) for r in records], "grads": grads,
                   "same_on_every_rank": all(e == every[0] for e in every),
                   "routed_records": [_record(r) for r in routed_records], "routed_grads": routed_grads,
                   "routed": {n: g.tolist() for n, g in routed.items()},
                   "nan_records": [_record(r) for r in nan_records],
                   "nan_finite": bool(torch.isfinite(_flat(nan_model)).all()),
                   "nan_synced_finite": all(bool(torch.isfinite(g).all()) for g in nan_synced.values())}
            with open(out, "w") as fh:
                json.dump(doc, fh)


if __name__ == "__main__":
    main(sys.argv[1])
