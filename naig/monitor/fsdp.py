"""The monitor inside FSDP2 (``torch.distributed.fsdp.fully_shard``): a custom reduce-scatter.

Call it on the root module after ``fully_shard``, then attach the optimizer::

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    watch = fully_shard_monitor(model, Monitor(action="skip"))
    watch.attach(optimizer)

FSDP2 reduces each FSDP module's gradients with one reduce-scatter per backward pass; its input
is this rank's *unsharded* gradient of the module's parameters (each parameter cut into K row
chunks, padded, chunk i of every parameter in row i: FSDP's ``chunk_cat`` layout). Through
``FSDPModule.set_custom_reduce_scatter`` the monitor sees that input before the collective:

1. it packs [S g | ‖g‖² | non-finite count] of this rank's part (the ``MonitorSketch`` of the
   module's parameters, keyed by their names, its hash arrays permuted into the reduce-scatter
   layout and zero-weighted on the padding: the sum over modules is the sketch of the whole
   gradient, as ``Monitor.observe`` and ``MonitorHook`` compute it) and keeps it (the step's
   payloads are all-gathered together, once, at the last module; ``per_bucket=False``: their sum);
2. it calls the module's own reduce-scatter with the same tensors (FSDP's bytes, unchanged:
   in ``log`` mode training is bit-identical);
3. at the step's last reduce-scatter (every FSDP module with trainable parameters has reduced
   once) it decides (``naig.monitor.integration.GradientMonitor``), the same on every rank.

**Actions**: ``log``, ``warn``, ``skip`` and ``raise`` as for DDP (``skip`` and ``raise`` through
``attach(optimizer)``). ``exclude`` is refused: the decision needs the whole step's gradient,
and FSDP has already reduce-scattered the earlier modules by then (holding them back would
keep every unsharded gradient alive, FSDP's memory saving gone).

**Sketched, not exact**: after the reduce-scatter a rank holds only its shard of ḡ; the exact
⟨g_k, ḡ⟩ would need another gradient-sized collective (an all-gather of ḡ, or an all-to-all of
the inputs with the same bytes as the reduce-scatter), so cos and distance are sketch
estimates (``RankSignals.exact``).

**HSDP** (a 2-D mesh: reduce-scatter within a shard group, then an all-reduce across
replicas): every rank still reduce-scatters its own whole gradient first, so the custom
reduce-scatter sees every rank's input; the monitor's all-gather runs over its own
``Monitor(process_group=...)`` (default: every rank), so all ranks of all replicas are
compared (tested on a 2 × 2 mesh of 4 ranks). ``set_all_reduce_hook`` is not used: it sees only
the reduced output.

**Requirements**: every FSDP module with trainable parameters reduces at every step (a module
whose parameters got no gradient skips its reduce-scatter: set
``set_reduce_scatter_unused_params(True)`` on it, else ``loss.backward()`` ends with a
``DataError`` naming it, checked once the backward pass has finished); parameters
sharded on dim 0 (the default ``Shard(0)``); one parameter group per module; 2 ranks or more
in the shard group (with one, FSDP skips the reduce-scatter: refused).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.fsdp import FSDPModule

from naig.errors import DataError, UsageError
from naig.monitor.integration import GradientMonitor
from naig.monitor.observe import Monitor
from naig.monitor.signals import MonitorSketch, pack

__all__ = ["FSDPMonitor", "MonitorReduceScatter", "fully_shard_monitor"]


def fully_shard_monitor(module: nn.Module, monitor: Monitor | None = None, *,
                        per_bucket: bool = True) -> FSDPMonitor:
    """Monitor every FSDP module under ``module`` (the root, after ``fully_shard``).

    Args:
        module: the root module; it and/or its submodules are ``FSDPModule``s.
        monitor: the ``Monitor`` (default ``Monitor()``: log only).
        per_bucket: one all-gather per FSDP module (names it) or one per step.

    Returns:
        The ``FSDPMonitor`` (``attach(optimizer)`` it for ``skip`` / ``raise``).

    Raises:
        UsageError: no FSDP module, ``exclude``, a parameter not sharded on dim 0, several
            parameter groups in one module, a module sharded over 1 rank.
    """
    return FSDPMonitor(module, monitor, per_bucket=per_bucket)


class FSDPMonitor(GradientMonitor):
    """The monitor's state for FSDP2: one ``MonitorReduceScatter`` per FSDP module (see the module).

    Attributes:
        comms: the custom reduce-scatters, one per FSDP module with trainable parameters.
    """

    part_kind = "module"
    replicated = False  # sharded weights: no replicas to compare (naig.monitor.replicas)
    grads_after_decision = True  # FSDP writes a module's sharded gradient after its reduce-scatter

    def __init__(self, module: nn.Module, monitor: Monitor | None = None, *, per_bucket: bool = True) -> None:
        super().__init__(module, monitor, per_bucket=per_bucket)
        if self.monitor.weights_asked:
            raise UsageError("FSDP2 shards the weights, so no two ranks hold the same ones to compare: "
                             "pass Monitor(weights_every=0) or leave it unset", field="weights_every",
                             value=self.monitor.weights_asked)
        if self.action == "exclude":
            raise UsageError("exclude needs the whole step's gradient before any reduction; FSDP2 reduce-"
                             "scatters module by module (use skip or raise)", field="action", value="exclude")
        self.claim_monitor(take=False)  # before any module's reduce-scatter is replaced
        self.comms: list[MonitorReduceScatter] = []
        self._modules: list[FSDPModule] = []
        fqns = {id(m): n for n, m in module.named_modules()}
        for sub in module.modules():
            if not isinstance(sub, FSDPModule):
                continue
            groups = sub._get_fsdp_state()._fsdp_param_groups
            if len(groups) > 1:
                raise UsageError("an FSDP module with several parameter groups (shard_placement_fn "
                                 "meshes) is not supported", field="module", value=fqns[id(sub)] or "root")
            params = [fp for g in groups for fp in g.fsdp_params if fp.sharded_param.requires_grad]
            if not params:
                continue
            if getattr(groups[0].mesh_info, "shard_mesh_size", 1) < 2:
                raise UsageError("is not sharded (1 rank in its shard group): FSDP reduces it without "
                                 "a reduce-scatter, which is where the monitor reads; shard over 2 ranks or "
                                 "more, or use MonitorHook (DDP) or Monitor.observe", field="module",
                                 value=fqns[id(sub)] or "root")
            comm = MonitorReduceScatter(self, len(self.comms), fqns[id(sub)] or "root", params,
                                        groups[0]._reduce_scatter_comm)
            sub.set_custom_reduce_scatter(comm)
            self.comms.append(comm)
            self._modules.append(sub)
        if not self.comms:
            raise UsageError("no FSDP module with trainable parameters: call fully_shard first",
                             field="module")
        self.claim_monitor()
        self._calls: set[int] = set()
        self._recheck = False  # the completeness check came at the end of a nested backward pass

    def detach(self) -> None:
        """Give every FSDP module back the reduce-scatter it had and remove the optimizer hooks.

        Call it between steps, on every rank; idempotent.
        """
        for sub, comm in zip(self._modules, self.comms, strict=True):
            sub.set_custom_reduce_scatter(comm.inner)
        self._modules, self._calls = [], set()
        super().detach()

    def reduce(self, comm: MonitorReduceScatter, output: Tensor, input: Tensor, group: dist.ProcessGroup,
               op: Any, async_op: bool) -> Any:
        """One module: payload (and its gather), FSDP's own reduce-scatter, decide after the last."""
        if not self._calls:
            self._begin_step()
            _at_end_of_backward(self._check_complete)
        if comm.index in self._calls:
            raise DataError(f"FSDP module {comm.fqn} reduced twice before every module reduced once: "
                            "a module got no gradient this step; call set_reduce_scatter_unused_params(True) "
                            "on it")
        self._calls.add(comm.index)
        if self._recheck:  # a nested backward ended before this pass's end: check at the end of this one
            self._recheck = False
            _at_end_of_backward(self._check_complete)
        world = group.size() if group is not None else 1
        self._add_part(comm.index, comm.names, pack(input, comm.sketch(world, input)),
                       len(self._calls) == len(self.comms))
        work = comm.inner(output, input, group, op, async_op)
        if len(self._calls) == len(self.comms):
            self._calls = set()
            self._finish()
        return work

    def _label(self, part: int) -> str:
        p = self.parts[part]
        shown = ", ".join(p.names[:2]) + (", …" if len(p.names) > 2 else "")
        return f"module {self.comms[p.index].fqn} ({shown}; {len(p.names)} parameters)"

    def _fsdp_pass_open(self) -> bool:
        """Whether FSDP's own final callback of the current backward pass is still to run (its state's
        ``post_backward_final_callback_queued``): true at the end of a backward nested in it, as
        reentrant activation checkpointing runs one per checkpointed block."""
        ctxs = [getattr(m._get_fsdp_state(), "_state_ctx", None) for m in self._modules]
        return any(getattr(c, "post_backward_final_callback_queued", False) for c in ctxs)

    def _check_complete(self) -> None:
        """At the end of the backward pass: every monitored module reduced, or a ``DataError``.

        A module whose parameters got no gradient skips its reduce-scatter; without this check the
        step's decision would wait for the next step's first module and every later decision would
        mix two steps' gradients (a NaN then passed ``skip``). Started by the step's first
        reduce-scatter; at the end of a backward nested in FSDP's (reentrant activation
        checkpointing) it waits for the outer pass's end instead. The step's parts are dropped
        first, so a caller that catches the error and sets
        ``set_reduce_scatter_unused_params(True)`` starts the next step afresh.
        """
        if not self._calls:  # every module reduced: decided at the last one
            return
        if self._fsdp_pass_open():  # a nested backward (reentrant checkpointing) inside FSDP's pass
            self._recheck = True
            return
        missing = [c.fqn for c in self.comms if c.index not in self._calls]
        self._calls, self.parts = set(), []
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise DataError(f"FSDP module(s) {shown} did not reduce-scatter at monitor step {self.step}: their "
                        "parameters got no gradient; call set_reduce_scatter_unused_params(True) on them")


