"""The arrival model: K workers, their time distributions and the protocol (docs/design.md §10).

Worker i's job n takes C = D + X + U seconds: the downlink D (parameters to the
worker), the compute time X = x0 + b·x1 (x0 from ``compute``, x1 from ``per_sample``,
b the batch size) and the uplink U (gradient to the master). A message costs a
latency draw plus bytes / bandwidth. Modes:

- ``blocking``: the master applies a gradient the moment it arrives and replies with
  the current parameters; the worker waits for them (one job in flight per worker).
- ``non-blocking``: a worker computes back to back, each job on the newest parameters
  it has received.
- ``shared-memory``: blocking with D = U = 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from naig.arrivals.distributions import MEAN_RANGE, Distribution, parse_distributions
from naig.choices import ARRIVAL_MODES
from naig.errors import UsageError, check_seed

__all__ = ["MODES", "MAX_WORKERS", "ArrivalModel", "check_seed"]

MODES = ARRIVAL_MODES  # naig.choices
# Most workers a model may have: each holds per-worker specs, random streams and report rows
# (measured: naig staleness with 100,000 workers and 100,000 updates takes 13 s and 0.23 GB; 10⁸ did not fit).
MAX_WORKERS = 1_000_000


def _per_worker(items: Sequence, k: int, field: str) -> tuple:
    """One value for all workers or one per worker, as a tuple of length k."""
    if len(items) in (0, k):
        return tuple(items)
    if len(items) == 1:
        return tuple(items) * k
    raise UsageError(f"gives {len(items)} values for {k} workers; give one, or one per worker",
                     field=field, value=",".join(map(str, items)))


@dataclass(frozen=True)
class ArrivalModel:
    """K workers' time distributions and the protocol; validated on construction.

    Args:
        compute: x0 per worker (length K; K = its length).
        uplink: latency of the gradient message per worker, or ``()`` for none.
        downlink: latency of the parameter message per worker, or ``()`` for none.
        per_sample: x1 per worker (compute seconds per sample), or ``()``.
        batch_size: b in X = x0 + b·x1; must be 1 without ``per_sample``.
        mode: ``blocking``, ``non-blocking`` or ``shared-memory``.
        bytes_up: bytes of one gradient message (e.g. 4n for n float32).
        bytes_down: bytes of one parameter message.
        bandwidth: bytes/s per worker link (length K), or ``()`` for infinite.

    Example:
        >>> m = ArrivalModel.from_specs("exp:1", workers=4, uplink="const:0.5")
        >>> m.workers, m.mean_cycle().tolist()
        (4, [1.5, 1.5, 1.5, 1.5])
    """

    compute: tuple[Distribution, ...]
    uplink: tuple[Distribution, ...] = ()
    downlink: tuple[Distribution, ...] = ()
    per_sample: tuple[Distribution, ...] = ()
    batch_size: int = 1
    mode: str = "blocking"
    bytes_up: float = 0.0
    bytes_down: float = 0.0
    bandwidth: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "compute", tuple(self.compute))
        k = len(self.compute)
        if any(d.mean <= 0 for d in self.compute):
            raise UsageError("compute times need a mean > 0", field="compute",
                             value=",".join(d.spec for d in self.compute))
        if k == 0:
            raise UsageError("needs at least one worker", field="compute", value=())
        for field in ("uplink", "downlink", "per_sample", "bandwidth"):
            object.__setattr__(self, field, _per_worker(tuple(getattr(self, field)), k, field))
        if self.mode not in MODES:
            raise UsageError(f"use one of {', '.join(MODES)}", field="mode", value=self.mode)
        if self.mode == "shared-memory" and (self.uplink or self.downlink or self.bandwidth):
            field = "uplink" if self.uplink else "downlink" if self.downlink else "bandwidth"
            raise UsageError("shared memory has no messages; drop it or use mode blocking", field=field)
        self._check_numbers()

    def _check_numbers(self) -> None:
        b = self.batch_size
        if isinstance(b, bool) or not isinstance(b, int | np.integer) or b < 1:
            raise UsageError("use an integer >= 1", field="batch_size", value=b)
        if b != 1 and not self.per_sample:
            raise UsageError("scales compute time only with `per_sample` (X = x0 + b·x1)",
                             field="batch_size", value=b)
        for field in ("bytes_up", "bytes_down"):
            v = getattr(self, field)
            if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
                raise UsageError("use a finite number of bytes >= 0", field=field, value=v)
        lo, hi = 1 / MEAN_RANGE[1], 1 / MEAN_RANGE[0]  # transfer times stay within float64
        if any(not (isinstance(w, int | float) and lo <= w <= hi) for w in self.bandwidth):
            raise UsageError(f"use bytes per second > 0, in [{lo:g}, {hi:g}], one or one per worker",
                             field="bandwidth", value=self.bandwidth)

    @classmethod
    def from_specs(cls, compute: str, *, workers: int | None = None, uplink: str | None = None,
                   downlink: str | None = None, per_sample: str | None = None, batch_size: int = 1,
                   mode: str = "blocking", bytes_up: float = 0.0, bytes_down: float = 0.0,
                   bandwidth: Sequence[float] = ()) -> ArrivalModel:
        """Build a model from spec strings (``exp:1`` or ``exp:1,exp:2``); K from ``workers`` or the lists.

        Args:
            compute: x0 spec(s); a list of L specs means K = L.
            workers: K; ``None``: the longest list's length, so one spec everywhere (and at
                most one bandwidth) means K = 1. (``naig staleness`` passes its own default,
                4 workers, when no option lists one value per worker.)

        Raises:
            UsageError: a malformed spec (its field named), lists of different lengths, a
                ``workers`` that contradicts a list, or more than ``MAX_WORKERS``.
        """
        if isinstance(bandwidth, str | bytes) or not isinstance(bandwidth, Sequence):
            raise UsageError("must be a list of bytes/s, one per worker link (or () for infinite)",
                             field="bandwidth", value=bandwidth)
        specs = {"compute": compute, "uplink": uplink, "downlink": downlink, "per_sample": per_sample}
        parsed = {f: parse_distributions(s, f, positive=f == "compute") if s is not None else ()
                  for f, s in specs.items()}
        lengths = {f: len(v) for f, v in parsed.items() if v} | {"bandwidth": len(bandwidth)}
        k = _resolve_workers(workers, lengths)
        return cls(compute=_per_worker(parsed["compute"], k, "compute"), uplink=parsed["uplink"],
                   downlink=parsed["downlink"], per_sample=parsed["per_sample"], batch_size=batch_size,
                   mode=mode, bytes_up=bytes_up, bytes_down=bytes_down, bandwidth=tuple(bandwidth))

    @property
    def workers(self) -> int:
        """K, the number of workers."""
        return len(self.compute)

    def _transfer(self, nbytes: float) -> np.ndarray:
        """(K,) seconds to move ``nbytes`` over each worker's link (0 with infinite bandwidth)."""
        if not self.bandwidth or nbytes == 0:
            return np.zeros(self.workers)
        return nbytes / np.asarray(self.bandwidth, dtype=np.float64)

    def transfer_up(self) -> np.ndarray:
        """(K,) float64 seconds: bytes_up / bandwidth, added to every uplink latency draw."""
        return self._transfer(self.bytes_up)

    def transfer_down(self) -> np.ndarray:
        """(K,) float64 seconds: bytes_down / bandwidth, added to every downlink latency draw."""
        return self._transfer(self.bytes_down)

    def mean_compute(self) -> np.ndarray:
        """(K,) E[X_i] = E[x0_i] + b·E[x1_i], seconds."""
        x0 = np.array([d.mean for d in self.compute])
        x1 = np.array([d.mean for d in self.per_sample]) if self.per_sample else 0.0
        return x0 + self.batch_size * x1

    def mean_uplink(self) -> np.ndarray:
        """(K,) E[U_i] = E[latency] + bytes_up / bandwidth, seconds."""
        return np.array([d.mean for d in self.uplink] or [0.0] * self.workers) + self.transfer_up()

    def mean_downlink(self) -> np.ndarray:
        """(K,) E[D_i] = E[latency] + bytes_down / bandwidth, seconds."""
        return np.array([d.mean for d in self.downlink] or [0.0] * self.workers) + self.transfer_down()

    def mean_cycle(self) -> np.ndarray:
        """(K,) E[C_i] = E[D_i] + E[X_i] + E[U_i], seconds."""
        return self.mean_downlink() + self.mean_compute() + self.mean_uplink()

    def var_compute(self) -> np.ndarray:
        """(K,) Var[X_i] = Var[x0_i] + b²·Var[x1_i], s²."""
        v0 = np.array([d.variance for d in self.compute])
        v1 = np.array([d.variance for d in self.per_sample]) if self.per_sample else 0.0
        return v0 + self.batch_size**2 * v1

    def var_cycle(self) -> np.ndarray:
        """(K,) Var[C_i], s² (the three parts are independent)."""
        var = self.var_compute()
        for dists in (self.uplink, self.downlink):
            if dists:
                var = var + np.array([d.variance for d in dists])
        return var

    def describe(self) -> dict:
        """The model as JSON-ready specs (one string per worker)."""
        return {
            "workers": self.workers, "mode": self.mode, "batch_size": self.batch_size,
            "compute": [d.spec for d in self.compute],
            "per_sample": [d.spec for d in self.per_sample] or None,
            "uplink": [d.spec for d in self.uplink] or None,
            "downlink": [d.spec for d in self.downlink] or None,
            "bytes_up": self.bytes_up, "bytes_down": self.bytes_down,
            "bandwidth": list(self.bandwidth) or None,
        }


def _resolve_workers(workers: int | None, lengths: dict[str, int]) -> int:
    lists = {f: n for f, n in lengths.items() if n > 1}
    if workers is not None:
        if isinstance(workers, bool) or not isinstance(workers, int | np.integer) or workers < 1:
            raise UsageError("use an integer >= 1", field="workers", value=workers)
        if workers > MAX_WORKERS:
            raise UsageError(f"use at most {MAX_WORKERS:,} workers (per-worker state, random streams "
                             "and report rows grow with K)", field="workers", value=workers)
        for field, n in lists.items():
            if n != workers:
                raise UsageError(f"lists {n} values but `workers` is {workers}; give one value, "
                                 f"or {workers}", field=field)
        return int(workers)
    if len(set(lists.values())) > 1:
        field = max(lists, key=lambda f: (lists[f], f))
        raise UsageError(f"lists {lists[field]} values, other lists differ; give one per worker each",
                         field=field)
    return next(iter(lists.values()), 1)
