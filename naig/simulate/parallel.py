"""Independent runs of a simulated experiment side by side, one forked process per CPU core.

A simulated experiment is ``seeds × rules × learning rates`` runs that share nothing but the
workload (data, θ_0, validation batches), each deterministic given its (seed, rule, lr): on one
thread per process they are compute-bound (gpt-nano: ~14 ms per worker gradient), so ``jobs``
processes finish about ``jobs`` times sooner on ``jobs`` idle cores, with results identical to
running them one after another (``tests/test_simulate_parallel.py`` checks every number).

How: the parent builds the workload, then forks ``jobs`` children (``multiprocessing``'s
``fork`` context: the children inherit the workload, no re-import, no re-build), each with its
own pipe: the parent sends a child one planned run at a time; the child sends back every
``StepEvent``, then the ``RunResult`` with its seed's untrained loss and saved files. The parent
reports events as they come and keeps results in the planned order. Children ignore SIGINT:
Ctrl-C reaches the parent, which kills the children and keeps the runs that had finished
(``interrupted``).

Where it does not apply (``resolve_jobs``): the distributed engine (its processes are its
parallelism), a CUDA device (a forked child cannot use the parent's CUDA context) and a
platform without ``fork``; there ``jobs = 0`` (auto) means one process and an explicit
``jobs > 1`` is refused.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import connection as mp_connection
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from naig.errors import RunError, UsageError

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
_JOIN_S = 5.0
"""Seconds the children told to end (or sent SIGTERM) have to exit before they are killed."""


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


@dataclass
class _Worker:
    """One forked child, the parent's end of its pipe and the run it is on (None: idle)."""

    process: Any
    conn: Connection
    run: Planned | None = None


def _worker_main(conn: Connection, parents: list[Connection]) -> None:
    """In each child: runs received on ``conn`` until ``None`` (one context per seed, kept while the runs
    of that seed follow, as ``jobs = 1`` keeps it: θ_0 is evaluated once, not once per run); every
    ``StepEvent`` and then the result (or the error) go back on ``conn``. Ctrl-C is the parent's to
    handle; SIGTERM (the parent stopping the runs) unwinds the run as Ctrl-C does with ``jobs = 1``, so
    its log is closed as ``NAME.partial.csv`` with every step written. The parent's ends of the pipes
    (``parents``, inherited by the fork) are closed, so a parent that dies without a word ends the child,
    quietly, at its next read or write."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stopped)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    for end in parents:
        end.close()
    assert _SESSION is not None
    ctx, current = None, -1
    try:
        while (task := conn.recv()) is not None:
            seed, rule, lr = task
            try:
                if seed != current:  # one context per seed, as with jobs = 1 (θ_0 evaluated once)
                    ctx, current = _SESSION.context(seed, lambda event: conn.send(("event", event))), seed
                before = len(ctx.saved)
                result = _SESSION.run(rule, seed, lr, ctx)
                conn.send(("result", (result, ctx.untrained, ctx.saved[before:])))
            except (EOFError, BrokenPipeError, ConnectionResetError):
                raise  # the pipe: the parent is gone
            except Exception as exc:  # noqa: BLE001 - the parent re-raises it
                conn.send(("error", _picklable(exc)))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        os._exit(1)  # no parent to tell, and no traceback on the terminal it left


def _stopped(signum: int, frame: object) -> None:
    """A child's SIGTERM handler: end the run by unwinding it (its ``finally`` blocks run)."""
    raise SystemExit(128 + signum)


def _picklable(exc: Exception) -> Exception:
    """``exc`` if the pipe can send it, else a RuntimeError with its type and message."""
    try:
        pickle.dumps(exc)
    except Exception:  # noqa: BLE001 - any failure to serialise
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def _start(ctx: Any, workers: list[_Worker]) -> _Worker:
    """Fork one child and add it to ``workers``, with SIGINT blocked until the child ignores it and
    the parent holds it in ``workers`` (a Ctrl-C in between is the parent's, and stops it too). The
    parent keeps only its own end of the new pipe; the child closes the parent's ends of every pipe."""
    mine, theirs = ctx.Pipe()
    process = ctx.Process(target=_worker_main, args=(theirs, [mine, *(w.conn for w in workers)]),
                          daemon=True)
    worker = _Worker(process, mine)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        workers.append(worker)
        process.start()
    finally:
        theirs.close()
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return worker


