"""NAIG routing inside ``DistributedDataParallel``: a communication hook (docs/design.md §14).

(Moved here from ``naig.distributed.ddp``, which re-exports it. For per-rank signals, a bad
rank's name and actions, use ``naig.monitor.MonitorHook``; this hook computes E, π and cos per
bucket and can route the all-reduce by π.)

Register it with ``NaigCommHook(model).register(ddp)`` (that is,
``ddp.register_comm_hook(NaigCommHook(model), naig_comm_hook)``). For each bucket of
K ranks' gradients g_k (the bucket's slice of each rank's gradient) the hook

1. sketches its own bucket, s_k = S g_k (14 floats; the parameters' names key the hash,
   so the sketch of all buckets together is the sketch of the state dict), and all-gathers
   the sketches as float32: 56 B per rank;
2. computes, identically on every rank, E_k = (s_k − s̄)ᵀ Ψ (s_k − s̄) against the mean
   sketch s̄ (of the finite ones) and π = Gibbs(E) (β = ``beta``, ``auto``: 1 / median of
   the positive E_k; a non-finite E_k gets π_k = 0);
3. with ``route=True`` scales its bucket by K·π_k (zeroes it when π_k = 0, so a NaN
   bucket cannot poison the sum); then divides by K and all-reduces (sum), as DDP does:
   the result is Σ_k π_k g_k with routing, the mean (1/K) Σ_k g_k without;
4. with ``cos=True`` waits for the all-reduce, computes cos_k between its own g_k and the
   all-reduced result ḡ (float64), and all-gathers the K values (8 B per rank, float64);
5. logs a ``HookRecord`` (a callback on every rank; rank 0 appends CSV rows).

**Two ranks.** Against the mean, d₀ = −d₁, so E₀ = E₁ whenever both are finite: π is
uniform, routing cannot prefer a rank and E/π cannot name a bad one (a non-finite rank is
still given π = 0). The hook warns (``UserWarning``, once) when it learns that the group has
2 ranks: at construction if the process group exists, else at ``register()``, else at
the first bucket. Use 3 ranks or more to compare ranks.

**CSV.** ``csv_path`` is checked at construction (on rank 0, or everywhere before
``init_process_group``): its directory must exist, and an existing file is refused unless
``append=True``; then rows continue the file's step count (the file's last step + the
hook's step), so a second run never restarts at step 1 in the same file.

With ``route=False`` the all-reduce receives exactly the bytes plain DDP sends (the same
multiplication by 1/K, the same all-reduce), so training is bit-identical to DDP without
the hook (tested with 3 ranks). With ``cos=False`` the hook returns the all-reduce's
future at once (communication overlaps the rest of the backward pass); with ``cos=True``
it waits inside the hook, the price of sharing every rank's cos.

Example (not run here; see examples/ddp_gpt.py)::

    ddp = DistributedDataParallel(model)
    hook = NaigCommHook(model, route=False, csv_path="naig_ddp.csv").register(ddp)
"""

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from naig.energy import energy
from naig.errors import UsageError, a_type, warn_caller
from naig.gibbs import naig_weights, parse_beta, resolve_beta
from naig.metric import fano_fisher_metric, parse_line
from naig.sketch.core import SKETCH_DIM, check_seed
from naig.sketch.layout_sketch import LayoutSketch

__all__ = ["HookRecord", "NaigCommHook", "naig_comm_hook", "energies_to_mean", "TWO_RANKS"]

_HEADER = ["step", "bucket", "rank", "energy", "pi", "cos", "beta", "routed"]
TWO_RANKS = ("NaigCommHook with 2 ranks: each rank is measured against the mean, so E_0 = E_1 "
             "whenever both are finite; pi is uniform and routing can only drop a non-finite rank; "
             "use 3 or more ranks to compare ranks")
"""The one-line warning given for a 2-rank group."""


@dataclass(frozen=True)
class HookRecord:
    """What the hook computed for one bucket of one step (the same on every rank but ``rank``).

    Attributes:
        step: backward passes seen (1 for the first).
        bucket: DDP's bucket index.
        rank: the rank that logged it.
        energies: (K,) E_k against the mean sketch.
        pi: (K,) Gibbs weights π_k.
        cos: (K,) cos between each rank's bucket and the all-reduced one (None: ``cos=False``;
            an entry None when a norm is 0 or not finite).
        beta: β used.
        routed: whether the bucket was scaled by K·π_k.
        parameters: the names of the bucket's parameters, in bucket order.
    """

    step: int
    bucket: int
    rank: int
    energies: tuple[float, ...]
    pi: tuple[float, ...]
    cos: tuple[float | None, ...] | None
    beta: float
    routed: bool
    parameters: tuple[str, ...] = ()


