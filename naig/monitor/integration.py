"""What the DDP and FSDP2 integrations share (``GradientMonitor``): a step's parts, one decision, the
optimizer hook that applies ``skip`` and ``raise``.

An integration cuts each step into parts (DDP: its buckets, ``naig.monitor.ddp.MonitorHook``;
FSDP2: its reduce-scatters, ``naig.monitor.fsdp.FSDPMonitor``), hands each part's payload to
``_add_part`` (which, at the step's last part and before that part is reduced, starts the step's
one all-gather of every part's payload) and calls ``_finish`` after the last part is handed on:
the payloads are summed into the step's, the ``Monitor`` decides, and a flagged rank is
named with the part where its gradient departs most (``Decision.where``; see
``naig.monitor.ddp`` for how that part is chosen). ``attach(optimizer)`` registers a step
pre-hook that applies the decision before ``optimizer.step()``; ``detach()`` removes it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from naig.errors import UsageError, a_type, warn_caller
from naig.monitor.detectors import Decision
from naig.monitor.observe import HOST_BYTES, SETUP_BYTES, Monitor
from naig.monitor.replicas import gradient_flagged
from naig.monitor.signals import MonitorSketch

__all__ = ["GradientMonitor", "check_callback_options", "check_exact", "replicated_weights"]

_NEED_OPTIMIZER = ("skip", "raise")


@dataclass
class _Part:
    """One bucket (DDP) or one reduce-scatter (FSDP2) of this rank's step."""

    index: int
    names: tuple[str, ...]
    payload: Tensor
    buffer: Tensor | None = None  # held back (exclude) or copied (exact)
    local: Tensor | None = None  # this rank's gradient before the all-reduce (exact)
    work: Any = None  # the all-reduce in flight
    future: Any = None  # the pending future handed to DDP (exclude)
    extra: dict = field(default_factory=dict)


