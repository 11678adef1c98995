"""Ranks for tests/test_monitor_transformers.py: ``naig.monitor.transformers.MonitorCallback`` in real
``transformers.Trainer`` runs under DDP (gloo, CPU), started by torchrun with 3 processes::

    torchrun --standalone --nproc-per-node 3 -m tests.monitor_transformers_ranks OUT.json

The model is a GPT-2 built from a config (2 layers, 32 wide, vocabulary 64, no dropout: nothing
downloaded); every rank trains it with the Trainer's defaults (AdamW, gradient clipping at 1) for
``STEPS`` steps on its shard of a random token set, and at step ``BAD_STEP`` (the last) rank
``BAD_RANK`` multiplies its loss by 1000. The runs, in turn in the same processes:

- ``plain``: no callback; ``log``: the callback (``log``; must end bit-identical to plain), with a
  checkpoint every ``SAVE_STEPS`` steps;
- ``skip`` / ``raise``: that action (the last step must leave the parameters unchanged);
- ``resumed``: a new Trainer and callback, ``train(resume_from_checkpoint=.../checkpoint-6)``;
  ``fresh``: the same from a copy of that checkpoint whose ``trainer_state.json`` lacks the
  callback's state.

A recording callback listed before the monitor's keeps what ``on_log`` hands the reporters
(``logging_steps`` = 5). Every collective outside the Trainer waits at most ``TIMEOUT`` seconds
(the Trainer's own: ``ddp_timeout``). Rank 0 writes what each rank saw.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from naig.monitor import BadRankError, Monitor
from naig.monitor.transformers import MonitorCallback
from tests.monitor_rank_tools import exit_after, gather_rows

WORLD, BAD_RANK, BAD_STEP, STEPS, SAVE_STEPS, WINDOW, TIMEOUT, BATCH = 3, 2, 12, 12, 6, 8, 30.0, 4


class Tokens(torch.utils.data.Dataset):
    """Random 16-token sequences (vocabulary 64), their own labels."""

    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 64, (n, 16), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Faulty(Trainer):
    """Rank ``BAD_RANK``'s loss ×1000 at step ``BAD_STEP``; the parameters before that step kept."""

    before: torch.Tensor | None = None

    def compute_loss(self, model: torch.nn.Module, inputs: dict, *args: object, **kwargs: object):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        if self.state.global_step + 1 == BAD_STEP:
            self.before = _flat(self.model)
            if dist.get_rank() == BAD_RANK:
                return loss * 1000.0
        return loss


class Recorder(TrainerCallback):
    """What ``on_log`` hands the reporters: (step, the monitor's keys)."""

    def __init__(self) -> None:
        self.rows: list = []

    def on_log(self, args: object, state: object, control: object, logs: dict | None = None,
               **kwargs: object) -> None:
        self.rows.append((state.global_step, {k: v for k, v in (logs or {}).items()
                                              if k.startswith("naig_monitor/")}))


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def _model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg)


def _train(tmp: Path, name: str, action: str | None, resume: Path | None = None, save: bool = False) -> dict:
    masks, lines = [], []

    def seen(sig: object, d: object) -> None:
        mask = torch.zeros(WORLD)
        mask[list(d.ranks)] = 1.0
        masks.append(mask)
        lines.append(d.describe())

    cb = None if action is None else MonitorCallback(Monitor(action=action, window=WINDOW, timeout=TIMEOUT,
                                                             callback=seen))
    rec = Recorder()
    args = TrainingArguments(output_dir=str(tmp / name), use_cpu=True, per_device_train_batch_size=BATCH,
                             max_steps=STEPS, logging_steps=5, save_strategy="steps" if save else "no",
                             save_steps=SAVE_STEPS, report_to=[], seed=0, ddp_timeout=int(TIMEOUT),
                             ddp_backend="gloo", disable_tqdm=True, dataloader_num_workers=0,
                             learning_rate=1e-3)
    model = _model()
    trainer = Faulty(model=model, args=args, train_dataset=Tokens(BATCH * WORLD * STEPS),
                     callbacks=[rec] + ([cb] if cb else []))
    err = None
    try:
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    except BadRankError as exc:
        err = str(exc)
    out: dict = {"params": _flat(model).tolist(), "error_text": err,
                 "error": gather_rows(torch.tensor([float(err is not None)]), WORLD, TIMEOUT),
                 "unchanged": gather_rows(torch.tensor([float(torch.equal(trainer.before, _flat(model)))]),
                                          WORLD, TIMEOUT)}
    if cb is not None:
        out["flagged"] = gather_rows(torch.stack(masks), WORLD, TIMEOUT)  # (K, steps, K)
        out["describe"] = lines
        out["logged"] = rec.rows
        out["detached"] = cb.watch.detached
        out["hosts"] = list(cb.monitor.hosts)
    return out


def main(out: str) -> None:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    tmp = Path(out).parent
    runs = {"plain": _train(tmp, "plain", None), "log": _train(tmp, "log", "log", save=True),
            "skip": _train(tmp, "skip", "skip")}
    ckpt, fresh = tmp / "log" / f"checkpoint-{SAVE_STEPS}", tmp / "fresh-ckpt"
    if dist.get_rank() == 0:
        shutil.copytree(ckpt, fresh)
        state = json.loads((fresh / "trainer_state.json").read_text())
        state["stateful_callbacks"].pop("MonitorCallback")
        (fresh / "trainer_state.json").write_text(json.dumps(state))
    gather_rows(torch.zeros(1), WORLD, TIMEOUT)  # the copy exists before any rank reads it
    runs["resumed"] = _train(tmp, "resumed", "log", resume=ckpt)
    runs["fresh"] = _train(tmp, "fresh", "log", resume=fresh)
    runs["raise"] = _train(tmp, "raise", "raise")
    if dist.get_rank() == 0:
        doc = {"world": WORLD, "bad_rank": BAD_RANK, "bad_step": BAD_STEP, "resume_step": SAVE_STEPS,
               "runs": runs}
        Path(out).write_text(json.dumps(doc))
    gc.collect()  # every run's DDP model and reducer die before the group (examples/monitor_transformers.py)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    exit_after(main, sys.argv[1])
