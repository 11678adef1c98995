"""Ranks for tests/test_monitor_lightning.py: ``naig.monitor.lightning.MonitorCallback`` in real Lightning
``Trainer.fit`` runs (``DDPStrategy``, gloo, CPU) on 3 processes.

``python -m tests.monitor_lightning_ranks OUT.json`` makes this process rank 0 of 3 and starts ranks 1
and 2 (``naig.distributed.launch.process_group``, with torchrun's environment, so Lightning takes the
processes as started outside and the group as initialised). Each rank runs several fits in turn;
every fit trains an MLP (8 → 32 → 4, Adam) for up to ``STEPS`` steps on rank ``r``'s own batch of
step ``s`` (``rank_batch``, whatever Lightning's sampler hands over), and at step ``BAD_STEP`` (the
last) rank ``BAD_RANK`` multiplies its loss by 1000:

- ``plain``: no callback; ``log``: the callback, ``log`` (its params must equal plain's);
- ``skip`` / ``raise``: that action (the last step must leave the parameters unchanged);
- ``first``: the callback (``log``), stopped after ``RESUME_STEP`` steps and checkpointed
  (``Trainer.save_checkpoint``); ``resumed``: a new Trainer and callback, ``fit(ckpt_path=...)``
  to ``STEPS``; ``fresh``: the same from a copy of the checkpoint without the callback's state;
  ``plain_first`` / ``plain_resumed``: the same stop and resume without the callback;
- ``fsdp2``: ``skip`` under ``ModelParallelStrategy`` (FSDP2: ``fully_shard`` on each linear
  layer and the module in ``configure_model``); its parameters are each rank's local shards.

Every collective outside Lightning waits at most ``TIMEOUT`` seconds (Lightning's own: the
strategy's ``timeout``). Rank 0 writes what each rank saw.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset

from naig.distributed.launch import process_group
from naig.monitor import BadRankError, Monitor
from naig.monitor.lightning import MonitorCallback
from tests.monitor_rank_tools import exit_after, gather_rows, rank_batch

WORLD, BAD_RANK, BAD_STEP, STEPS, RESUME_STEP, WINDOW, TIMEOUT = 3, 2, 12, 12, 6, 8, 30.0


class Recorder(Logger):
    """A Lightning logger that keeps what it is given (step, metrics)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, dict]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> str:
        return "0"

    def log_hyperparams(self, params: object, *args: object, **kwargs: object) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
        self.before: torch.Tensor | None = None

    def flat(self) -> torch.Tensor:
        """Every parameter (under FSDP2: this rank's shard of it), flat."""
        local = [p.to_local() if hasattr(p, "to_local") else p for p in self.parameters()]
        return torch.cat([p.detach().reshape(-1) for p in local]).clone()

    def training_step(self, batch: object, index: int) -> torch.Tensor:
        step = self.global_step + 1
        if step == BAD_STEP:
            self.before = self.flat()
        x, y = rank_batch(self.global_rank, step, 16)
        loss = nn.functional.cross_entropy(self.net(x), y)
        return loss * 1000.0 if self.global_rank == BAD_RANK and step == BAD_STEP else loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


class ShardedNet(Net):
    def configure_model(self) -> None:
        for layer in (self.net[0], self.net[2]):
            fully_shard(layer)
        fully_shard(self)


def _trainer(steps: int, callbacks: list, logger: Logger, sharded: bool = False) -> pl.Trainer:
    strategy = (ModelParallelStrategy(data_parallel_size=WORLD, tensor_parallel_size=1,
                                      timeout=timedelta(seconds=TIMEOUT)) if sharded else
                DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=TIMEOUT)))
    return pl.Trainer(accelerator="cpu", devices=WORLD, strategy=strategy, max_steps=steps,
                      logger=logger, callbacks=callbacks, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
                      num_sanity_val_steps=0)


def _loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.zeros(4 * STEPS * WORLD, 1)), batch_size=1)


def _fit(rank: int, action: str | None, steps: int = STEPS, ckpt: Path | None = None,
         save: Path | None = None, sharded: bool = False) -> dict:
    model, logger, masks, lines = ShardedNet() if sharded else Net(), Recorder(), [], []

    def seen(sig: object, d: object) -> None:
        mask = torch.zeros(WORLD)
        mask[list(d.ranks)] = 1.0
        masks.append(mask)
        lines.append(d.describe())

    cb = None if action is None else MonitorCallback(Monitor(action=action, window=WINDOW, timeout=TIMEOUT,
                                                             callback=seen))
    trainer = _trainer(steps, [cb] if cb else [], logger, sharded)
    err = None
    try:
        trainer.fit(model, _loader(), ckpt_path=ckpt)
    except BadRankError as exc:
        err = str(exc)
    if save is not None:
        trainer.save_checkpoint(save)
    out: dict = {"params": model.flat().tolist(), "error_text": err,
                 "error": gather_rows(torch.tensor([float(err is not None)]), WORLD, TIMEOUT)}
    if model.before is not None:
        out["unchanged"] = gather_rows(torch.tensor([float(torch.equal(model.before, model.flat()))]),
                                       WORLD, TIMEOUT)
    if cb is not None:
        out["flagged"] = gather_rows(torch.stack(masks), WORLD, TIMEOUT)  # (K, steps, K)
        out["describe"] = lines
        out["decision_steps"] = cb.monitor.decision.step
        out["detached"] = cb.watch.detached
        out["logged"] = [(s, {k: v for k, v in m.items() if k.startswith("naig_monitor/")})
                         for s, m in logger.rows]
        out["callback_metrics"] = sorted(k for k in trainer.callback_metrics if k.startswith("naig_monitor/"))
        out["hosts"] = list(cb.monitor.hosts)
    return out


def main(out: str) -> None:
    argv = [sys.executable, "-m", "tests.monitor_lightning_ranks", out]
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    with process_group(WORLD, argv, timeout=TIMEOUT) as (rank, _):
        os.environ.setdefault("LOCAL_RANK", str(rank))  # rank 0 too: the processes are started outside
        tmp = Path(out).parent
        ckpt, fresh = tmp / "first.ckpt", tmp / "fresh.ckpt"
        runs = {"plain": _fit(rank, None), "log": _fit(rank, "log"), "skip": _fit(rank, "skip")}
        runs["first"] = _fit(rank, "log", steps=RESUME_STEP, save=ckpt)
        if rank == 0:
            state = torch.load(ckpt, weights_only=False)
            state["callbacks"] = {}
            torch.save(state, fresh)
        gather_rows(torch.zeros(1), WORLD, TIMEOUT)  # the copy exists before any rank reads it
        runs["resumed"] = _fit(rank, "log", ckpt=ckpt)
        runs["plain_first"] = _fit(rank, None, steps=RESUME_STEP, save=tmp / "plain.ckpt")
        runs["plain_resumed"] = _fit(rank, None, ckpt=tmp / "plain.ckpt")
        runs["fresh"] = _fit(rank, "log", ckpt=fresh)
        runs["raise"] = _fit(rank, "raise")
        runs["fsdp2"] = _fit(rank, "skip", sharded=True)
        if rank == 0:
            doc = {"world": WORLD, "bad_rank": BAD_RANK, "bad_step": BAD_STEP, "resume_step": RESUME_STEP,
                   "runs": runs}
            with open(out, "w") as fh:
                json.dump(doc, fh)


if __name__ == "__main__":
    exit_after(main, sys.argv[1])
