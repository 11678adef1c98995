"""The monitor in a Hugging Face Accelerate loop: ``watch(accelerator, model, optimizer, monitor)``.

One line after ``accelerator.prepare`` (the optional extra ``naig[accelerate]``)::

    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    hook = watch(accelerator, model, optimizer, Monitor(action="skip"))

With several processes ``prepare`` wraps the model in ``DistributedDataParallel``; ``watch``
registers ``naig.monitor.MonitorHook`` on it, attaches it to the torch optimizer inside the
``AcceleratedOptimizer`` (``skip`` / ``raise`` before the update) and registers the monitor for
checkpointing (``accelerator.save_state`` / ``load_state`` carry its detector state:
``Monitor.state_dict``). It returns the hook (``hook.decision``, ``hook.detach()``).

**Gradient accumulation** (``accelerator.accumulate(model)``): on the micro-batches that do not
sync, Accelerate runs the backward pass under DDP's ``no_sync`` and DDP calls no communication
hook; on the one that syncs, the hook reads the accumulated gradient, each rank's sum over its
micro-batches, and decides. The ``AcceleratedOptimizer`` steps the torch optimizer only then,
so there is one decision, and one action, per optimizer step.

**One process**: nothing to compare; ``watch`` says so once (``UserWarning``) and returns a
detached hook (no decision, no action). A model ``prepare`` did not wrap in DDP although there
are several processes (FSDP, DeepSpeed, Megatron plugins) is refused in one line: for FSDP2
(``fully_shard``) use ``naig.monitor.fsdp.fully_shard_monitor``.

``DistributedDataParallelKwargs(comm_hook=...)`` registers Accelerate's own communication hook
at ``prepare``, and DDP takes one per model: pass torch's hook to ``watch(comm_hook=...,
comm_state=...)`` instead (the monitor reads each bucket, then that hook reduces it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from naig.errors import UsageError, a_type, warn_caller
from naig.monitor.ddp import MonitorHook
from naig.monitor.observe import Monitor

__all__ = ["ONE_PROCESS", "watch"]

ONE_PROCESS = ("naig.monitor: one process, nothing to compare: the monitor compares ranks' gradients "
               "(start 2 processes or more); it is off for this run")


def watch(accelerator: Accelerator, model: nn.Module, optimizer: torch.optim.Optimizer,
          monitor: Monitor | None = None, *, exact: bool = False, per_bucket: bool = True,
          comm_hook: Callable[[Any, Any], torch.futures.Future] | None = None,
          comm_state: Any = None) -> MonitorHook:
    """Monitor a prepared model and optimizer (see the module).

    Args:
        accelerator: the ``Accelerator`` that prepared them.
        model: the model ``accelerator.prepare`` returned.
        optimizer: the optimizer it returned (an ``AcceleratedOptimizer``) or a torch one.
        monitor: the ``Monitor`` (default ``Monitor()``: log only).
        exact: exact cos and distance from DDP's all-reduced mean.
        per_bucket: one all-gather per bucket (names it) or one per step.
        comm_hook: a DDP communication hook to reduce each bucket after the monitor read it.
        comm_state: its state.

    Returns:
        The ``MonitorHook`` (registered and attached; detached with one process).

    Raises:
        UsageError: not an ``Accelerator``, several processes but a model that is not DDP, or a
            bad argument of ``MonitorHook``.
    """
    if not isinstance(accelerator, Accelerator):
        raise UsageError(f"got {a_type(accelerator)}; pass the accelerate.Accelerator",
                         field="accelerator")
    base = model.module if isinstance(model, DistributedDataParallel) else model
    hook = MonitorHook(base, monitor, exact=exact, per_bucket=per_bucket, comm_hook=comm_hook,
                       comm_state=comm_state)
    if accelerator.num_processes < 2:
        warn_caller(ONE_PROCESS)
        hook.detach()
        return hook
    if not isinstance(model, DistributedDataParallel):
        raise UsageError(f"is a {type(model).__name__}, not DistributedDataParallel: pass the model "
                         "accelerator.prepare returned, after prepare (naig watches Accelerate's DDP only; "
                         "FSDP2: naig.monitor.fsdp.fully_shard_monitor)", field="model")
    hook.register(model).attach(optimizer)  # attach reaches the torch optimizer inside Accelerate's
    accelerator.register_for_checkpointing(hook.monitor)
    return hook
