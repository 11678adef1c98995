"""The exact, vectorised event simulation of the arrival model (docs/design.md §10).

Arrival times never depend on parameter versions: in blocking mode worker i's arrivals
are the partial sums of its cycles C = D + X + U, in non-blocking mode its compute jobs
run back to back and each gradient arrives U seconds after its job ends. So the engine
draws every worker's times as arrays, merges them into one arrival order (ties broken by
worker index, then job index), and only then derives versions and staleness from ranks:

- the master applies arrivals in order; with a window of B arrivals, version v becomes
  v + 1 after the arrival of rank (v + 1)·B − 1, and the arrival of rank r is applied at
  version ⌊r/B⌋;
- the reply to the arrival of rank r carries version ⌊(r + 1)/B⌋ (the current one: a
  worker that arrives mid-window gets the current version);
- blocking: a worker computes its next job on that reply; non-blocking: a job that
  starts at time s uses the newest version among the replies it received by s
  (a reply to job n arrives D_{n+1} seconds after the gradient).

Staleness τ = ⌊r/B⌋ − pulled version. The draws come from per-worker streams
(``worker_stream``), so the result depends on the seed only, not on how many draws the
engine makes; ``ArrivalClock`` replays the same process one arrival at a time.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

import numpy as np

from naig.arrivals.distributions import COMPUTE, DOWNLINK, PER_SAMPLE, UPLINK, Distribution, worker_stream
from naig.arrivals.model import ArrivalModel, check_seed
from naig.errors import UsageError

__all__ = ["ArrivalTrace", "simulate_arrivals", "round_times", "draw_component", "check_count",
           "BYTES_PER_ARRIVAL", "BYTES_PER_JOB", "estimate_bytes", "available_bytes", "check_memory"]

BYTES_PER_ARRIVAL = 112
"""Peak bytes per arrival of the trace and its statistics (measured 108–133 B in all, with
the jobs below, for 4·10⁶ arrivals; the two constants together keep a margin)."""
BYTES_PER_JOB = 72
"""Peak bytes per drawn job: its times (3–5 float64) and the merge (order, rank, version)."""


@dataclass(frozen=True)
class ArrivalTrace:
    """The first N arrivals at the master, in the order the master applies them.

    Attributes:
        worker: (N,) int64, the worker of each arrival.
        job: (N,) int64, that worker's job index (0, 1, …).
        time: (N,) float64, simulated seconds at which the gradient reaches the master.
        pulled: (N,) int64, the parameter version the gradient was computed on.
        staleness: (N,) int64, τ = (version when it is applied) − pulled.
        age: (N,) float64, seconds from the creation of version ``pulled`` to ``time``.
        workers: K.
        window: B, arrivals per server update.
        pending: (K,) int64, blocking modes only (else ``None``): the version each
            worker's job in flight holds after the N-th arrival.
    """

    worker: np.ndarray
    job: np.ndarray
    time: np.ndarray
    pulled: np.ndarray
    staleness: np.ndarray
    age: np.ndarray
    workers: int
    window: int
    pending: np.ndarray | None

    @property
    def arrivals(self) -> int:
        """N, the number of arrivals simulated."""
        return len(self.worker)

    @property
    def version(self) -> int:
        """The master's version after the N arrivals: ⌊N / B⌋."""
        return self.arrivals // self.window


def check_count(value: object, field: str, minimum: int = 1) -> int:
    """An integer count >= ``minimum``; returns it as int.

    Raises:
        UsageError: naming ``field``.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise UsageError(f"use an integer >= {minimum}", field=field, value=value)
    return int(value)


def draw_component(dists: tuple[Distribution, ...], worker: int, component: int, seed: int, size: int,
                   family: int = 0) -> np.ndarray:
    """(size,) draws of one worker's component from its own stream; zeros when ``dists`` is empty."""
    if not dists:
        return np.zeros(size)
    return dists[worker].sample(worker_stream(seed, worker, component, family), size)


def _compute(model: ArrivalModel, i: int, seed: int, size: int, family: int) -> np.ndarray:
    x = draw_component(model.compute, i, COMPUTE, seed, size, family)
    if model.per_sample:
        x = x + model.batch_size * draw_component(model.per_sample, i, PER_SAMPLE, seed, size, family)
    return x


