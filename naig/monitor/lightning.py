"""The monitor as a Lightning callback: ``Trainer(callbacks=[MonitorCallback(Monitor(...))])``.

One line in the ``Trainer`` (the optional extra ``naig[lightning]``)::

    trainer = L.Trainer(strategy="ddp", devices=4, callbacks=[MonitorCallback(Monitor(action="skip"))])

At ``on_fit_start`` (after Lightning has wrapped the model and built the optimizers) the callback

- with ``DDPStrategy`` (``"ddp"``, ``"ddp_spawn"``, …): registers ``naig.monitor.MonitorHook`` on
  the strategy's ``DistributedDataParallel`` model itself, on CPU and CUDA alike (Lightning
  registers communication hooks only on CUDA). A ``ddp_comm_hook`` given to the strategy (with
  its ``ddp_comm_state`` and ``ddp_comm_wrapper``) becomes the monitor's inner hook
  (``MonitorHook(comm_hook=...)``): the callback takes it from the strategy before Lightning
  registers it (DDP takes one hook per model), so it runs on CPU too;
- with ``ModelParallelStrategy`` (FSDP2: ``fully_shard`` in ``configure_model``): calls
  ``naig.monitor.fsdp.fully_shard_monitor`` on the LightningModule (its rules and actions);
- attaches every optimizer of the strategy (``skip`` and ``raise`` apply before Lightning's
  ``optimizer.step``, after the closure's backward pass).

One process (``SingleDeviceStrategy``): nothing to compare; the callback says so once
(``UserWarning``) and does nothing. Refused with Lightning's ``MisconfigurationException`` in one
line: ``FSDPStrategy`` (FSDP1: its flat-parameter reduce-scatter is not read by naig; use
``ModelParallelStrategy`` with ``fully_shard``), post-local-SGD model averaging (the
parameters are averaged outside the gradient's reduction), and every other strategy (DeepSpeed,
XLA, DP: no hook there for naig).

**Logging**: after each training batch whose step reached a decision (with
``accumulate_grad_batches`` only the step that syncs), rank 0 hands the step's scalars
(``naig.monitor.records.flat_scalars``: max score, its rank, K_eff, flagged ranks, B_simple;
``per_rank=True`` adds each rank's) to every logger of ``trainer.loggers`` at
``trainer.global_step``, and ``pl_module.log`` puts the summary scalars in
``trainer.callback_metrics`` (for ``EarlyStopping``/``ModelCheckpoint``; not to the loggers a
second time).

**Checkpoints**: ``state_dict``/``load_state_dict`` carry the monitor's detector state
(``Monitor.state_dict``): a run resumed with ``Trainer.fit(ckpt_path=...)`` scores its next step
against the history it had, as if never stopped.

**Detach**: ``detach()`` (and the end of ``fit``) removes what the callback registered: the
optimizer hooks go; the DDP communication hook, which DDP cannot drop, passes every bucket
straight to the inner hook; FSDP2 modules get their reduce-scatter back.

``GradientMonitor`` is already the name of the integrations' shared base (``naig.monitor``),
hence ``MonitorCallback`` here (and in ``naig.monitor.transformers``).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, SingleDeviceStrategy
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from naig.errors import UsageError, warn_caller
from naig.monitor.ddp import MonitorHook
from naig.monitor.integration import GradientMonitor, check_callback_options
from naig.monitor.observe import Monitor
from naig.monitor.records import decision_scalars

__all__ = ["ONE_PROCESS", "MonitorCallback"]

ONE_PROCESS = ("naig.monitor: one process, nothing to compare: the monitor compares ranks' gradients "
               "(start 2 processes or more); it is off for this run")
_SUMMARY = ("max_score", "max_rank", "k_eff", "flagged_ranks", "b_simple")


class MonitorCallback(pl.Callback):
    """Watch every rank's gradient in a Lightning run (see the module).

    Args:
        monitor: the ``Monitor`` (detectors, action, records through its callback); default
            ``Monitor()`` (log only).
        exact: exact cos and distance from DDP's all-reduced mean (``MonitorHook(exact=True)``).
        per_bucket: one all-gather per bucket/module (names it) or one per step.
        per_rank: also log each rank's scalars.

    Raises:
        UsageError: a bad argument, naming it.
    """

    def __init__(self, monitor: Monitor | None = None, *, exact: bool = False, per_bucket: bool = True,
                 per_rank: bool = False) -> None:
        self.monitor = check_callback_options(monitor, exact, per_bucket, per_rank)
        self.exact, self.per_bucket, self.per_rank = exact, per_bucket, per_rank
        self.watch: GradientMonitor | None = None
        self._inner: tuple[Any, Any] | None = None
        self._logged = 0

    # ------------------------------------------------------------------ set-up

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Refuse a strategy the monitor cannot watch; take the strategy's own DDP comm hook as inner."""
        if stage != "fit":
            return
        strategy = trainer.strategy
        if isinstance(strategy, DDPStrategy):
            if getattr(strategy, "_model_averaging_period", None) is not None:
                raise MisconfigurationException(
                    "naig.monitor: DDPStrategy with post-local-SGD model averaging is not supported (the "
                    "parameters are averaged outside the gradient's reduction); drop model_averaging_period")
            hook = getattr(strategy, "_ddp_comm_hook", None)
            if hook is not None:  # DDP takes one hook: the monitor's, wrapping the strategy's
                wrapper = getattr(strategy, "_ddp_comm_wrapper", None)
                self._inner = (wrapper(hook) if wrapper is not None else hook,
                               getattr(strategy, "_ddp_comm_state", None))
                strategy._ddp_comm_hook = None
        elif isinstance(strategy, SingleDeviceStrategy):
            warn_caller(ONE_PROCESS)
        elif not isinstance(strategy, ModelParallelStrategy):
            name = type(strategy).__name__
            why = ("FSDPStrategy wraps with FSDP1, whose reduce-scatter naig does not read; use "
                   "ModelParallelStrategy with fully_shard (FSDP2) in configure_model"
                   if name == "FSDPStrategy" else "use DDPStrategy, or ModelParallelStrategy (FSDP2)")
            raise MisconfigurationException(f"naig.monitor cannot watch {name}: {why}")

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Register on the wrapped model and attach the optimizers."""
        strategy = trainer.strategy
        if isinstance(strategy, SingleDeviceStrategy):
            return
        if isinstance(strategy, ModelParallelStrategy):
            from naig.monitor.fsdp import fully_shard_monitor

            if self.exact:  # FSDP2 holds no rank's whole reduced gradient to measure against
                raise UsageError("exact statistics are DDP's only (FSDP2 under ModelParallelStrategy keeps "
                                 "no rank's whole gradient); use exact=False", field="exact", value=True)
            self.watch = fully_shard_monitor(pl_module, self.monitor, per_bucket=self.per_bucket)
        else:
            inner, state = self._inner if self._inner is not None else (None, None)
            self.watch = MonitorHook(pl_module, self.monitor, exact=self.exact, per_bucket=self.per_bucket,
                                     comm_hook=inner, comm_state=state).register(strategy.model)
        for optimizer in strategy.optimizers:
            self.watch.attach(optimizer)
        self._logged = 0

    # ------------------------------------------------------------------ logging

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """Log the step's scalars once per decision (rank 0 to ``trainer.loggers``; ``pl_module.log``)."""
        watch = self.watch
        if watch is None or watch.detached or watch.step == self._logged or self.monitor.decision is None:
            return
        self._logged = watch.step
        scalars = decision_scalars(self.monitor, per_rank=self.per_rank)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(scalars, step=trainer.global_step)
        summary = {f"naig_monitor/{k}": scalars[f"naig_monitor/{k}"] for k in _SUMMARY}
        pl_module.log_dict(summary, on_step=True, on_epoch=False, logger=False, batch_size=1)

    # ------------------------------------------------------------------ checkpoints, teardown

    def state_dict(self) -> dict[str, Any]:
        """The monitor's detector state (``Monitor.state_dict``), saved in Lightning's checkpoint."""
        return {"monitor": self.monitor.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the monitor's detector state from a checkpoint (``Monitor.load_state_dict``)."""
        self.monitor.load_state_dict(state_dict["monitor"])

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """The end of ``fit``: ``detach``."""
        if stage == "fit":
            self.detach()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        """``fit`` stopped by an exception (e.g. ``BadRankError``): ``detach``."""
        self.detach()

    def detach(self) -> None:
        """Remove what the callback registered (see the module); idempotent."""
        if self.watch is not None:
            self.watch.detach()
