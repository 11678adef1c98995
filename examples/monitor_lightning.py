"""naig's monitor in a Lightning run: one callback, ``Trainer(callbacks=[MonitorCallback(monitor)])``.

``naig.monitor.lightning.MonitorCallback`` registers the monitor's DDP communication hook on the
strategy's DDP model (CPU and CUDA alike), attaches the optimizer (``skip`` / ``raise`` before
Lightning's ``optimizer.step``), logs to the Trainer's loggers and keeps the detector state in
Lightning's checkpoints. The LightningModule is the user's own, untouched by the monitor.

A small MLP on random 8-feature, 4-class data; each rank gets its own shard (Lightning's
``DistributedSampler``). At step ``--bad-step`` rank ``--bad-rank`` corrupts its gradient
with ``--fault``, a kind of ``naig.faults`` (``scale:1000`` the default, ``nan:1`` one NaN entry,
``signflip:1`` the sign), through a tensor hook on every parameter, i.e. before DDP's bucket sees
it, as a faulty device would. Rank 0 writes the
monitor's JSONL (``OUT/monitor.jsonl``; ``naig monitor report OUT/monitor.jsonl`` reads it) and,
with ``--tensorboard``, TensorBoard scalars; every rank writes the ranks it saw flagged per step
(``OUT/ranks/rank{k}.json``) so that one can check they agree; rank 0 saves the final
parameters (``OUT/params.pt``).

On CPU (gloo; Lightning starts the other ranks):

    python examples/monitor_lightning.py OUT --devices 3 --steps 30 --bad-step 24
    naig monitor report OUT/monitor.jsonl

That ``log`` leaves training bit-identical to the fit without the callback is tested in
tests/test_monitor_lightning.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from naig.distributed.launch import RENDEZVOUS_SECONDS
from naig.errors import UsageError, run_main
from naig.faults import corrupted, parse_kind
from naig.monitor import Monitor
from naig.monitor.lightning import MonitorCallback
from naig.monitor.records import JsonlRecords, Records, TensorBoardRecords
from naig.threads import DEFAULT_THREADS, check_threads

TIMEOUT = 30.0  # seconds, each of the monitor's gathers (30 at most)
# Lightning's group: its timeout also bounds the start-up rendezvous, which on a loaded machine
# (3 processes importing torch and Lightning on 2 cores) took longer than 30 s
GROUP_TIMEOUT = RENDEZVOUS_SECONDS


def _in(value: int, low: int, high: int | None, option: str, why: str) -> None:
    """Refuse ``option value`` outside [low, high] (no upper bound: None) in one line (``UsageError``)."""
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        raise UsageError(f"{option} {value}: must be {bound} ({why})")


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path, help="a directory for the records (created if missing)")
    p.add_argument("--devices", type=int, default=3, help="CPU processes (ranks)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=16, help="examples per rank per step")
    p.add_argument("--bad-rank", type=int, default=2)
    p.add_argument("--bad-step", type=int, default=24, help="1-based; after the detectors' window fills")
    p.add_argument("--fault", default="scale:1000", metavar="KIND[:ARG]",
                   help="a kind of naig.faults (nan:1, signflip:1, bitflip32:30, ...), or none")
    p.add_argument("--action", choices=("log", "warn", "skip", "raise"), default="warn")
    p.add_argument("--window", type=int, default=16, help="the detectors' individual history")
    p.add_argument("--tensorboard", type=Path, default=None, help="also write TensorBoard scalars here")
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                   help="torch CPU threads per rank (default 1: a model this small only loses time to more)")
    args = p.parse_args(argv)
    torch.set_num_threads(check_threads(args.threads, "--threads"))
    _in(args.devices, 1, None, "--devices", "CPU processes")
    _in(args.steps, 1, None, "--steps", "training steps")
    args.fault = None if args.fault == "none" else parse_kind(args.fault, field="--fault")
    if args.fault is not None:
        _in(args.bad_rank, 0, args.devices - 1, "--bad-rank", f"a rank of --devices {args.devices}")
        _in(args.bad_step, 1, args.steps, "--bad-step", f"a step of --steps {args.steps}")
    jsonl = args.out / "monitor.jsonl"  # checked before Lightning starts the other ranks (they run this too)
    if "LOCAL_RANK" not in os.environ and jsonl.exists() and jsonl.stat().st_size:
        raise UsageError(f"{jsonl} exists: pass another folder, or remove it")
    return args


class Net(L.LightningModule):
    """An MLP whose rank ``bad_rank`` corrupts its gradient at step ``bad_step``."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
        self.args = args

    def on_fit_start(self) -> None:
        self._generator = torch.Generator().manual_seed(self.global_rank)  # the fault's draws
        for p in self.parameters():
            p.register_hook(self._fault)  # runs before the gradient reaches DDP's bucket

    def _fault(self, grad: torch.Tensor) -> torch.Tensor:
        a = self.args
        if a.fault is None or self.global_rank != a.bad_rank or self.global_step + 1 != a.bad_step:
            return grad
        return corrupted(grad, *a.fault, self._generator)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _data(args: argparse.Namespace) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    n = args.steps * args.batch_size * args.devices
    x = torch.randn(n, 8, generator=g)
    y = (x[:, :4].sum(1) > 0).long() + 2 * (x[:, 4:].sum(1) > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True,
                      generator=torch.Generator().manual_seed(1))


def main(argv: list[str]) -> None:
    args = _args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")  # Lightning's DataLoader advice
    torch.manual_seed(0)
    seen: list[list[int]] = []
    monitor = Monitor(action=args.action, window=args.window, timeout=TIMEOUT,
                      callback=lambda sig, d: seen.append(list(d.ranks)))
    writers = [JsonlRecords(args.out / "monitor.jsonl")]
    if args.tensorboard is not None:
        writers.append(TensorBoardRecords(args.tensorboard, per_rank=True))
    records = Records(*writers)
    records.attach(monitor)  # rank 0 writes; the other ranks' records do nothing
    model = Net(args)
    strategy = DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=GROUP_TIMEOUT))
    trainer = L.Trainer(accelerator="cpu", devices=args.devices, strategy=strategy, max_steps=args.steps,
                        max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[MonitorCallback(monitor)])
    trainer.fit(model, _data(args))
    records.close()
    rank = trainer.global_rank
    (args.out / "ranks").mkdir(exist_ok=True)
    (args.out / "ranks" / f"rank{rank}.json").write_text(json.dumps(
        {"rank": rank, "flagged": seen, "hosts": list(monitor.hosts)}))
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out / "params.pt")
        flagged = {i + 1: r for i, r in enumerate(seen) if r}
        print(f"{args.devices} ranks, {args.steps} steps; flagged steps: {flagged or 'none'}")


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