def _cycle_parts(model: ArrivalModel, i: int, seed: int, m: int, m_down: int,
                 family: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Worker i's first ``m_down`` downlinks, ``m`` compute times and ``m`` uplinks, seconds."""
    d = draw_component(model.downlink, i, DOWNLINK, seed, m_down, family) + model.transfer_down()[i]
    u = draw_component(model.uplink, i, UPLINK, seed, m, family) + model.transfer_up()[i]
    return d, _compute(model, i, seed, m, family), u


def _worker_jobs(model: ArrivalModel, i: int, seed: int, m: int) -> dict[str, np.ndarray | float]:
    """Times of worker i's first m jobs: ``arrive`` and ``horizon`` (no later job arrives at or
    before it); non-blocking also ``start`` of each job and ``receipt`` of each reply."""
    if model.mode != "non-blocking":
        d, x, u = _cycle_parts(model, i, seed, m, m)
        arrive = np.cumsum(d + x + u)
        return {"arrive": arrive, "horizon": float(arrive[-1])}
    d, x, u = _cycle_parts(model, i, seed, m, m + 1)
    end = np.cumsum(np.concatenate(([d[0]], x)))[1:]
    arrive = end + u
    return {"arrive": arrive, "horizon": float(end[-1]), "start": np.concatenate(([d[0]], end[:-1])),
            "receipt": arrive + d[1:]}


def _job_cap(model: ArrivalModel, n: int) -> float:
    """Most jobs a worker can need: n + 1 in blocking modes (its first n jobs already cover the
    first n arrivals), unbounded in non-blocking mode (uplinks reorder arrivals)."""
    return float(n + 16) if model.mode != "non-blocking" else np.inf


def _initial_jobs(model: ArrivalModel, n: int) -> np.ndarray:
    """Jobs per worker that most likely cover the first n arrivals: the renewal mean plus
    6 sd, the margin at most the mean again (a heavy tail would otherwise ask for far more
    than the n + 1 a blocking worker can need), and at most ``_job_cap``."""
    if model.mode == "non-blocking":
        mean, var = model.mean_compute(), model.var_compute()
    else:
        mean, var = model.mean_cycle(), model.var_cycle()
    rate = 1.0 / mean
    jobs = n / rate.sum() * rate
    with np.errstate(over="ignore", invalid="ignore"):
        margin = np.nan_to_num(6 * np.sqrt(jobs * (var / mean**2) + 1), nan=np.inf)
    est = 1.05 * jobs + np.minimum(margin, jobs + 16) + 16
    return np.ceil(np.minimum(est, _job_cap(model, n))).astype(np.int64)


def estimate_bytes(model: ArrivalModel, arrivals: int, jobs: np.ndarray | None = None) -> int:
    """Peak memory of ``simulate_arrivals`` plus ``measure`` for N arrivals, bytes.

    Args:
        model: the workers and protocol.
        arrivals: N.
        jobs: (K,) jobs drawn per worker; default: the first draw's (a heavy-tailed
            non-blocking model may need more draws, each checked again).
    """
    jobs = _initial_jobs(model, int(arrivals)) if jobs is None else jobs
    return int(BYTES_PER_ARRIVAL * float(arrivals) + BYTES_PER_JOB * float(np.sum(jobs)))


def _proc_kib(path: str, key: str) -> int | None:
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_bytes() -> int | None:
    """Memory this process may still use, bytes: the smaller of the system's available memory
    and what ``RLIMIT_AS``/``RLIMIT_DATA`` leave; ``None`` where neither can be read."""
    limits = []
    avail = _proc_kib("/proc/meminfo", "MemAvailable")
    if avail is not None:
        limits.append(avail * 1024)
    for rlim, key in ((resource.RLIMIT_AS, "VmSize"), (resource.RLIMIT_DATA, "VmData")):
        soft = resource.getrlimit(rlim)[0]
        used = _proc_kib(f"/proc/{os.getpid()}/status", key)
        if soft != resource.RLIM_INFINITY and used is not None:
            limits.append(max(0, soft - used * 1024))
    return min(limits) if limits else None


def check_memory(model: ArrivalModel, arrivals: int, field: str = "updates",
                 jobs: np.ndarray | None = None) -> int:
    """Refuse, before any work, a simulation that would not fit in memory; returns the estimate.

    Args:
        model, arrivals, jobs: as ``estimate_bytes``.
        field: the option named for the arrivals (``updates``).

    Raises:
        UsageError: naming ``field`` (or ``workers`` when the workers' jobs dominate) and the
            memory the run would take, when it exceeds ``available_bytes()``.
    """
    need, free = estimate_bytes(model, arrivals, jobs), available_bytes()
    if free is not None and need > free:
        jobs = need - BYTES_PER_ARRIVAL * float(arrivals)
        name = "workers" if jobs > BYTES_PER_ARRIVAL * float(arrivals) else field
        raise UsageError(f"would take about {need / 2**30:.3g} GiB of memory (about {BYTES_PER_ARRIVAL} B "
                         f"per arrival); {free / 2**30:.3g} GiB is available; use fewer `updates`"
                         + (" or `workers`" if model.workers > 1 else ""), field=name,
                         value=arrivals if name == field else model.workers)
    return need


def _pulled_blocking(ranks: np.ndarray, window: int) -> np.ndarray:
    """Versions of a blocking worker's jobs: job 0 holds 0, job n the reply to job n − 1."""
    return np.concatenate(([0], (ranks[:-1] + 1) // window))


def _pulled_non_blocking(jobs: dict, ranks: np.ndarray, window: int) -> np.ndarray:
    """Versions of a non-blocking worker's jobs: the newest reply received by each job's start."""
    done = ranks >= 0
    if not done.any():
        return np.zeros(len(ranks), dtype=np.int64)
    order = np.argsort(jobs["receipt"][done], kind="stable")
    newest = np.maximum.accumulate((ranks[done][order] + 1) // window)
    idx = np.searchsorted(jobs["receipt"][done][order], jobs["start"], side="right")
    return np.where(idx > 0, newest[np.maximum(idx - 1, 0)], 0)


def _merge(model: ArrivalModel, jobs: list[dict], n: int, window: int) -> ArrivalTrace | None:
    """The first n arrivals from the workers' job times; ``None`` when they do not cover n."""
    sizes = [len(j["arrive"]) for j in jobs]
    t_all = np.concatenate([j["arrive"] for j in jobs])
    order = np.argsort(t_all, kind="stable")  # worker-major input: ties go to the lower worker
    cutoff = min(j["horizon"] for j in jobs)
    if np.searchsorted(t_all[order], cutoff, side="right") < n:
        return None
    sel = order[:n]
    ranks = np.full(len(t_all), -1, dtype=np.int64)
    ranks[sel] = np.arange(n)
    bounds = np.cumsum([0, *sizes])
    per_worker = [ranks[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    if model.mode == "non-blocking":
        pulled_all = np.concatenate([_pulled_non_blocking(j, r, window) for j, r in zip(jobs, per_worker,
                                                                                         strict=True)])
        pending = None
    else:
        pulled_all = np.concatenate([_pulled_blocking(r, window) for r in per_worker])
        pending = np.array([(r.max() + 1) // window if (r >= 0).any() else 0 for r in per_worker])
    return _trace(model, t_all, sel, bounds, pulled_all[sel], window, pending)


def _trace(model: ArrivalModel, t_all: np.ndarray, sel: np.ndarray, bounds: np.ndarray, pulled: np.ndarray,
           window: int, pending: np.ndarray | None) -> ArrivalTrace:
    worker = np.searchsorted(bounds, sel, side="right") - 1
    time = t_all[sel]
    created = np.concatenate(([0.0], time[window - 1::window]))  # version v exists from created[v]
    return ArrivalTrace(worker=worker, job=sel - bounds[worker], time=time, pulled=pulled,
                        staleness=np.arange(len(sel)) // window - pulled, age=time - created[pulled],
                        workers=model.workers, window=window, pending=pending)


def simulate_arrivals(model: ArrivalModel, arrivals: int, seed: int = 0, *, window: int = 1) -> ArrivalTrace:
    """Simulate the first ``arrivals`` gradient arrivals at the master, every window applied.

    Args:
        model: the workers and the protocol.
        arrivals: N, the number of gradients that reach the master (= server updates for B = 1).
        seed: 0..2^64−1; the trace is a deterministic function of (model, N, seed, window).
        window: B, arrivals per server update (1: asynchronous SGD; K: K-batch-async).

    Returns:
        The ``ArrivalTrace`` (arrays of length N).

    Raises:
        UsageError: a bad count, window or seed (field ``updates``, ``window``, ``seed``), or
            a run that would not fit in memory (``check_memory``), before any draw.

    Example:
        >>> m = ArrivalModel.from_specs("const:1,const:2")
        >>> tr = simulate_arrivals(m, 6)
        >>> tr.worker.tolist(), tr.time.tolist(), tr.staleness.tolist()
        ([0, 0, 1, 0, 0, 1], [1.0, 2.0, 2.0, 3.0, 4.0, 4.0], [0, 0, 2, 1, 0, 2])
    """
    n, window, seed = check_count(arrivals, "updates"), check_count(window, "window"), check_seed(seed)
    check_memory(model, n)
    m = _initial_jobs(model, n)
    while True:
        jobs = [_worker_jobs(model, i, seed, int(m[i])) for i in range(model.workers)]
        trace = _merge(model, jobs, n, window)
        if trace is not None:
            return trace
        m = np.minimum(np.ceil(1.5 * m) + 16, _job_cap(model, n)).astype(np.int64)
        check_memory(model, n, jobs=m)


def round_times(model: ArrivalModel, rounds: int, seed: int = 0) -> np.ndarray:
    """Durations of synchronous rounds: max_i C_i per round, each C_i = D + X + U drawn afresh.

    The draws use the workers' round streams (family 1), independent of the arrival
    streams; the first r values do not depend on ``rounds``, and ``RoundClock`` draws the
    same values one round at a time. Shared-memory and non-blocking models use the same
    cycle (a synchronous round waits for every worker's full cycle).

    Returns:
        (rounds,) float64 seconds.

    Example:
        >>> round_times(ArrivalModel.from_specs("const:1,const:3"), 2).tolist()
        [3.0, 3.0]
    """
    rounds, seed = check_count(rounds, "rounds"), check_seed(seed)
    out = np.zeros(rounds)
    for i in range(model.workers):
        d, x, u = _cycle_parts(model, i, seed, rounds, rounds, family=1)
        out = np.maximum(out, d + x + u)
    return out

