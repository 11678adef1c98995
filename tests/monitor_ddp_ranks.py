"""Ranks for tests/test_monitor_ddp.py: ``MonitorHook`` inside DistributedDataParallel on real processes.

``python -m tests.monitor_ddp_ranks OUT.json`` makes this process rank 0 of 3 and starts ranks 1
and 2 (the same module). Every rank trains a small MLP (8 → 64 → 64 → 4, small DDP buckets: several
buckets per step) with Adam on its own random batches for ``STEPS`` steps, in these runs:

- ``plain``: DDP without a hook; ``log``: the hook (per bucket, sketch estimates);
  ``log_exact``: the hook (one gather per step, exact dots); both must end bit-identical to plain;
- ``flip``: at step ``BAD_STEP`` rank ``BAD_RANK``'s gradient has its sign flipped (a tensor hook
  on the parameters, before DDP sees it), with 1024 examples per rank so that the ranks agree;
- ``skip`` / ``raise``: a NaN in one entry of its first parameter, with that action;
- ``exclude`` / ``warn``: its gradient ×1000, with that action;
- ``desync`` (and ``desync_skip``, ``desync_exclude``: with those actions): after step
  ``DESYNC_STEP``'s update rank ``BAD_RANK``'s weights are perturbed by 1% (θ ← θ·(1 + 0.01 z)),
  with the replica check every ``WEIGHTS_EVERY`` steps (1, 5, 9).

- ``accumulate`` / ``accumulate_no_sync``: ``MICRO`` micro-batches per optimizer step, action
  ``skip``, rank ``BAD_RANK``'s first micro-batch of step ``BAD_STEP`` ×1000; every micro-batch
  reduced (``MICRO`` decisions per step: the last micro-batch's gradient, the all-reduced earlier
  ones plus its own, looks like the others'), or all but the last under ``no_sync()`` (one).

The detectors' window is ``WINDOW`` (the individual scores start at step WINDOW + 1). Every
collective of the script waits at most ``TIMEOUT`` seconds. Rank 0 writes what each rank saw.
"""

from __future__ import annotations

import contextlib
import json
import sys
import warnings

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from naig.distributed.launch import process_group
from naig.monitor import SIGNALS, BadRankError, Monitor, MonitorHook
from tests.monitor_rank_tools import exit_after, gather_rows, rank_batch

WORLD, BAD_RANK, BAD_STEP, STEPS, WINDOW, TIMEOUT = 3, 2, 10, 10, 8, 30.0
DESYNC_STEP, WEIGHTS_EVERY = 5, 4
BUCKET_MB = 0.005  # 5 kB buckets: 4 or 5 buckets per step
MICRO = 3  # micro-batches per optimizer step (accumulate_*)


def _rows(x: torch.Tensor) -> list[list]:
    return gather_rows(x, WORLD, TIMEOUT)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))


def _flat(ts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in ts])


def _run(rank: int, kind: str, action: str | None = None, size: int = 16, monitor_args: dict | None = None,
         **hook_args: object) -> dict:
    model = _model()
    ddp = DistributedDataParallel(model, bucket_cap_mb=BUCKET_MB)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-2)
    records: list = []
    hook = None
    if action is not None:
        extra = {"signals": SIGNALS} if kind == "flip" else {}  # a one-step flip: cos, not a default
        mon = Monitor(window=WINDOW, action=action, timeout=TIMEOUT,
                      callback=lambda s, d: records.append((s, d)), **extra, **(monitor_args or {}))
        hook = MonitorHook(model, monitor=mon, **hook_args).register(ddp)
        hook.attach(opt)
    local: dict[str, torch.Tensor] = {}
    state = {"step": 0}

    def grad_hook(name: str, index: int):
        def fn(g: torch.Tensor) -> torch.Tensor:
            if rank == BAD_RANK and state["step"] == BAD_STEP:
                g = g.clone()
                if kind == "nan" and index == 0:
                    g.view(-1)[3] = float("nan")
                elif kind == "scale":
                    g = g * 1000.0
                elif kind == "flip":
                    g = -g
            local[name] = g.detach().clone()
            return g
        return fn

    for i, (n, p) in enumerate(model.named_parameters()):
        p.register_hook(grad_hook(n, i))
    out: dict = {"flagged": [], "describe": [], "grads": [], "payloads": [], "signals": [], "where": []}
    for step in range(1, STEPS + 1):
        state["step"] = step
        x, y = rank_batch(rank, step, size)
        opt.zero_grad()
        err = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            nn.functional.cross_entropy(ddp(x), y).backward()
            before = _flat(list(model.parameters())).clone()
            synced = _flat([p.grad for p in model.parameters()]).clone()
            try:
                opt.step()
            except BadRankError as exc:
                err = str(exc)
        if kind == "desync" and rank == BAD_RANK and step == DESYNC_STEP:
            gen = torch.Generator().manual_seed(7)
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(1 + 0.01 * torch.randn(p.shape, generator=gen))
        after = _flat(list(model.parameters()))
        out["grads"].append(_rows(_flat([local[n] for n, _ in model.named_parameters()])))
        if hook is not None:
            mask = torch.zeros(WORLD)
            mask[list(hook.decision.ranks)] = 1.0
            out["flagged"].append(_rows(mask))
            out["describe"].append(hook.decision.describe())
            out["payloads"].append(hook.monitor.gathered.tolist())
            out["signals"].append(hook.monitor.signals.to_dict())
            out["where"].append({str(k): v for k, v in hook.decision.where.items()})
            out.setdefault("weight_flags", []).append([[f.rank, f.since] for f in hook.decision.flags
                                                       if f.signal == "weights"])
            out.setdefault("flags", []).append([[f.rank, f.signal] for f in hook.decision.flags])
        if step == BAD_STEP:
            out["unchanged"] = _rows(torch.tensor([float(torch.equal(before, after))]))
            out["adam_steps"] = _rows(torch.tensor([float(max(
                int(s["step"]) for s in opt.state.values()))]))
            out["error"] = _rows(torch.tensor([float(err is not None)]))
            out["error_text"] = err
            out["warnings"] = [str(w.message) for w in caught if w.category is UserWarning]
            out["synced"] = synced.tolist()
    out["params"] = _flat(list(model.parameters())).tolist()
    out["names"] = [n for n, _ in model.named_parameters()]
    out["shapes"] = {n: list(p.shape) for n, p in model.named_parameters()}
    if hook is not None:
        out["hosts"] = list(hook.monitor.hosts)
        out["buckets"] = [list(p.names) for p in hook.parts]
        out["extra_bytes"] = hook.extra_bytes
        out["exact"] = sorted(hook.monitor.signals.exact)
        out["n_records"] = len(records)
    return out


