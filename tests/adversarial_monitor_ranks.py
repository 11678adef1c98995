"""Ranks for tests/test_adversarial_monitor.py: the monitor on 3 real gloo processes under broken disks,
ranks that disagree and DTensor gradients (issue 32).

``python -m tests.adversarial_monitor_ranks OUT.json [DIR=PATH ...]`` makes this process rank 0 of 3
and starts ranks 1 and 2. Each run trains a tiny MLP with ``Monitor.observe`` and its own
all-reduce, every rank recording the warnings it saw:

- ``full``: ``JsonlRecords("/dev/full")`` (a real full device: every write is ENOSPC);
- ``ddp_full``: the same under DDP with ``MonitorHook`` (the count travels in the hook's payload);
- ``proc``: a record file under ``/proc`` (no file can be made there);
- ``fills`` (when the test mounted a 64 KiB tmpfs, ``fills=DIR``): a disk that fills mid-run;
- ``readonly`` (a read-only tmpfs, ``readonly=DIR``);
- ``layout``: rank 2 passes one more parameter than ranks 0 and 1;
- ``dtensor``: the gradients as DTensors of a 3-rank CPU mesh, replicated, then sharded, then
  sharded with ``full_dtensor=True``.

Every collective waits at most ``TIMEOUT`` seconds. Each rank writes ``OUT.rank{r}.json``; rank 0,
once its children are gone, merges them into ``OUT``.
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
from naig.errors import DataError, UsageError
from naig.monitor import Monitor, MonitorHook
from naig.monitor.records import JsonlRecords
from tests.monitor_rank_tools import exit_after, rank_batch

WORLD, TIMEOUT, STEPS = 3, 30.0, 40
PROC = "/proc/naig-adversarial.jsonl"  # no file can be made under /proc


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def _train(rank: int, path: str | None, steps: int = STEPS) -> dict:
    """Train ``steps`` steps with a JSONL writer at ``path``; what this rank saw."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = Monitor(timeout=TIMEOUT)
    writer = JsonlRecords(path) if path is not None else None
    if writer is not None:
        writer.attach(monitor)
    done = 0
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for step in range(1, steps + 1):
            x, y = rank_batch(rank, step, 16)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            monitor.observe({n: p.grad for n, p in model.named_parameters()})
            for p in model.parameters():
                dist.all_reduce(p.grad, async_op=True).wait(timeout=timedelta(seconds=TIMEOUT))
                p.grad.div_(WORLD)
            opt.step()
            done = step
        if writer is not None:
            writer.close()
    return {"steps": done, "warnings": [str(w.message) for w in seen if "naig.monitor" in str(w.message)],
            "lost": writer.lost if writer is not None else None, "records_lost": monitor.records_lost}


def _train_ddp(rank: int, path: str) -> dict:
    """``steps`` DDP steps with ``MonitorHook`` and a JSONL writer at ``path``; what this rank saw."""
    model = _model()
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    monitor = Monitor(timeout=TIMEOUT)
    writer = JsonlRecords(path)
    writer.attach(monitor)
    hook = MonitorHook(model, monitor=monitor).register(ddp)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for step in range(1, STEPS + 1):
            x, y = rank_batch(rank, step, 16)
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
        writer.close()
    hook.detach()
    said = [str(w.message) for w in seen if "naig.monitor" in str(w.message)]
    return {"steps": hook.step, "warnings": said, "lost": writer.lost, "records_lost": monitor.records_lost}


def _layout(rank: int) -> dict:
    """Rank 2 passes one parameter more (``error``), rank 1 a gradient None (``none_error``): every rank
    must stop with the same line; a gradient None on every rank is left out (``all_none``: no error)."""
    model = _model()
    x, y = rank_batch(rank, 1, 16)
    nn.functional.cross_entropy(model(x), y).backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    first = next(iter(grads))
    cases = {"error": {**grads, **({"extra.weight": torch.ones(3)} if rank == 2 else {})},
             "none_error": {**grads, **({first: None} if rank == 1 else {})},
             "all_none": {**grads, first: None}}
    out: dict = {}
    for case, given in cases.items():
        try:
            Monitor(timeout=TIMEOUT).observe(given)
            out[case] = None
        except DataError as exc:
            out[case] = str(exc)
    return out


def _dtensor(rank: int) -> dict:
    """A DTensor gradient: replicated (monitored), sharded (refused in one line), sharded and gathered."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (WORLD,))
    g = torch.Generator().manual_seed(100 + rank)
    local = torch.randn(6, 4, generator=g)
    out: dict = {}
    rep = distribute_tensor(torch.ones(6, 4), mesh, [Replicate()])  # every rank: the same values
    mon = Monitor(timeout=TIMEOUT)
    out["replicated"] = {"ranks": list(mon.observe({"w": rep, "b": local}).ranks),
                         "sq_norm": mon.signals.sq_norm.tolist()}
    sharded = distribute_tensor(torch.arange(24.0).reshape(6, 4), mesh, [Shard(0)])
    try:
        Monitor(timeout=TIMEOUT).observe({"layer.weight": sharded})
        out["sharded"] = None
    except UsageError as exc:
        out["sharded"] = str(exc)
    mon = Monitor(timeout=TIMEOUT)
    mon.observe({"layer.weight": sharded}, full_dtensor=True)
    out["gathered_sq_norm"] = mon.signals.sq_norm.tolist()
    return out


def main(out: str, dirs: dict[str, str]) -> None:
    extra = [f"{k}={v}" for k, v in dirs.items()]
    argv = [sys.executable, "-m", "tests.adversarial_monitor_ranks", out, *extra]
    with process_group(WORLD, argv, timeout=TIMEOUT) as (rank, _):
        doc: dict = {"full": _train(rank, "/dev/full"), "proc": _train(rank, PROC, 5),
                     "ddp_full": _train_ddp(rank, "/dev/full")}
        for name in ("fills", "readonly"):
            if name in dirs:
                doc[name] = _train(rank, str(Path(dirs[name]) / "monitor.jsonl"))
        doc["layout"] = _layout(rank)
        doc["dtensor"] = _dtensor(rank)
        Path(f"{out}.rank{rank}.json").write_text(json.dumps(doc))
    if rank == 0:  # the children are gone: merge every rank's view
        ranks = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(WORLD)]
        Path(out).write_text(json.dumps({"world": WORLD, "steps": STEPS, "ranks": ranks}))


if __name__ == "__main__":
    exit_after(lambda o: main(o, dict(a.split("=", 1) for a in sys.argv[2:])), sys.argv[1])