class GradientMonitor:
    """What the DDP and FSDP2 integrations share: parts of a step, one decision, the optimizer hook.

    Args:
        module: the model (un-wrapped or wrapped): its parameter names key the sketch.
        monitor: the ``Monitor`` (gather group, sketch, detectors, action, callback).
        per_bucket: all-gather every part's payload (names the part) or only their sum; either
            way in one all-gather at the step's last part (one collective per step, not per part).

    Raises:
        UsageError: ``module`` not an ``nn.Module`` or ``monitor`` not a ``Monitor``.
    """

    part_kind = "bucket"  # what a part is called in ``Decision.where``
    replicated = True  # every rank holds the whole model: the replica check runs (not under FSDP2)
    exact = False  # exact statistics (a second gather per step: DDP's ``exact=True``)
    # the framework writes a part's reduced gradient into ``p.grad`` after reducing it (FSDP2): at a step's
    # first part a gradient is there only when an earlier micro-batch was reduced since the last step
    grads_after_decision = False

    def __init__(self, module: nn.Module, monitor: Monitor | None = None, *, per_bucket: bool = True) -> None:
        if not isinstance(module, nn.Module):
            raise UsageError(f"got {a_type(module)}; pass the model", field="module")
        if monitor is not None and not isinstance(monitor, Monitor):
            raise UsageError(f"got {a_type(monitor)}; pass naig.monitor.Monitor(...)",
                             field="monitor")
        if not isinstance(per_bucket, bool):
            raise UsageError("must be True or False", field="per_bucket", value=per_bucket)
        inner = getattr(module, "module", module) if isinstance(module, nn.parallel.DistributedDataParallel) \
            else module
        self.names = {id(p): name for name, p in inner.named_parameters()}
        if not self.names:
            raise UsageError("has no parameters; pass the model whose gradients are reduced", field="module")
        self.monitor = monitor if monitor is not None else Monitor()
        self.action, self.per_bucket = self.monitor.action, per_bucket
        ignore = module.parameters_to_ignore if isinstance(module, nn.parallel.DistributedDataParallel) else \
            getattr(inner, "_ddp_params_and_buffers_to_ignore", ())
        self.weights = replicated_weights(inner, self.monitor, ignore) if self.replicated else {}
        self.step = 0
        self.decision: Decision | None = None
        self.parts: list[_Part] = []
        self.extra_bytes = 0  # bytes this rank sent beyond the framework's own in the latest step
        self._sketches: dict[tuple, MonitorSketch] = {}
        self._optimizers: list[tuple[weakref.ref, Any]] = []
        self._applied: dict[int, Decision] = {}  # optimizer id -> the decision skip last applied
        self._raised: Decision | None = None  # the decision raise last raised
        self._grads: dict[int, weakref.ref | None] = {}  # optimizer id -> its first gradient at the decision
        self._held: set[int] = set()  # FSDP2: optimizers holding a gradient at this step's first part
        self._stepped: set[int] = set()  # optimizers that stepped since the latest decision
        self._warned_syncs = self._warned_fresh = False
        self.detached = False

    @property
    def weights(self) -> dict[str, Tensor]:
        """The parameters the replica check reads (``replicated_weights``), those still alive: the
        monitor keeps weak references, so that it never keeps a model (and through DDP's reducer,
        its process group) alive past its owner."""
        live = {n: r() for n, r in self._weights.items()}
        return {n: p for n, p in live.items() if p is not None}

    @weights.setter
    def weights(self, params: Mapping[str, Tensor]) -> None:
        self._weights = {n: weakref.ref(p) for n, p in params.items()}

    def claim_monitor(self, *, take: bool = True) -> None:
        """Make this integration the one whose steps its ``Monitor`` decides (``Monitor.stepped_by``):
        at registration, and again at each step (for a hook registered by a framework itself);
        ``take=False`` only checks that it could.

        Raises:
            UsageError: the monitor decides another integration's steps that is not detached (two
                models given one ``Monitor``: their gradients would share one history).
        """
        owner = self.monitor.stepping()
        if owner is self:  # every step of its own: nothing to change
            return
        if owner is not None:
            raise UsageError(f"this Monitor already decides the steps of another {type(owner).__name__}: two "
                             "models' gradients in one history mean nothing; give each model its own Monitor "
                             "(or detach() the other first)", field="monitor")
        if take:
            self.monitor.stepped_by = weakref.ref(self)

    def detach(self) -> None:
        """Remove what this monitor registered; it neither reads, gathers nor acts from now on.

        The optimizer step pre-hooks of ``attach`` are removed. What the framework holds stays
        registered where the framework cannot remove it (DDP takes one communication hook per
        model, for good): the integration then passes every bucket straight to the inner hook
        (``MonitorHook``) or restores the framework's own collective (``FSDPMonitor``). Call it
        between steps, on every rank: detached between a flagged decision and ``optimizer.step()``,
        ``skip`` or ``raise`` no longer acts on it, and rank 0 says so. Idempotent.
        """
        if self._unapplied() and self.monitor.rank == 0:
            d = self.decision
            warn_caller(f"naig.monitor detached before optimizer.step() applied {self.action} to step "
                        f"{d.step}'s decision ({d.describe()}): the step goes on unchecked; detach after "
                        "optimizer.step()")
        for _, handle in self._optimizers:
            handle.remove()
        self._optimizers, self.decision, self.parts, self.detached = [], None, [], True
        self._grads, self._stepped = {}, set()
        self._gathered, self._weights_row = None, None  # no collective's work or buffer kept alive

    def _unapplied(self) -> bool:
        """Whether the latest decision is flagged and ``skip`` or ``raise`` has yet to act on it."""
        d = self.decision
        if d is None or not d.flagged or self.action not in _NEED_OPTIMIZER:
            return False
        if self.action == "raise":
            return self._raised is not d
        alive = [opt for ref, _ in self._optimizers if (opt := ref()) is not None]
        return gradient_flagged(d) and any(self._applied.get(id(opt)) is not d for opt in alive)

    # ---------------------------------------------------------------- the optimizer side

    def attach(self, optimizer: torch.optim.Optimizer) -> GradientMonitor:
        """Apply ``skip`` / ``raise`` before ``optimizer.step()`` (a step pre-hook); returns self.

        A framework's wrapper that holds the torch optimizer as ``.optimizer`` and has no step hooks of
        its own (Accelerate's ``AcceleratedOptimizer``, Lightning's ``LightningOptimizer``) is attached
        through that torch optimizer, which its ``step()`` calls.

        Raises:
            UsageError: not a ``torch.optim.Optimizer`` (nor such a wrapper), or the monitor is detached.
        """
        optimizer = _torch_optimizer(optimizer)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise UsageError(f"got {a_type(optimizer)}; pass a torch.optim.Optimizer",
                             field="optimizer")
        if self.detached:
            raise UsageError("this monitor is detached; make a new one", field="optimizer")
        handle = optimizer.register_step_pre_hook(self._pre_step)
        self._optimizers.append((weakref.ref(optimizer), handle))
        return self

    def _pre_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> tuple | None:
        """Apply the action now, or after the closure's backward when ``step`` is given one.

        ``args`` holds the optimizer itself first (torch passes ``step``'s own arguments).
        """
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if closure is None:
            self._apply(optimizer)
            return None

        def wrapped() -> Any:
            loss = closure()
            self._apply(optimizer)
            return loss

        if "closure" in kwargs:
            return args, {**kwargs, "closure": wrapped}
        return (args[0], wrapped, *args[2:]), kwargs

    def _apply(self, optimizer: torch.optim.Optimizer) -> None:
        """The latest decision's action on this optimizer (once per decision for ``skip``).

        The latest decision judged the gradient this step uses when only the last micro-batch is
        reduced (``no_sync()``; FSDP2 ``set_requires_gradient_sync(False)``). A loop that reduces every
        micro-batch makes each a decision, and only the last one's acts here: ``_note`` says so.
        """
        self._stepped.add(id(optimizer))
        d = self.decision
        if d is None or not d.flagged:
            return
        if self.action == "raise":
            self._raised = d
            raise d.error()
        if self.action == "skip" and gradient_flagged(d) and self._applied.get(id(optimizer)) is not d:
            self._applied[id(optimizer)] = d  # the decision itself: a step number repeats after a rollback
            for group in optimizer.param_groups:
                for p in group["params"]:
                    p.grad = None

    def _note(self, decision: Decision) -> None:
        """Say once, on rank 0, what a decision finds about the attached optimizers: a resumed optimizer
        under a monitor that starts afresh; a gradient still accumulating since the previous decision
        (the same gradient tensor, no ``optimizer.step()`` between: every micro-batch is reduced)."""
        if self.monitor.rank != 0 or (self._warned_syncs and self._warned_fresh):
            return  # both lines are rank 0's, once each: nothing left to track
        seen: set[int] = set()
        for ref, _ in self._optimizers:
            opt = ref()
            if opt is None or id(opt) in seen:  # attached twice: one optimizer
                continue
            key = id(opt)
            seen.add(key)
            grad = _first_grad(opt)
            before = self._grads.get(key)
            if self.grads_after_decision:  # FSDP2: an earlier micro-batch's gradient waited at the first part
                accumulating = key not in self._stepped and key in self._grads and key in self._held
            else:  # DDP: the same gradient tensor, accumulated into (a new one after zero_grad())
                accumulating = key not in self._stepped and grad is not None and before is not None and \
                    before() is grad
            self._stepped.discard(key)
            self._grads[key] = weakref.ref(grad) if grad is not None else None
            if decision.step == 1 and _has_stepped(opt) and not self._warned_fresh:
                self._warned_fresh = True  # a resumed run whose monitor state was not loaded
                warmup = self.monitor.detector.warmup if self.monitor.detector is not None else 0
                warn_caller(f"naig.monitor starts afresh at step 1 (a warm-up of {warmup} steps) while the "
                            "optimizer has stepped before: resuming a run? load the Monitor's state_dict() "
                            "saved with the checkpoint")
            if accumulating and not self._warned_syncs:
                self._warned_syncs = True
                acts = f", and {self.action} acts on the last one's decision only" \
                    if self.action in _NEED_OPTIMIZER else ""
                warn_caller(f"naig.monitor decided twice on one gradient tensor with no optimizer.step() "
                            f"between (its steps {decision.step - 1} and {decision.step}): if the loop "
                            "reduces every micro-batch of an accumulation (no DDP no_sync(), FSDP2 "
                            f"set_requires_gradient_sync(False)), each is a monitor step{acts}")

    def _check_attached(self) -> None:
        if self.action in _NEED_OPTIMIZER and not any(ref() is not None for ref, _ in self._optimizers):
            raise UsageError(f"needs the optimizer: call hook.attach(optimizer) before training "
                             f"(the {self.action} action is applied before optimizer.step())",
                             field="action", value=self.action)

    # ---------------------------------------------------------------- the step's parts

    def _begin_step(self) -> None:
        self._check_attached()
        self.claim_monitor()
        self.step, self.parts, self.extra_bytes = self.step + 1, [], 0
        self._gathered: Callable[[], Tensor] | None = None  # the step's all-gather, from its last part
        self._weights_row: Tensor | None = None  # this step's replica-check row (naig.monitor.replicas)
        if not self.monitor.hosts and self.monitor.world > 1:
            self.extra_bytes += HOST_BYTES + SETUP_BYTES
        if self.grads_after_decision and self.monitor.rank == 0 and not self._warned_syncs:  # for _note
            self._held = {id(opt) for ref, _ in self._optimizers
                          if (opt := ref()) is not None and _first_grad(opt) is not None}

    def _names(self, params: list[Tensor]) -> tuple[str, ...]:
        return tuple(self.names.get(id(p), f"param{i}") for i, p in enumerate(params))

    def _sketch(self, key: tuple, layout: tuple[tuple[str, int], ...], device: torch.device) -> MonitorSketch:
        """The part's sketch, built once per (parameters, device); names key the hashes."""
        if key not in self._sketches:
            if len({n for n, _ in layout}) != len(layout):
                raise UsageError("parameter names repeat in a bucket; pass the module the framework wraps",
                                 field="module")
            m = self.monitor
            self._sketches[key] = MonitorSketch.build(layout, m.seed, m.blocks, device)
        return self._sketches[key]

    def _add_part(self, index: int, names: tuple[str, ...], payload: Tensor, last: bool) -> _Part:
        """Keep a part's payload; at the step's ``last`` part start the step's one all-gather of them
        (before that part is reduced: see ``Monitor.start_gather``)."""
        part = _Part(index, names, payload)
        if not self.parts and self._weights and self.monitor.world > 1:  # read before any reduction ends
            due = self.monitor.weights_due()
            weights = (self.weights or None) if due else None  # None: "not given" (the model is gone)
            self._weights_row = self.monitor.weights_row(weights, payload.device, due=due)
        self.parts.append(part)
        if last:
            stacked = torch.stack([p.payload for p in self.parts])
            rows = stacked if self.per_bucket else stacked.sum(dim=0, keepdim=True)
            if self._weights_row is not None:  # the replica check's row rides in the same all-gather
                rows = torch.cat([rows, self._weights_row[None].to(rows.device)])
            sent = self._with_lost(rows)
            self.extra_bytes += sent.numel() * sent.element_size()
            self._gathered = self.monitor.start_gather(sent, self._setup)  # called at the first step only
        return part

    def _setup(self) -> str:
        """What besides the payload's shape makes this rank's collectives differ from another's (checked
        alike on every rank at the first step: ``Monitor.start_gather``)."""
        return f"{self.part_kind}s per_bucket={int(self.per_bucket)} exact={int(self.exact)}"

    def _with_lost(self, payloads: Tensor) -> Tensor:
        """(P, m + 2) payloads, each row with this rank's ``Monitor.state_word`` appended (the count of
        records its writers lost, so every rank learns of it, and its monitor state's fingerprint):
        (P, m + 3)."""
        word = torch.full((payloads.shape[0], 1), self.monitor.state_word(), dtype=torch.float64,
                          device=payloads.device)  # exact only in float64 (an integer below 2**53)
        return torch.cat([payloads.to(torch.float64), word], dim=1)

    def _finish(self, exact: tuple[float, float] | None = None) -> Decision:
        """Wait for the step's all-gather, decide, keep the decision for the optimizer hook.

        The parts' payloads (B, m + 2) travel together (``per_bucket``) or summed (1, m + 2), each row
        with this rank's lost-record count, in one all-gather started at the last part: a payload of
        ~16 floats costs a collective's latency, not its bytes, so one gather per step beats one per
        part (measured with gloo: ~0.5 ms of CPU per all-gather call; docs/monitor.md).
        """
        rows = self._gathered()  # (K, B or 1, m + 3)
        per_part = rows.to(torch.float64).numpy()
        self.monitor.note_gathered_lost(self.monitor.check_states(per_part[:, 0, -1]))
        per_part, checked = per_part[:, :, :-1], None
        if self._weights_row is not None:
            per_part, checked = per_part[:, :-1], per_part[:, -1]
        dots = dists = None
        if exact is not None:
            mine = torch.tensor(exact, dtype=torch.float64)
            self.extra_bytes += 16
            both = self.monitor.all_gather(mine).numpy()
            dots, dists = both[:, 0], both[:, 1]
        names = [p.names for p in self.parts] if self.per_bucket else None
        self.decision = self.monitor.decide(per_part.sum(axis=1), dots=dots, sq_dists=dists, weights=checked,
                                            where=lambda d: _where(d, per_part, names, self._label),
                                            acts=True)  # the hook applies skip and exclude
        self._note(self.decision)
        return self.decision

    def _label(self, part: int) -> str:
        p = self.parts[part]
        shown = ", ".join(p.names[:2]) + (", …" if len(p.names) > 2 else "")
        return f"{self.part_kind} {p.index} ({shown}; {len(p.names)} parameters)"