def energies_to_mean(sketches: Tensor, psi: Tensor) -> np.ndarray:
    """E_k = (s_k − s̄)ᵀ Ψ (s_k − s̄), s̄ the mean of the finite rows of ``sketches`` (K, 14).

    Returns:
        (K,) float64; NaN for a non-finite row (and for all rows when none is finite).

    Example:
        >>> psi = torch.from_numpy(fano_fisher_metric((1, 2, 4)))
        >>> s = torch.zeros(3, 14, dtype=torch.float64); s[0, 4] = 3.0
        >>> energies_to_mean(s, psi).round(6).tolist()   # s̄[4] = 1: drifts 2, −1, −1 in coordinate 4
        [8.0, 2.0, 2.0]
    """
    s = sketches.to(torch.float64)
    finite = torch.isfinite(s).all(dim=1)
    mean = s[finite].mean(dim=0) if bool(finite.any()) else torch.full((SKETCH_DIM,), math.nan, dtype=s.dtype)
    e = energy(s - mean, psi.to(s.device))
    return torch.where(finite, e, torch.full_like(e, math.nan)).cpu().numpy()


def _weights(e: np.ndarray, beta: float | str) -> tuple[np.ndarray, float]:
    """π and the β used; uniform when no energy is finite (nothing to prefer)."""
    b = resolve_beta(beta, e)
    return naig_weights(e, b), b


