"""The monitor inside ``DistributedDataParallel``: a communication hook and an optimizer step pre-hook.

Register it on the DDP model and attach it to the optimizer::

    hook = MonitorHook(model, monitor=Monitor(action="skip"))
    hook.register(ddp)          # ddp.register_comm_hook(hook, monitor_comm_hook)
    hook.attach(optimizer)      # applies skip / raise before optimizer.step()

(Lightning: ``naig.monitor.lightning.MonitorCallback``; the Hugging Face ``Trainer``:
``naig.monitor.transformers.MonitorCallback``; Accelerate: ``naig.monitor.accelerate.watch``.)

**With another communication hook** (compression, PowerSGD): DDP takes one hook per model, so
pass yours to the monitor, which calls it on each bucket after reading the bucket::

    state = PowerSGDState(process_group=None, matrix_approximation_rank=1)
    hook = MonitorHook(model, monitor, comm_hook=powerSGD_hook, comm_state=state).register(ddp)

The monitor reads the bucket before ``comm_hook`` reduces it, so it sees every rank's own
gradient whatever the compression; in ``log`` mode training is bit-identical to ``comm_hook``
alone (tested with ``bf16_compress_hook`` and ``powerSGD_hook``). ``exact`` and ``exclude``
need the monitor's own all-reduce and are refused with a ``comm_hook``.

**Detach** (``detach()``): the optimizer pre-hooks are removed; DDP cannot drop a communication
hook once registered, so the hook stays and passes every bucket straight to ``comm_hook`` (or
DDP's own all-reduce of the mean): no payload, no gather, no decision, no action. A new
``MonitorHook`` may then be registered on the same DDP model (a second ``trainer.train()``, another
action): the detached hook hands every bucket to it. Registering while the first is not detached
is refused.

**Per bucket** (DDP hands each bucket of this rank's gradient to the hook before reducing it) the
hook packs [S g_b | ‖g_b‖² | non-finite count of g_b] (``naig.monitor.signals.pack``: the
``MonitorSketch`` keyed by the parameters' names, so the buckets' sketches sum to the sketch of
the whole gradient, the one ``Monitor.observe`` would compute) and keeps it.

**At the last bucket** (``bucket.is_last()``), before reducing it, it starts one all-gather of the
step's payloads (``per_bucket=True``: m + 3 float64 per bucket, 136 B with the default sketch: the
payload and this rank's ``Monitor.state_word``: the records its writers lost, so every rank learns of
a failed write, and its monitor state's fingerprint, so ranks whose monitors differ stop at once;
with ``per_bucket=False`` their sum, 136 B per step, but a flag can then not name a bucket): ~16
floats cost a collective's latency, not its bytes, so one gather per step beats one per bucket.
After handing the bucket on it waits for the gather, sums every rank's buckets into its step
payload, derives the signals and runs the detectors
(``Monitor.decide``): every rank holds the same gathered data, so every rank reaches the same
``Decision`` with no further collective. A flagged rank is named with the bucket where its
gradient departs most (``Decision.where``: the buckets with non-finite entries; else, for a
norm flag, the bucket whose ‖g_b‖ is furthest from the other ranks' in log ratio; else the
bucket whose sketched distance to the unflagged ranks' mean is largest relative to theirs).

**Exact statistics** (``exact=True``): each bucket is copied before the all-reduce; at the last
bucket the hook waits for every bucket's all-reduce (the mean ḡ DDP will use), computes this
rank's ⟨g_k, ḡ⟩ and ‖g_k − ḡ‖² in float64 over all buckets and all-gathers those 2 floats
(16 B); cos and distance are then exact (``RankSignals.exact``), otherwise sketch estimates.
The price: a gradient-sized copy, and the hook waits for the last bucket's all-reduce.

**Actions** (``Monitor(action=...)``):

- ``log``: records only. Each bucket is multiplied by 1/K and all-reduced (sum) at once, as
  DDP does without a hook: the all-reduce gets exactly DDP's bytes (training is bit-identical).
- ``warn``: as ``log``, and rank 0 writes one line (``warnings``): step, rank, host, bucket and
  parameters, the tests that fired.
- ``skip``: as ``warn`` (the line ends saying the update is skipped); then the optimizer step
  pre-hook (``attach``) sets every ``p.grad`` of the optimizer's parameters to None, so
  ``optimizer.step()`` changes neither the parameters nor the optimizer's state (torch's
  optimizers skip parameters without a gradient; a learning-rate scheduler the user steps still
  steps). On every rank alike.
- ``exclude``: the flagged ranks' contributions are weighted 0 and the others 1/(K − F) before
  the sum (the mean of the unflagged ranks; 1/K, DDP's own bytes, when none is flagged). The
  decision needs the whole step's gradient, so this mode holds every bucket's all-reduce back
  until the last bucket (no overlap of communication with the backward pass): the hook returns
  a pending future per bucket and completes them all at the last bucket. With every rank
  flagged, every weight is 0 and the step's gradient is zero. Rank 0 writes the step's line, as
  ``warn`` does, naming the ranks left out. DDP only.
- ``raise``: the step pre-hook raises ``BadRankError`` on every rank before
  ``optimizer.step()`` changes anything (all the step's collectives have finished: no rank is
  left waiting). Calling ``step()`` again for the same decision raises again.

``skip`` and ``raise`` need ``attach(optimizer)``; a hook without an attached optimizer refuses
them at the first bucket (``UsageError``). A closure passed to ``optimizer.step(closure)``
(Lightning passes one: the backward pass runs inside ``step``) is wrapped, so the action is
applied after the closure's backward and before the update.

**Bytes beyond DDP's own**, per rank and step: (m + 3)·8·B with B buckets (``per_bucket``), or
(m + 3)·8 (``per_bucket=False``); + 16 with ``exact``; + 160 once for the host names and this
rank's setup (payload shape and dtype, ``per_bucket``, ``exact``: ranks set up otherwise stop at the
first step with one ``DataError``; ``Monitor.start_gather``) (``MonitorHook.extra_bytes``).

Example (not run here; see examples/monitor_ddp.py)::

    ddp = DistributedDataParallel(model)
    hook = MonitorHook(model, monitor=Monitor(action="warn")).register(ddp)
"""

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from naig.errors import UsageError, a_type
from naig.monitor.detectors import Decision
from naig.monitor.integration import GradientMonitor, check_exact, replicated_weights
from naig.monitor.observe import Monitor
from naig.monitor.replicas import action_ranks
from naig.monitor.signals import pack