def check_exact(exact: object, action: str) -> bool:
    """``exact`` (exact statistics from DDP's all-reduced mean) as given, refused unless a bool or
    with ``exclude``, which changes that mean.

    Raises:
        UsageError: naming ``exact``.
    """
    if not isinstance(exact, bool):
        raise UsageError("must be True or False", field="exact", value=exact)
    if exact and action == "exclude":
        raise UsageError("exact statistics need DDP's own mean; exclude changes it (use exact=False)",
                         field="exact", value=exact)
    return exact


def check_callback_options(monitor: object, exact: object, per_bucket: object, per_rank: object
                           ) -> Monitor:
    """A framework callback's options, checked when it is built (until 2026-12-07 some were checked only
    when training started, so never on one process); returns the monitor (a default one for None).

    Raises:
        UsageError: naming the first bad option.
    """
    if monitor is not None and not isinstance(monitor, Monitor):
        raise UsageError(f"got {a_type(monitor)}; pass naig.monitor.Monitor(...)", field="monitor")
    for name, value in (("per_bucket", per_bucket), ("per_rank", per_rank)):
        if not isinstance(value, bool):
            raise UsageError("must be True or False", field=name, value=value)
    monitor = monitor if monitor is not None else Monitor()
    check_exact(exact, monitor.action)
    return monitor


