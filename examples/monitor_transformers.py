"""naig's monitor in a Hugging Face ``Trainer`` run: ``Trainer(callbacks=[MonitorCallback(monitor)])``.

``naig.monitor.transformers.MonitorCallback`` registers the monitor's DDP communication hook on the
Trainer's DDP model, attaches it to the optimizer (``skip`` / ``raise`` before the update), adds
its scalars to the Trainer's logs (``on_log``, before the reporters) and keeps the detector state
in the Trainer's checkpoints.

A 2-layer GPT-2 built from a config (nothing downloaded) learns random 16-token sequences; each
process gets its shard (the Trainer's sampler). At step ``--bad-step`` rank ``--bad-rank``'s loss
is ×1000 (a subclass's ``compute_loss``). Rank 0 writes the monitor's JSONL (``OUT/monitor.jsonl``;
``naig monitor report OUT/monitor.jsonl`` reads it) and the final parameters (``OUT/params.pt``).

On CPU (gloo), several processes (torchrun; the Trainer reads its environment):

    torchrun --standalone --nproc-per-node 3 examples/monitor_transformers.py OUT
    naig monitor report OUT/monitor.jsonl

That ``log`` leaves training bit-identical to the run without the callback is tested in
tests/test_monitor_transformers.py.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import warnings
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from naig.errors import UsageError, run_main
from naig.monitor import Monitor
from naig.monitor.records import JsonlRecords
from naig.monitor.transformers import MonitorCallback
from naig.threads import DEFAULT_THREADS, check_threads

TIMEOUT = 30  # seconds, every collective (the Trainer's ddp_timeout and the monitor's)


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path, help="a directory for the records (created if missing)")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--bad-rank", type=int, default=1)
    p.add_argument("--bad-step", type=int, default=20, help="1-based; after the detectors' warm-up")
    p.add_argument("--action", choices=("log", "warn", "skip", "raise"), default="warn")
    p.add_argument("--window", type=int, default=16, help="the detectors' history")
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                   help="torch CPU threads per rank (default 1: a model this small only loses time to more)")
    args = p.parse_args(argv)
    torch.set_num_threads(check_threads(args.threads, "--threads"))
    world = int(os.environ.get("WORLD_SIZE", 1))
    if args.steps < 1:
        raise UsageError(f"--steps {args.steps}: must be >= 1 (training steps)")
    if not 0 <= args.bad_rank < world or not 1 <= args.bad_step <= args.steps:
        raise UsageError(f"--bad-rank {args.bad_rank} / --bad-step {args.bad_step}: must be a rank of the "
                         f"{world} processes and a step of --steps {args.steps}")
    if (args.out / "monitor.jsonl").exists():
        raise UsageError(f"{args.out / 'monitor.jsonl'} exists: pass another folder, or remove it")
    return args


class Tokens(torch.utils.data.Dataset):
    """Random 16-token sequences over 64 tokens; each its own label."""

    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 64, (n, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class FaultyTrainer(Trainer):
    """The Trainer, with rank ``bad_rank``'s loss ×1000 at step ``bad_step``."""

    bad_rank, bad_step = -1, -1

    def compute_loss(self, model: torch.nn.Module, inputs: dict, *args: object, **kwargs: object):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        hit = self.state.global_step + 1 == self.bad_step and self.args.process_index == self.bad_rank
        return loss * 1000.0 if hit else loss


def main(argv: list[str]) -> None:
    args = _args(argv)
    group = _train(args)
    gc.collect()  # the Trainer, its DDP model and DDP's reducer are gone (their cycles too)...
    del group  # ...so this is the group's last reference: its gloo threads are joined without the GIL


def _train(args: argparse.Namespace) -> object:
    """Train; return the (destroyed) process group, for ``main`` to let go of last.

    A group that dies inside DDP's reducer is torn down with the GIL held, while a gloo thread may
    still need the GIL to free its last work item: a deadlock at exit, seen under load.
    """
    args.out.mkdir(parents=True, exist_ok=True)
    warnings.filterwarnings("ignore", module="transformers")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16))
    seen: list[list[int]] = []
    monitor = Monitor(action=args.action, window=args.window, timeout=TIMEOUT,
                      callback=lambda sig, d: seen.append(list(d.ranks)))
    JsonlRecords(args.out / "monitor.jsonl").attach(monitor)  # rank 0 writes
    targs = TrainingArguments(output_dir=str(args.out / "trainer"), use_cpu=True, max_steps=args.steps,
                              per_device_train_batch_size=4, logging_steps=10, save_strategy="no",
                              report_to=[], ddp_backend="gloo", ddp_timeout=TIMEOUT, disable_tqdm=True,
                              learning_rate=1e-3, ddp_find_unused_parameters=False)
    world = int(os.environ.get("WORLD_SIZE", 1))
    trainer = FaultyTrainer(model=model, args=targs, train_dataset=Tokens(4 * world * args.steps),
                            callbacks=[MonitorCallback(monitor)])
    trainer.bad_rank, trainer.bad_step = args.bad_rank, args.bad_step
    trainer.train()
    if trainer.args.process_index == 0:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, args.out / "params.pt")
        flagged = {i + 1: r for i, r in enumerate(seen) if r}
        print(f"{world} processes, {args.steps} steps; flagged steps: {flagged or 'none'}")
    trainer.accelerator.wait_for_everyone()  # no process leaves while another still talks to it
    group = torch.distributed.group.WORLD
    trainer.accelerator.end_training()
    return group


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
