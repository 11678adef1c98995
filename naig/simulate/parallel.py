"""Independent runs of a simulated experiment side by side, one forked process per CPU core.

A simulated experiment is ``seeds × rules × learning rates`` runs that share nothing but the
workload (data, θ_0, validation batches), each deterministic given its (seed, rule, lr): on one
thread per process they are compute-bound (gpt-nano: ~14 ms per worker gradient), so ``jobs``
processes finish about ``jobs`` times sooner on ``jobs`` idle cores, with results identical to
running them one after another (``tests/test_simulate_parallel.py`` checks every number).

How: the parent builds the workload, then forks ``jobs`` children (``multiprocessing``'s
``fork`` context: the children inherit the workload, no re-import, no re-build); each child
runs whole runs, sending every ``StepEvent`` to the parent through a queue, and returns the
``RunResult`` with its seed's untrained loss and saved files. The parent reports events as they
come and keeps results in the planned order. Children ignore SIGINT: Ctrl-C reaches the parent,
which stops the children and keeps the runs that had finished (``interrupted``).

Where it does not apply (``resolve_jobs``): the distributed engine (its processes are its
parallelism), a CUDA device (a forked child cannot use the parent's CUDA context) and a
platform without ``fork``; there ``jobs = 0`` (auto) means one process and an explicit
``jobs > 1`` is refused.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from naig.errors import UsageError

if TYPE_CHECKING:
    from naig.simulate.config import SimulateConfig
    from naig.simulate.engines.simulated import SimulatedSession
    from naig.simulate.results import RunResult
    from naig.simulate.runs import StepEvent

__all__ = ["MAX_JOBS", "available_cores", "resolve_jobs", "run_parallel"]

MAX_JOBS = 1024
"""More processes than any machine has cores: refused as a typo."""

Planned = tuple[int, str, float]  # (seed, rule, lr)

_SESSION: SimulatedSession | None = None  # the parent's session, inherited by the forked children
_EVENTS: Any = None  # the children's StepEvents go to the parent through this queue


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_jobs(config: SimulateConfig, runs: int, device_type: str) -> int:
    """The number of processes ``config.jobs`` means for ``runs`` runs on ``device_type``.

    ``jobs = 0`` (auto): one per available core, at most one per run, 1 where parallel runs do
    not apply; ``jobs = N``: N, at most one per run.

    Raises:
        UsageError: ``jobs > 1`` with the distributed engine, a CUDA device, no ``fork``, or a
            process that has already initialised CUDA (a library caller that trained on the GPU).
    """
    why = ("the distributed engine runs its own processes (their number is `nproc`)"
           if config.setting.NAME == "distributed" else
           "runs on a CUDA device share it from one process" if device_type == "cuda" else
           "this platform cannot fork (runs side by side need it)" if "fork" not in mp.get_all_start_methods()
           else "this process has used CUDA, and a forked child cannot run autograd after that (torch's "
           "autograd-and-fork rule)" if _cuda_used()
           else None)
    if why is not None:
        if config.jobs > 1:
            raise UsageError(f"{why}; use 1 (or 0: as many as apply)", field="jobs", value=config.jobs)
        return 1
    wanted = config.jobs or available_cores()
    return max(1, min(wanted, runs))


def _cuda_used() -> bool:
    """Whether this process has initialised CUDA (torch imported and its CUDA state set up)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


def _child_init() -> None:
    """In each child: Ctrl-C is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _child_run(seed: int, rule: str, lr: float) -> tuple[RunResult, float, list[str]]:
    """One run in a child: its result, its seed's untrained loss and the files it saved."""
    assert _SESSION is not None
    ctx = _SESSION.context(seed, _EVENTS.put)
    result = _SESSION.run(rule, seed, lr, ctx)
    return result, ctx.untrained, list(ctx.saved)


def run_parallel(session: SimulatedSession, planned: list[Planned], jobs: int,
                 progress: Callable[[StepEvent], None] | None, runs: list[RunResult],
                 untrained: list[float], saved: list[str]) -> None:
    """Run ``planned`` in ``jobs`` forked processes, filling ``runs`` (planned order), ``untrained``
    (one per seed, seed order) and ``saved``, calling ``progress`` with every child's events.

    Raises:
        KeyboardInterrupt: after the children are stopped; what finished is already in ``runs``.
        Whatever a run raised (the first, in planned order), after the children are stopped.
    """
    global _SESSION, _EVENTS
    ctx = mp.get_context("fork")
    _SESSION, _EVENTS = session, ctx.Queue()
    events = _EVENTS
    pool = ctx.Pool(jobs, initializer=_child_init)
    done: dict[Planned, tuple[RunResult, float, list[str]]] = {}
    try:
        pending = {p: pool.apply_async(_child_run, p) for p in planned}
        while pending:
            _drain(events, progress, timeout=0.2)
            for p in [p for p, r in pending.items() if r.ready()]:
                done[p] = pending.pop(p).get()  # re-raises a run's error here
        _drain(events, progress, timeout=0.0)
        pool.close()
    finally:
        pool.terminate()
        pool.join()
        _SESSION = _EVENTS = None
        _collect(planned, done, runs, untrained, saved)


def _drain(events: Any, progress: Callable[[StepEvent], None] | None, timeout: float) -> None:
    """Hand every queued event to ``progress``, waiting up to ``timeout`` s for the first."""
    try:
        event = events.get(timeout=timeout) if timeout > 0 else events.get_nowait()
        while True:
            if progress is not None:
                progress(event)
            event = events.get_nowait()
    except queue.Empty:
        return


def _collect(planned: list[Planned], done: dict[Planned, tuple[RunResult, float, list[str]]],
             runs: list[RunResult], untrained: list[float], saved: list[str]) -> None:
    """The finished runs in planned order; one untrained loss per seed that has one."""
    seeds: dict[int, float] = {}
    for p in planned:
        if p in done:
            result, loss, files = done[p]
            runs.append(result)
            seeds.setdefault(p[0], loss)
            saved += files
    untrained += [seeds[s] for s in sorted(seeds)]