def _torch_optimizer(optimizer: object) -> object:
    """The torch optimizer inside a framework's optimizer wrapper (an ``Optimizer`` whose ``.optimizer``
    is one, with no step hooks of its own, as Accelerate's, or sharing the inner one's, as Lightning's
    copy of its ``__dict__``), else ``optimizer`` itself (a learning-rate scheduler, which holds one
    too, is no optimizer: refused by ``attach``)."""
    inner = getattr(optimizer, "optimizer", None)
    if not isinstance(optimizer, torch.optim.Optimizer) or not isinstance(inner, torch.optim.Optimizer) \
            or inner is optimizer:
        return optimizer
    own = getattr(optimizer, "_optimizer_step_pre_hooks", None)
    return inner if own is None or own is getattr(inner, "_optimizer_step_pre_hooks", None) else optimizer


def replicated_weights(module: nn.Module, monitor: Monitor, ignore: Collection[str] = ()
                       ) -> dict[str, Tensor]:
    """The parameters the replica check compares (``naig.monitor.replicas``): the float ones but
    ``ignore`` (the names DDP leaves unsynchronised, ``DistributedDataParallel.parameters_to_ignore``).

    Empty (no check) when ``weights_every`` is 0, or when a parameter is a sharded DTensor (each rank
    holds another shard: a ``UserWarning`` says the check is off, or, when ``weights_every`` was
    given, a ``UsageError``).

    Raises:
        UsageError: ``weights_every`` given for a model with sharded DTensor parameters.
    """
    if monitor.replicas.every == 0:
        return {}
    params = {n: p for n, p in module.named_parameters() if p.is_floating_point() and n not in ignore}
    from torch.distributed.tensor import DTensor

    sharded = next((n for n, p in params.items() if isinstance(p, DTensor)
                    and not all(pl.is_replicate() for pl in p.placements)), None)
    if sharded is None:
        return params
    why = f"parameter {sharded!r} is a sharded DTensor: each rank holds another shard, nothing to compare"
    if monitor.weights_asked:
        raise UsageError(f"{why}; pass weights_every=0", field="weights_every", value=monitor.weights_asked)
    warn_caller(f"naig.monitor: the replica check is off ({why}); weights_every=0 silences this")
    return {}