class MonitorReduceScatter:
    """A ``torch.distributed.fsdp.ReduceScatter``: the monitor's payload, then the module's own one.

    Args:
        owner: the ``FSDPMonitor``.
        index: this module's index among the monitored ones.
        fqn: the module's name in the root (``root`` for the root).
        params: the module's ``FSDPParam``s, in FSDP's order.
        inner: the reduce-scatter FSDP would have used (called with the same tensors).

    Raises:
        UsageError: a parameter sharded on another dim than 0.
    """

    def __init__(self, owner: FSDPMonitor, index: int, fqn: str, params: list, inner: Any) -> None:
        self.owner, self.index, self.fqn, self.inner = owner, index, fqn, inner
        bad = [fp for fp in params if fp.fsdp_placement.dim != 0]
        if bad:
            dim = bad[0].fsdp_placement.dim
            raise UsageError(f"parameters of {fqn} are sharded on dim {dim}; the monitor reads FSDP's "
                             "Shard(0) layout only", field="module", value=fqn)
        self.names = tuple(owner.names.get(id(fp.sharded_param), f"param{i}") for i, fp in enumerate(params))
        self.sizes = tuple(tuple(fp._orig_size) for fp in params)
        self._sketch: MonitorSketch | None = None

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> Tensor:
        """FSDP's own allocation (the module's reduce-scatter's)."""
        return self.inner.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: Tensor, input_tensor: Tensor, group: dist.ProcessGroup, op: Any,
                 async_op: bool = False) -> Any:
        return self.owner.reduce(self, output_tensor, input_tensor, group, op, async_op)

    def sketch(self, world: int, flat: Tensor) -> MonitorSketch:
        """The module's sketch of the reduce-scatter layout of ``world`` ranks (built once).

        Its segments (``layout_segments``: one per parameter and rank row) say which input entries
        are which parameter's flat indices; nothing of the input's size is built.

        Raises:
            DataError: the input's length is not that of every parameter's padded gradient.
        """
        if self._sketch is None or self._sketch.numel != flat.numel():
            segments, total = layout_segments(self.sizes, world)
            if total != flat.numel():
                raise DataError(f"FSDP module {self.fqn} reduce-scattered {flat.numel()} values, its "
                                f"parameters make {total}: a parameter got no gradient; call "
                                "set_reduce_scatter_unused_params(True) on it")
            m = self.owner.monitor
            self._sketch = MonitorSketch.from_segments(self.names, segments, total, m.seed, m.blocks)
        return self._sketch