__all__ = ["MonitorHook", "monitor_comm_hook"]


class MonitorHook(GradientMonitor):
    """DDP communication-hook state: per-rank signals per bucket, one decision per step, actions.

    Args:
        module: the model DDP wraps (or the DDP module): parameter names key the sketch.
        monitor: a ``Monitor`` (default ``Monitor()``: log only); its ``process_group`` must be
            the group DDP reduces over (None: the default group).
        exact: exact ⟨g_k, ḡ⟩ and ‖g_k − ḡ‖² from the all-reduced buckets (see the module).
        per_bucket: one all-gather per bucket (names the bucket) or one per step (136 B).
        comm_hook: the communication hook that reduces each bucket once the monitor has read it,
            called as ``comm_hook(comm_state, bucket)`` (e.g. torch's ``bf16_compress_hook`` or
            ``powerSGD_hook``); None: DDP's own all-reduce of the mean.
        comm_state: its state (e.g. a ``PowerSGDState``, or the process group for torch's
            default hooks).

    Raises:
        UsageError: a bad argument, naming it; ``exact`` with ``exclude`` (the mean is not DDP's);
            ``comm_hook`` with ``exact`` or ``exclude`` (both need the monitor's own all-reduce).
    """

    def __init__(self, module: nn.Module, monitor: Monitor | None = None, *, exact: bool = False,
                 per_bucket: bool = True, comm_hook: Callable[[Any, dist.GradBucket], torch.futures.Future]
                 | None = None, comm_state: Any = None) -> None:
        super().__init__(module, monitor, per_bucket=per_bucket)
        check_exact(exact, self.action)
        if comm_hook is not None and not callable(comm_hook):
            raise UsageError("must be a DDP communication hook, hook(state, bucket) -> Future",
                             field="comm_hook", value=comm_hook)
        if comm_hook is not None and (exact or self.action == "exclude"):
            what = "exact statistics wait for the monitor's own all-reduce" if exact else \
                "exclude reweights the ranks in the monitor's own all-reduce"
            raise UsageError(f"cannot wrap another hook: {what} (pass comm_hook=None)", field="comm_hook",
                             value=getattr(comm_hook, "__name__", comm_hook))
        self.exact, self.comm_hook, self.comm_state = exact, comm_hook, comm_state
        self.successor: MonitorHook | None = None  # registered on the same DDP model once this one detached

    def register(self, ddp: nn.parallel.DistributedDataParallel) -> "MonitorHook":
        """``ddp.register_comm_hook(self, monitor_comm_hook)``; returns self. On a DDP model whose hook is
        a detached ``MonitorHook``, that hook hands its buckets to this one instead.

        Raises:
            UsageError: not a ``DistributedDataParallel``; one with a trainable ``nn.Embedding`` or
                ``nn.EmbeddingBag`` built with ``sparse=True`` that DDP reduces (sparse gradients: the
                sketch reads dense buckets); one with a communication hook already
                (DDP takes one per model: pass the other as ``comm_hook``) or a monitor's that is not
                detached; one wrapping another model than this hook's ``module``; one reducing over
                another group than the monitor's; a ``Monitor`` that decides another integration's
                steps (``claim_monitor``).
        """
        if not isinstance(ddp, nn.parallel.DistributedDataParallel):
            raise UsageError(f"got {a_type(ddp)}; pass the DistributedDataParallel model",
                             field="ddp")
        if any(id(p) not in self.names for p in ddp.module.parameters()):
            raise UsageError("this DDP model wraps another model than the hook's: pass the model DDP wraps "
                             "(or the DDP model itself) to MonitorHook", field="module")
        if ddp.process_group is not self._group():
            raise UsageError("this DDP model reduces over another process group than the monitor's (its "
                             "own all-reduce would then mix ranks DDP does not); pass that group as "
                             "Monitor(process_group=...)", field="process_group")
        if self.detached:
            raise UsageError("this monitor hook is detached; make a new MonitorHook", field="ddp")
        ignored = set(ddp.parameters_to_ignore)  # DDP reduces neither these nor frozen ones
        sparse = [n for n, m in ddp.module.named_modules() if isinstance(m, nn.Embedding | nn.EmbeddingBag)
                  and m.sparse and any(p.requires_grad and f"{n}.{pn}".lstrip(".") not in ignored
                                       for pn, p in m.named_parameters(recurse=False))]
        if sparse:
            where = f"module {sparse[0]!r}" if sparse[0] else "the wrapped module"
            raise UsageError(f"{where} makes sparse gradients (sparse=True), which the monitor's sketch does "
                             "not read; build it with sparse=False", field="ddp")
        self.claim_monitor(take=False)  # a refusal leaves the DDP model and the Monitor as they were
        registered = _registered_monitor(ddp)
        if registered is not None and not registered.active().detached:
            raise UsageError("has a monitor hook already that is not detached: call its detach() first (DDP "
                             "takes one communication hook per model)", field="ddp")
        if self.replicated:  # what DDP synchronises: not the parameters it ignores
            self.weights = replicated_weights(ddp.module, self.monitor, ddp.parameters_to_ignore)
        if registered is not None:  # a detached monitor's hook: it hands every bucket to this one
            registered.successor = self
        else:
            try:
                ddp.register_comm_hook(self, monitor_comm_hook)
            except RuntimeError as exc:
                if "only be called once" not in str(exc):
                    raise
                raise UsageError("has a communication hook already and DDP takes one per model: pass that "
                                 "hook to MonitorHook(comm_hook=..., comm_state=...) and register on a fresh "
                                 "DDP model", field="ddp") from None
        self.claim_monitor()
        return self

    def active(self) -> "MonitorHook":
        """The hook that handles this DDP model's buckets: this one, or the one registered after it
        was detached (``successor``)."""
        return self.successor if self.detached and self.successor is not None else self

    def _group(self) -> dist.ProcessGroup:
        return self.monitor.group if self.monitor.group is not None else dist.group.WORLD

    def reduce(self, bucket: dist.GradBucket) -> torch.futures.Future:
        """One bucket: payload (and its gather), the reduction (or hold it back), decide at the last.

        Once ``detach``ed: the reduction only (``comm_hook``, or DDP's own all-reduce).
        """
        if self.detached:
            return self.successor.reduce(bucket) if self.successor is not None else self._pass(bucket)
        if bucket.index() == 0:
            self._begin_step()
        group = self._group()
        world = dist.get_world_size(group)
        buf = bucket.buffer()
        params = bucket.parameters()
        names = self._names(params)
        if buf.layout != torch.strided:  # a module register() could not see: refused here, in one line
            raise UsageError(f"bucket {bucket.index()} ({', '.join(names[:2])}) holds a sparse gradient "
                             f"({buf.layout}), which the monitor's sketch does not read; make that "
                             "parameter's gradient dense", field="ddp")
        sketch = self._sketch(tuple(id(p) for p in params), tuple(zip(names, (p.numel() for p in params),
                                                                       strict=True)), buf.device)
        flat = buf if buf.numel() == sketch.numel else torch.cat([g.reshape(-1) for g in bucket.gradients()])
        last = bucket.is_last()
        part = self._add_part(bucket.index(), names, pack(flat, sketch), last)  # read before any reduction
        if self.action == "exclude":
            part.buffer = buf
            part.future = _future(buf)
            fut = part.future
        elif self.comm_hook is not None:
            fut = self.comm_hook(self.comm_state, bucket)
        else:
            part.local = buf.clone() if self.exact else None
            part.buffer = buf
            part.work, fut = _all_reduce_mean(buf, group, world)
        if last:
            self._last(world, dist.get_rank(group))
        return fut

    def _pass(self, bucket: dist.GradBucket) -> torch.futures.Future:
        """The reduction alone: the inner hook, or DDP's own all-reduce of the mean."""
        if self.comm_hook is not None:
            return self.comm_hook(self.comm_state, bucket)
        group = self._group()
        return _all_reduce_mean(bucket.buffer(), group, dist.get_world_size(group))[1]

    def _last(self, world: int, rank: int) -> None:
        exact = self._exact() if self.exact else None
        decision = self._finish(exact)
        if self.action == "exclude":
            self._reduce_excluding(decision, world, rank)

    def _exact(self) -> tuple[float, float]:
        """This rank's ⟨g_k, ḡ⟩ and ‖g_k − ḡ‖² over every bucket (waits for the all-reduces)."""
        dot = sq = 0.0
        for p in self.parts:
            self.monitor.wait_work(p.work)
            for lo in range(0, p.local.numel(), _EXACT_CHUNK):  # float64 a chunk at a time, not a copy of g
                g = p.local[lo:lo + _EXACT_CHUNK].to(torch.float64)
                mean = p.buffer[lo:lo + _EXACT_CHUNK].to(torch.float64)
                dot += float(torch.dot(g, mean))
                sq += float(torch.dot(g - mean, g - mean))
            p.local = None
        return dot, sq

    def _reduce_excluding(self, decision: Decision, world: int, rank: int) -> None:
        """Weight flagged ranks 0 and the others 1/(K − F), all-reduce every held bucket, complete them."""
        flagged = set(action_ranks(decision))  # the replica check's ranks only while a majority agrees
        kept = world - len(flagged)
        group = self._group()
        for p in self.parts:
            if rank in flagged or kept == 0:
                p.buffer.zero_()
            else:
                p.buffer.mul_(1.0 / kept)
            self.monitor.wait_work(dist.all_reduce(p.buffer, group=group, async_op=True))
            p.future.set_result(p.buffer)