def _where(decision: Decision, per_part: np.ndarray, names: list[tuple[str, ...]] | None,
           label: Callable[[int], str]) -> Mapping[int, str]:
    """For each flagged rank, the part where its gradient departs most (see the module).

    Args:
        decision: the step's decision.
        per_part: (K, B, m + 2) every rank's per-part payloads.
        names: the parts' parameter names (None: one summed part, nothing to name).
        label: part index → its description.
    """
    if names is None or per_part.shape[1] < 1:
        return {}
    sk, sq, bad = per_part[:, :, :-2], per_part[:, :, -2], per_part[:, :, -1]
    flagged = set(decision.ranks)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        finite = np.isfinite(sk).all(axis=2) & np.isfinite(sq) & (bad == 0)  # (K, B)
        clean = np.array([r not in flagged for r in range(per_part.shape[0])]) & finite.all(axis=1)
        out = {}
        for r in decision.ranks:
            signals = {f.signal for f in decision.flags if f.rank == r}
            if signals == {"weights"}:  # the replica check names the weights, not a part of the gradient
                continue
            if not finite[r].all():
                parts = np.flatnonzero(~finite[r])
                out[r] = "; ".join(label(int(b)) for b in parts[:2]) + ("; …" if len(parts) > 2 else "")
                continue
            others = clean.copy()
            others[r] = False
            if not others.any():
                continue
            if "norm" in signals:
                logs = np.log(np.maximum(sq, 1e-300))
                score = np.abs(logs[r] - np.median(logs[others], axis=0))
            else:
                mean = sk[others].mean(axis=0)  # (B, m)
                d = ((sk - mean) ** 2).sum(axis=2)  # (K, B)
                score = d[r] / np.maximum(np.median(d[others], axis=0), 1e-300)
            if np.isfinite(score).any():
                out[r] = label(int(np.nanargmax(score)))
    return out


def _first_grad(optimizer: torch.optim.Optimizer) -> Tensor | None:
    """The gradient of the optimizer's first parameter that has one (None: none has)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                return p.grad
    return None


def _has_stepped(optimizer: torch.optim.Optimizer) -> bool:
    """The optimizer's state shows a step taken: a positive ``step`` (Adam; Adagrad creates it at 0),
    ``n_iter`` (LBFGS, which creates its state before the closure), or state without either (SGD's
    momentum buffer)."""
    for state in optimizer.state.values():
        if not isinstance(state, Mapping) or not state:
            continue
        count = state.get("step", state.get("n_iter"))
        if count is None or float(count) > 0:
            return True
    return False