class NaigCommHook:
    """A ``register_comm_hook`` hook: sketch, share, weigh, log, optionally route (see the module).

    Args:
        module: the model DDP wraps (or the DDP module itself); its parameter names key the sketch.
        process_group: the group DDP reduces over (None: the default group).
        route: scale each rank's bucket by K·π_k before the mean.
        beta: inverse temperature, a float ≥ 0 or ``"auto"``.
        line: the Fano line ℓ of Ψ_ℓ.
        seed: the sketch seed.
        callback: called with each ``HookRecord`` on every rank.
        csv_path: rank 0 writes rows (step, bucket, rank, energy, pi, cos, beta, routed);
            its directory must exist; an existing file is refused unless ``append``.
        cos: share every rank's cos to the all-reduced bucket (waits for the all-reduce).
        append: continue an existing ``csv_path``: its rows keep their steps, new rows count
            on from its last step.

    Raises:
        UsageError: for a bad ``beta``, ``line`` or ``seed``; a ``csv_path`` whose directory
            does not exist, that is a directory, or that exists without ``append`` (or, with
            it, is not a CSV this hook wrote).

    Warns:
        UserWarning: ``TWO_RANKS`` when the group has 2 ranks (see the module docstring).
    """

    def __init__(self, module: nn.Module, process_group: dist.ProcessGroup | None = None, *,
                 route: bool = False, beta: float | str = "auto", line: Sequence[int] = (1, 2, 4),
                 seed: int = 0, callback: Callable[[HookRecord], None] | None = None,
                 csv_path: str | Path | None = None, cos: bool = True, append: bool = False) -> None:
        if not isinstance(module, nn.Module):
            raise UsageError(f"got {a_type(module)}; pass the model DDP wraps", field="module")
        inner = module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module
        self.names = {id(p): name for name, p in inner.named_parameters()}
        self.group, self.route, self.cos = process_group, route, cos
        self.beta, self.seed = parse_beta(beta), check_seed(seed)
        self.psi = torch.from_numpy(fano_fisher_metric(parse_line(line)))
        self.callback, self.csv_path = callback, None if csv_path is None else Path(csv_path)
        self.step, self.csv_offset = 0, 0
        self.last: list[HookRecord] = []  # the records of the latest step
        self._sketches: dict[tuple[int, ...], LayoutSketch] = {}
        self._warned = False
        if self.csv_path is not None and self._rank_zero():
            self.csv_offset = _check_csv(self.csv_path, append)
        self._warn_two_ranks()

    def _world(self) -> int | None:
        """The group's size, or None before ``init_process_group``."""
        if not dist.is_available() or not dist.is_initialized():
            return None
        return dist.get_world_size(self.group if self.group is not None else dist.group.WORLD)

    def _rank_zero(self) -> bool:
        """Rank 0 of the group, or any process before ``init_process_group``."""
        if self._world() is None:
            return True
        return dist.get_rank(self.group if self.group is not None else dist.group.WORLD) == 0

    def _warn_two_ranks(self, world: int | None = None) -> None:
        world = self._world() if world is None else world
        if world == 2 and not self._warned:
            self._warned = True
            warn_caller(TWO_RANKS)

    def register(self, ddp: nn.parallel.DistributedDataParallel) -> "NaigCommHook":
        """``ddp.register_comm_hook(self, naig_comm_hook)``; returns self.

        Warns:
            UserWarning: ``TWO_RANKS`` when the group has 2 ranks (once per hook).
        """
        ddp.register_comm_hook(self, naig_comm_hook)
        self._warn_two_ranks()
        return self

    def reduce(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """One bucket: sketch, share, weigh, log, (route,) all-reduce; the future of the result."""
        group = self.group if self.group is not None else dist.group.WORLD
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        self._warn_two_ranks(world)
        if bucket.index() == 0:
            self.step, self.last = self.step + 1, []
        buf = bucket.buffer()
        sketches = self._gather(self._sketch(bucket, buf).to(torch.float32), world, group)
        e = energies_to_mean(sketches, self.psi)
        pi, beta = _weights(e, self.beta)
        names = tuple(self.names.get(id(p), f"param{i}") for i, p in enumerate(bucket.parameters()))
        local = buf.clone() if self.cos else None
        if self.route:
            scale = world * float(pi[rank])
            if scale == 0.0:
                buf.zero_()
            else:
                buf.mul_(scale)
        buf.mul_(1.0 / world)  # what DDP itself does before its sum all-reduce
        fut = dist.all_reduce(buf, group=group, async_op=True).get_future()
        if local is None:
            self._log(bucket.index(), rank, e, pi, None, beta, names)
            return fut.then(lambda f: f.value()[0])
        fut.wait()
        cos = self._gather(_cosine(local, buf).reshape(1), world, group).reshape(-1)
        shared = [c if math.isfinite(c) else None for c in cos.tolist()]
        self._log(bucket.index(), rank, e, pi, shared, beta, names)
        done: torch.futures.Future[Tensor] = torch.futures.Future(
            devices=[buf.device] if buf.device.type == "cuda" else None)
        done.set_result(buf)
        return done

    def _sketch(self, bucket: dist.GradBucket, buf: Tensor) -> Tensor:
        """S of this rank's bucket (14,) float64: hashes keyed by the parameter names, computed while
        the bucket is read (``LayoutSketch``: nothing per parameter is stored)."""
        params = bucket.parameters()
        key = tuple(id(p) for p in params)
        if key not in self._sketches:
            layout = [(self.names.get(id(p), f"param{i}"), p.numel()) for i, p in enumerate(params)]
            if len(set(name for name, _ in layout)) != len(layout):
                raise ValueError("parameter names repeat in a bucket; pass the module DDP wraps")
            self._sketches[key] = LayoutSketch.build(layout, self.seed)
        sketch = self._sketches[key]
        flat = buf if buf.numel() == sketch.numel else torch.cat([g.reshape(-1) for g in bucket.gradients()])
        return sketch(flat)[:SKETCH_DIM]

    @staticmethod
    def _gather(x: Tensor, world: int, group: dist.ProcessGroup) -> Tensor:
        out = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(out, x, group=group)
        return torch.stack(out).cpu()

    def _log(self, bucket: int, rank: int, e: np.ndarray, pi: np.ndarray, cos: list | None,
             beta: float, names: tuple[str, ...]) -> None:
        rec = HookRecord(self.step, bucket, rank, tuple(e.tolist()), tuple(pi.tolist()),
                         None if cos is None else tuple(cos), beta, self.route, names)
        self.last.append(rec)
        if self.callback is not None:
            self.callback(rec)
        if self.csv_path is not None and rank == 0:
            self._write(rec)

    def _write(self, rec: HookRecord) -> None:
        new = not self.csv_path.exists()
        step = self.csv_offset + rec.step
        with self.csv_path.open("a", newline="") as fh:
            out = csv.writer(fh)
            if new:
                out.writerow(_HEADER)
            for k, (e, p) in enumerate(zip(rec.energies, rec.pi, strict=True)):
                c = "" if rec.cos is None or rec.cos[k] is None else repr(rec.cos[k])
                out.writerow([step, rec.bucket, k, repr(e), repr(p), c, repr(rec.beta), int(rec.routed)])


def _check_csv(path: Path, append: bool) -> int:
    """Check ``csv_path`` before training; returns the step the file ends at (0: new or empty).

    Raises:
        UsageError: a missing directory, a directory, an existing file without ``append``,
            or (with it) a file that is not this hook's CSV.
    """
    parent = path.absolute().parent
    if not parent.is_dir():
        raise UsageError(f"directory {parent} does not exist; create it or pass another csv_path",
                         field="csv_path", value=str(path))
    if path.is_dir():
        raise UsageError("is a directory; pass a file name, e.g. naig_ddp.csv", field="csv_path",
                         value=str(path))
    if not path.exists() or path.stat().st_size == 0:
        return 0
    if not append:
        raise UsageError("exists; pass append=True to continue its step count, or another csv_path",
                         field="csv_path", value=str(path))
    return _last_step(path)


def _last_step(path: Path) -> int:
    """The largest step of an existing hook CSV (UsageError when it is not one)."""
    try:
        with path.open(newline="") as fh:
            rows = csv.reader(fh)
            if next(rows, None) != _HEADER:
                raise ValueError("header")
            return max((int(row[0]) for row in rows if row), default=0)
    except (ValueError, IndexError, UnicodeDecodeError, OSError) as exc:
        raise UsageError(f"is not a CSV of this hook ({type(exc).__name__}); pass another csv_path",
                         field="csv_path", value=str(path)) from None


def naig_comm_hook(state: NaigCommHook, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The DDP communication hook: ``ddp.register_comm_hook(NaigCommHook(model), naig_comm_hook)``.

    (No postponed annotations in this module: DDP checks these two at registration.)
    """
    return state.reduce(bucket)


def _cosine(x: Tensor, y: Tensor) -> Tensor:
    """cos(x, y) in float64, a 0-d tensor on x's device (NaN when a norm is 0)."""
    xd, yd = x.to(torch.float64), y.to(torch.float64)
    return torch.dot(xd, yd) / (torch.linalg.vector_norm(xd) * torch.linalg.vector_norm(yd))
