"""The monitor as a Hugging Face ``Trainer`` callback: ``Trainer(callbacks=[MonitorCallback(Monitor(...))])``.

One line in the ``Trainer`` (the optional extra ``naig[transformers]``), launched as usual
(``torchrun --nproc-per-node N train.py``; ``accelerate launch`` on GPUs)::

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[MonitorCallback(Monitor(action="skip"))])

At ``on_train_begin`` (the Trainer has wrapped the model in ``DistributedDataParallel`` and
built its optimizer) the callback registers ``naig.monitor.MonitorHook`` on the wrapped model
(``Trainer.model_wrapped``) and attaches it to the torch optimizer inside the Trainer's
``AcceleratedOptimizer`` (``skip`` / ``raise`` before the update; after gradient clipping, which
does not change what the monitor read). The Trainer hands callbacks the unwrapped model only, so
the callback finds the Trainer calling it (the ``self`` of the calling frame, a
``transformers.Trainer``); a ``UsageError`` says so when it cannot. With gradient accumulation
DDP reduces, and the monitor decides, on the micro-batch that syncs: one decision per
optimizer step.

One process: nothing to compare; the callback says so once (``UserWarning``) and does nothing.
Not supported (refused in one line): FSDP and DeepSpeed (``args.fsdp``, ``args.deepspeed``: the
Trainer's FSDP is FSDP1 through Accelerate, not ``fully_shard``), and
``restore_callback_states_from_checkpoint=True`` (the Trainer would rebuild this callback from
its arguments and drop the ``Monitor`` you passed; the callback restores its state itself).

**Logging** (``on_log``): the callback moves itself first in the Trainer's callback list, so the
scalars of the latest decision (``naig.monitor.records.flat_scalars``: max score, its rank,
K_eff, flagged ranks, B_simple; ``per_rank=True`` adds each rank's) join the Trainer's own logs
before its reporters (TensorBoard, W&B, …) see them; a step that flags a rank is always logged
(``control.should_log``), whatever ``logging_steps``. ``trainer.state.log_history`` does not hold
them: the Trainer appends its own copy of the logs there before any callback's ``on_log`` runs
(read them from the reporters, or from ``monitor.decision``).

**Checkpoints**: the monitor's detector state (``Monitor.state_dict``) is saved in the
checkpoint's ``trainer_state.json`` (``stateful_callbacks``, through ``ExportableState``); a run
resumed with ``trainer.train(resume_from_checkpoint=...)`` loads it at ``on_train_begin``.

**Detach**: ``detach()`` (and the end of training) removes the optimizer hook; DDP's
communication hook, which DDP cannot drop, then passes every bucket straight to DDP's all-reduce.

Named ``MonitorCallback`` as in ``naig.monitor.lightning`` (``GradientMonitor`` is the
integrations' shared base in ``naig.monitor``).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from transformers import Trainer, TrainerCallback
from transformers.trainer_callback import ExportableState

from naig.errors import UsageError, warn_caller
from naig.monitor.ddp import MonitorHook
from naig.monitor.integration import check_callback_options
from naig.monitor.observe import Monitor
from naig.monitor.records import decision_scalars

__all__ = ["ONE_PROCESS", "MonitorCallback"]

ONE_PROCESS = ("naig.monitor: one process, nothing to compare: the monitor compares ranks' gradients "
               "(start 2 processes or more); it is off for this run")


class MonitorCallback(TrainerCallback, ExportableState):
    """Watch every rank's gradient in a ``transformers.Trainer`` run (see the module).

    Args:
        monitor: the ``Monitor`` (detectors, action, records through its callback); default
            ``Monitor()`` (log only).
        exact: exact cos and distance from DDP's all-reduced mean (``MonitorHook(exact=True)``).
        per_bucket: one all-gather per bucket (names it) or one per step.
        per_rank: also log each rank's scalars.

    Raises:
        UsageError: a bad argument, naming it.
    """

    def __init__(self, monitor: Monitor | None = None, *, exact: bool = False, per_bucket: bool = True,
                 per_rank: bool = False) -> None:
        self.monitor = check_callback_options(monitor, exact, per_bucket, per_rank)
        self.exact, self.per_bucket, self.per_rank = exact, per_bucket, per_rank
        self.watch: MonitorHook | None = None
        self._logged = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, model: torch.nn.Module | None = None,
                       optimizer: torch.optim.Optimizer | None = None, **kwargs: Any) -> None:
        """Refuse what it cannot watch, restore a resumed run's state, register and attach."""
        if getattr(args, "restore_callback_states_from_checkpoint", False):
            raise UsageError("restore_callback_states_from_checkpoint=True would rebuild MonitorCallback "
                             "from its arguments and drop your Monitor; leave it False (the callback "
                             "restores its own state)", field="args")
        if getattr(args, "fsdp", None) or getattr(args, "deepspeed", None):
            raise UsageError("the Trainer's FSDP (FSDP1) and DeepSpeed are not watched by naig.monitor; use "
                             "DDP, or fully_shard with naig.monitor.fsdp in your own loop", field="args")
        saved = (state.stateful_callbacks or {}).get(type(self).__name__) if state.global_step else None
        if isinstance(saved, dict) and saved.get("attributes", {}).get("monitor_state") is not None:
            self.monitor.load_state_dict(saved["attributes"]["monitor_state"])
        trainer = _calling_trainer()
        wrapped = trainer.model_wrapped
        if not isinstance(wrapped, DistributedDataParallel):
            warn_caller(ONE_PROCESS)
            return
        handler = trainer.callback_handler.callbacks
        handler.remove(self)
        handler.insert(0, self)  # first: the reporters see the monitor's scalars in on_log
        self.watch = MonitorHook(wrapped.module, self.monitor, exact=self.exact,
                                 per_bucket=self.per_bucket).register(wrapped)
        self.watch.attach(getattr(optimizer, "optimizer", optimizer))  # the torch one inside Accelerate's
        self._logged = self.watch.step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """A step that flagged a rank is logged whatever ``logging_steps``."""
        d = self.monitor.decision
        if self.watch is not None and d is not None and d.flagged and self.watch.step != self._logged:
            control.should_log = True

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        """Add the latest decision's scalars to the Trainer's logs (before the reporters)."""
        if self.watch is None or self.watch.detached or self.monitor.decision is None or logs is None:
            return
        self._logged = self.watch.step
        logs.update(decision_scalars(self.monitor, per_rank=self.per_rank))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The end of training: ``detach``."""
        self.detach()

    def state(self) -> dict:
        """What the Trainer keeps in its checkpoint (``ExportableState``): the detector state."""
        return {"args": {}, "attributes": {"monitor_state": self.monitor.state_dict()}}

    def detach(self) -> None:
        """Remove what the callback registered (see the module); idempotent."""
        if self.watch is not None:
            self.watch.detach()


def _calling_trainer() -> Trainer:
    """The ``transformers.Trainer`` whose callback handler called this callback (up the stack).

    Raises:
        UsageError: no Trainer among the callers (the callback called by hand).
    """
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, Trainer):
            return owner
        frame = frame.f_back
    raise UsageError("is called by a transformers.Trainer (Trainer(callbacks=[MonitorCallback(...)]))",
                     field="callback")