def _registered_monitor(ddp: nn.parallel.DistributedDataParallel) -> MonitorHook | None:
    """The ``MonitorHook`` registered as ``ddp``'s communication hook, if one is (DDP keeps its hook in
    ``_comm_hooks``; None where that is not a monitor's or the attribute is gone)."""
    hooks = getattr(ddp, "_comm_hooks", None)
    if not hooks:
        return None
    hook, state = hooks[0]
    return state if hook is monitor_comm_hook and isinstance(state, MonitorHook) else None


def _all_reduce_mean(buf: Tensor, group: dist.ProcessGroup, world: int) -> tuple[Any, torch.futures.Future]:
    """What DDP does without a hook: ``buf`` × 1/K, then an all-reduce (sum) started; (work, future)."""
    buf.mul_(1.0 / world)
    work = dist.all_reduce(buf, group=group, async_op=True)
    return work, work.get_future().then(lambda f: f.value()[0])
_EXACT_CHUNK = 1 << 20  # values converted to float64 at a time by the exact statistics


def _future(buf: Tensor) -> torch.futures.Future:
    return torch.futures.Future(devices=[buf.device] if buf.device.type == "cuda" else None)


def monitor_comm_hook(state: MonitorHook, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The DDP communication hook: ``ddp.register_comm_hook(MonitorHook(model), monitor_comm_hook)``.

    (No postponed annotations in this module: DDP checks these two at registration.)
    """
    return state.reduce(bucket)