def _at_end_of_backward(callback: Any) -> None:
    """Run ``callback`` once the current backward pass and every final callback queued during it have
    run (FSDP's own, which reduce-scatters the modules whose post-backward hook never fired, e.g. a
    first layer whose input needs no gradient; it may be queued after this call): a final callback
    that queues ``callback`` at the end of the list. Nothing outside a backward pass."""
    engine = torch.autograd.Variable._execution_engine
    try:
        engine.queue_callback(lambda: engine.queue_callback(callback))
    except RuntimeError:  # not inside a backward pass (a reduce-scatter called by hand)
        pass


def layout_segments(sizes: tuple[tuple[int, ...], ...], world: int) -> tuple[np.ndarray, int]:
    """FSDP's reduce-scatter input as segments of the parameters (``LayoutSketch.from_segments``).

    The same layout as ``layout_permutation`` without an array of the input's size: row i of the
    input holds, per parameter p, its dim-0 rows i·c … (i + 1)·c − 1 (c = ⌈d0 / world⌉), the
    ones past d0 padding.

    Args:
        sizes: each parameter's unsharded shape, in FSDP's order.
        world: K, the ranks of the reduce-scatter.

    Returns:
        ((world · P, 4) int64 rows (offset, length, start, parameter) with padding left out, the
        input's length).
    """
    rows, off = [], 0
    for i in range(world):
        for p, s in enumerate(sizes):
            d0 = s[0] if s else 1
            width = math.prod(s[1:]) if len(s) > 1 else 1
            chunk = math.ceil(d0 / world)
            valid = min(max(d0 - i * chunk, 0), chunk)
            rows.append((off, valid * width, i * chunk * width, p))
            off += chunk * width
    return np.array(rows, dtype=np.int64).reshape(-1, 4), off


def layout_permutation(sizes: tuple[tuple[int, ...], ...], world: int) -> np.ndarray:
    """Where each entry of FSDP's reduce-scatter input comes from in the parameters' flat layout.

    FSDP pads each parameter's dim 0 to a multiple of ``world``, cuts it into ``world`` row
    chunks and lays chunk i of every parameter in row i of the input (``chunk_cat``).

    Args:
        sizes: each parameter's unsharded shape, in FSDP's order.
        world: K, the ranks of the reduce-scatter.

    Returns:
        (input length,) int64: the flat index of the entry, −1 for padding.
    """
    offsets = np.cumsum([0, *(math.prod(s) for s in sizes)])
    rows = []
    for i in range(world):
        for s, off in zip(sizes, offsets[:-1], strict=False):
            d0 = s[0] if s else 1
            width = math.prod(s[1:]) if len(s) > 1 else 1
            chunk = math.ceil(d0 / world)
            r = np.arange(i * chunk, (i + 1) * chunk)
            idx = off + r[:, None] * width + np.arange(width)[None, :]
            rows.append(np.where((r < d0)[:, None], idx, -1).reshape(-1))
    return np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, dtype=np.int64)