def run_parallel(session: SimulatedSession, planned: list[Planned], jobs: int,
                 progress: Callable[[StepEvent], None] | None, runs: list[RunResult],
                 untrained: list[float], saved: list[str]) -> None:
    """Run ``planned`` in ``jobs`` forked processes, filling ``runs`` (planned order), ``untrained``
    (one per seed, seed order) and ``saved``, calling ``progress`` with every child's events.

    Each child has its own pipe (runs in, events and results out) and shares no lock with
    another: one stopped while it sends cannot wedge the rest (``multiprocessing.Pool.terminate``
    can hang then, CPython issue 96995; it failed a CI run on 2026-12-06). What finished is
    collected before the children are stopped, so a second Ctrl-C during the stop loses none of it.

    Raises:
        KeyboardInterrupt: after the children are stopped; what finished is already in ``runs``.
        Whatever a run raised (the first to come back), after the children are stopped.
        RunError: a child ended (killed, out of memory) before returning its run's result.
    """
    global _SESSION
    ctx = mp.get_context("fork")
    _SESSION = session
    todo = list(planned)
    done: dict[Planned, tuple[RunResult, float, list[str]]] = {}
    workers: list[_Worker] = []
    finished = False
    try:
        for _ in range(min(jobs, len(todo))):
            _assign(_start(ctx, workers), todo)
        while busy := {w.conn: w for w in workers if w.run is not None}:
            for conn in mp_connection.wait(list(busy)):
                _receive(busy[conn], todo, done, progress)
        finished = True
    finally:
        _SESSION = None
        try:
            _collect(planned, done, runs, untrained, saved)
        finally:
            _stop(workers, finished)


def _ended(worker: _Worker, run: Planned) -> RunError:
    """The error for a child that ended before returning ``run``'s result (or taking it)."""
    worker.process.join(timeout=1.0)
    code = worker.process.exitcode
    how = "is still running" if code is None else f"was killed by signal {-code}" if code < 0 \
        else f"exited with code {code}"
    seed, rule, lr = run
    return RunError(f"the process running {rule} seed {seed} lr {lr:g} {how} before its result; set `jobs` "
                    "to 1 to see why")


def _assign(worker: _Worker, todo: list[Planned]) -> None:
    """Send ``worker`` the next planned run (None and idle when none is left)."""
    worker.run = todo.pop(0) if todo else None
    if worker.run is not None:
        try:
            worker.conn.send(worker.run)
        except OSError:
            raise _ended(worker, worker.run) from None


def _receive(worker: _Worker, todo: list[Planned], done: dict[Planned, tuple[RunResult, float, list[str]]],
             progress: Callable[[StepEvent], None] | None) -> None:
    """Handle one message from ``worker``: an event, its run's result (then its next run) or an error."""
    try:
        kind, payload = worker.conn.recv()
    except (EOFError, OSError):
        raise _ended(worker, worker.run) from None
    if kind == "event":
        if progress is not None:
            progress(payload)
    elif kind == "result":
        done[worker.run] = payload
        _assign(worker, todo)
    else:
        raise payload


def _stop(workers: list[_Worker], finished: bool) -> None:
    """End the children: idle ones are told to (``None``), busy ones get SIGTERM (their runs unwind and
    close their logs); each has ``_JOIN_S`` seconds, then is killed. A KeyboardInterrupt meanwhile
    (a second Ctrl-C) kills them at once and goes on."""
    started = [w for w in workers if w.process.pid is not None]
    try:
        for w in started:
            if finished:
                with contextlib.suppress(OSError):
                    w.conn.send(None)
            elif w.process.is_alive():
                w.process.terminate()
        deadline = time.monotonic() + _JOIN_S
        for w in started:
            w.process.join(timeout=max(0.0, deadline - time.monotonic()))
    finally:  # the ones left (or all, after a second Ctrl-C meanwhile) are killed
        _kill(started)
        for w in workers:
            w.conn.close()


def _kill(workers: list[_Worker]) -> None:
    """SIGKILL every child still alive and reap it."""
    for w in workers:
        if w.process.is_alive():
            w.process.kill()
    for w in workers:
        w.process.join()


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