def _accumulate(rank: int, no_sync: bool) -> dict:
    """MICRO micro-batches per optimizer step (skip); rank BAD_RANK's first of step BAD_STEP ×1000."""
    model = _model()
    ddp = DistributedDataParallel(model, bucket_cap_mb=BUCKET_MB)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-2)
    hook = MonitorHook(model, monitor=Monitor(window=WINDOW, action="skip", timeout=TIMEOUT)).register(ddp)
    hook.attach(opt)
    out: dict = {"decisions": [], "flagged": []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(1, STEPS + 1):
            opt.zero_grad()
            for micro in range(MICRO):
                x, y = rank_batch(rank, MICRO * step + micro, 16)
                scale = 1000.0 if (rank, step, micro) == (BAD_RANK, BAD_STEP, 0) else 1.0
                quiet = ddp.no_sync() if no_sync and micro < MICRO - 1 else contextlib.nullcontext()
                with quiet:
                    (scale * nn.functional.cross_entropy(ddp(x), y)).backward()
                d = hook.decision  # under no_sync() the previous step's until the last micro-batch
                out["decisions"].append(d.step if d is not None else 0)
                out["flagged"].append(list(d.ranks) if d is not None else [])
            before = _flat(list(model.parameters())).clone()
            opt.step()
            if step == BAD_STEP:
                same = torch.equal(before, _flat(list(model.parameters())))
                out["unchanged"] = _rows(torch.tensor([float(same)]))
    out["warnings"] = [str(w.message) for w in caught if w.category is UserWarning
                       and "one gradient tensor" in str(w.message)]
    return out


RUNS = {
    "plain": dict(kind="none"),
    "log": dict(kind="none", action="log"),
    "log_exact": dict(kind="none", action="log", exact=True, per_bucket=False),
    "flip": dict(kind="flip", action="log", size=1024),
    "skip": dict(kind="nan", action="skip"),
    "raise": dict(kind="nan", action="raise"),
    "exclude": dict(kind="scale", action="exclude"),
    "warn": dict(kind="scale", action="warn"),
    "desync": dict(kind="desync", action="log", monitor_args={"weights_every": WEIGHTS_EVERY}),
    "desync_skip": dict(kind="desync", action="skip", monitor_args={"weights_every": WEIGHTS_EVERY}),
    "desync_exclude": dict(kind="desync", action="exclude", monitor_args={"weights_every": WEIGHTS_EVERY}),
}


def _setup_mismatch(rank: int, **odd: bool) -> dict:
    """Rank 1's hook with ``odd`` (per_bucket=False, or exact=True), the others' with the defaults: the
    first step's backward raises the same one-line error on every rank (until 2026-12-08 gloo aborted
    the processes on the gathers of mismatched sizes, or the ranks waited on each other)."""
    model = _model()
    ddp = DistributedDataParallel(model, bucket_cap_mb=BUCKET_MB)
    MonitorHook(model, Monitor(window=WINDOW, timeout=TIMEOUT), **(odd if rank == 1 else {})).register(ddp)
    x, y = rank_batch(rank, 1, 16)
    try:
        nn.functional.cross_entropy(ddp(x), y).backward()
    except Exception as exc:  # noqa: BLE001  (what reaches the training loop, whatever DDP wraps it in)
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1]}"
    else:
        error = None
    out: list = [None] * WORLD
    torch.distributed.all_gather_object(out, error)
    return {"errors": out}


def main(out: str) -> None:
    argv = [sys.executable, "-m", "tests.monitor_ddp_ranks", out]
    with process_group(WORLD, argv, timeout=TIMEOUT) as (rank, _):
        runs = {name: _run(rank, **args) for name, args in RUNS.items()}
        runs.update(accumulate=_accumulate(rank, no_sync=False))
        runs.update(accumulate_no_sync=_accumulate(rank, no_sync=True))
        runs.update(per_bucket_mismatch=_setup_mismatch(rank, per_bucket=False),
                    exact_mismatch=_setup_mismatch(rank, exact=True))
        if rank == 0:
            doc = {"world": WORLD, "bad_rank": BAD_RANK, "bad_step": BAD_STEP, "steps": STEPS, "micro": MICRO,
                   "window": WINDOW, "runs": runs, "desync_step": DESYNC_STEP, "weights_every": WEIGHTS_EVERY}
            with open(out, "w") as fh:
                json.dump(doc, fh)


if __name__ == "__main__":
    exit_after(main, sys.argv[1])
