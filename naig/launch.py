"""Starting the processes: on one machine (spawned here) or on several (torchrun) (docs/design.md §14).

One machine: ``LocalCluster`` keeps rank 0 in the calling process, hosts the rendezvous
store on a free port (``TCPStore`` on port 0: no port guessing, no race) and starts ranks
1..N−1 as child processes in their own session, with the environment torchrun would give
them (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``). On exit
it waits for the children, then terminates and finally kills any that are left: no
orphans. Each child also exits when its parent disappears (``watch_parent``).

Several machines: ``torchrun`` starts every rank; ``init`` then uses ``env://``.

Process groups: the default group is used only to create one group per server–worker
pair (``pair_groups``); every message afterwards travels on its pair's group, whose gloo
context is its own, so a dead worker breaks its pair and no other. Every group carries
the run's timeout (at most 30 s).
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from naig.choices import MAX_TIMEOUT  # seconds: the longest any one collective or message may take
from naig.errors import DataError, UsageError

__all__ = ["ENV_STORE", "ENV_PARENT", "MAX_TIMEOUT", "RENDEZVOUS_SECONDS", "LocalCluster", "backend_for",
           "under_launcher", "init",
           "watch_parent", "process_group"]

ENV_STORE = "NAIG_DISTRIBUTED_STORE"  # "1": join the spawning process's store directly (no env://)
ENV_PARENT = "NAIG_DISTRIBUTED_PARENT"  # the spawning process's pid (children exit when it is gone)
RENDEZVOUS_SECONDS = 120.0  # the longest the processes may take to meet (start-up included)


def backend_for(device: torch.device) -> str:
    """``nccl`` for CUDA tensors, ``gloo`` for CPU ones."""
    return "nccl" if device.type == "cuda" else "gloo"


def under_launcher() -> bool:
    """True when a launcher (torchrun, or ``LocalCluster`` for a child) set this process's rank."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init(rank: int, world: int, backend: str, timeout: float, store: dist.Store | None = None) -> None:
    """Join the default process group.

    The rendezvous waits up to ``max(timeout, RENDEZVOUS_SECONDS)``: processes start at
    different speeds (importing torch, reading the data), whatever the message timeout.

    Args:
        rank, world: this process's rank and the number of processes.
        backend: ``gloo`` or ``nccl``.
        timeout: seconds for every collective of the default group.
        store: the rendezvous store (rank 0 of a ``LocalCluster``); ``None``: a child of one
            (``ENV_STORE`` set) joins its parent's store, anyone else uses ``env://``.

    Raises:
        UsageError: ``RANK`` and ``WORLD_SIZE`` set without ``MASTER_ADDR`` and ``MASTER_PORT``.
        DataError: the processes could not meet (a port in use, a peer that never came).
    """
    meet = timedelta(seconds=max(timeout, RENDEZVOUS_SECONDS))
    missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if store is None and missing:
        raise UsageError(f"RANK and WORLD_SIZE are set but {' and '.join(missing)} not: start the ranks with "
                         "torchrun, or unset RANK and WORLD_SIZE to let naig spawn them", field="nproc")
    try:
        if store is None and os.environ.get(ENV_STORE) == "1":
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, False,
                                  timeout=meet)
        if store is not None:
            dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=meet)
        else:
            dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world, timeout=meet)
    except (RuntimeError, ValueError) as exc:  # DistStoreError and DistNetworkError are RuntimeErrors
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise DataError(f"rank {rank} of {world} could not join the process group ({first}); check "
                        "MASTER_ADDR and MASTER_PORT (a free port) and that every rank started") from None


def watch_parent(interval: float = 0.5) -> threading.Thread:
    """Exit this process (status 1) as soon as its parent process is gone (a daemon thread).

    The parent is the pid a ``LocalCluster`` put in ``ENV_PARENT`` (so a parent that died
    while this process was still importing is noticed too), else the current parent.
    """
    parent = int(os.environ.get(ENV_PARENT, os.getppid()))

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os._exit(1)

    thread = threading.Thread(target=watch, name="naig-parent-watch", daemon=True)
    thread.start()
    return thread


class LocalCluster:
    """Rank 0 here, ranks 1..``nproc``−1 as child processes running ``argv`` (one machine).

    Args:
        argv: the children's command line, e.g. ``[sys.executable, "-m", "mypackage.train", cfg]``.
        nproc: processes in all (this one included).
        timeout: the message timeout; the rendezvous store waits ``max(timeout, RENDEZVOUS_SECONDS)``.
        log_dir: each child's stdout and stderr go to ``log_dir/rank<r>.log``.
        threads: torch threads per child (``OMP_NUM_THREADS``); default: cores / nproc, at least 1.

    Example (not run here; see tests/test_simulate_distributed_server.py)::

        with LocalCluster([sys.executable, "-m", "mypackage.train", cfg], 5, 30.0, tmp) as cluster:
            init(0, 5, "gloo", 30.0, store=cluster.store)
            ...
    """

    def __init__(self, argv: Sequence[str], nproc: int, timeout: float, log_dir: Path,
                 threads: int | None = None) -> None:
        self.argv, self.nproc, self.log_dir = list(argv), nproc, Path(log_dir)
        self.threads = threads or max(1, (os.cpu_count() or 1) // nproc)
        meet = timedelta(seconds=max(timeout, RENDEZVOUS_SECONDS))
        self.store = dist.TCPStore("127.0.0.1", 0, nproc, True, timeout=meet,
                                   wait_for_workers=False)
        self.children: dict[int, subprocess.Popen] = {}

    def __enter__(self) -> LocalCluster:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for rank in range(1, self.nproc):
                self.children[rank] = self._spawn(rank)
        except BaseException:
            self.shutdown(grace=0.0)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown(grace=0.0 if exc[0] is not None else 10.0)

    def _spawn(self, rank: int) -> subprocess.Popen:
        root = str(Path(__file__).resolve().parents[1])  # the children import this very naig
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(self.nproc), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(self.nproc), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(self.store.port), ENV_STORE: "1", ENV_PARENT: str(os.getpid()),
               "OMP_NUM_THREADS": str(self.threads),
               "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
        with (self.log_dir / f"rank{rank}.log").open("wb") as log:
            return subprocess.Popen(self.argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> list[int]:
        """The child ranks still running."""
        return [r for r, p in self.children.items() if p.poll() is None]

    def stop(self, ranks: Sequence[int]) -> None:
        """Terminate these children now (lost workers: a hung one would never exit by itself)."""
        for rank in ranks:
            p = self.children.get(rank)
            if p is not None and p.poll() is None:
                p.terminate()
                if not _wait(p, 3.0):
                    p.kill()
                    p.wait()

    def exit_code(self, rank: int) -> int | None:
        """A child's exit status (negative: the signal that ended it), None while it runs."""
        return self.children[rank].poll()

    def log_tail(self, rank: int) -> str:
        """The last non-empty line a child wrote (its one-line error, if it failed)."""
        path = self.log_dir / f"rank{rank}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return lines[-1].strip() if lines else ""

    def shutdown(self, grace: float = 10.0) -> dict[int, int]:
        """Wait up to ``grace`` seconds for the children, then SIGTERM, then SIGKILL; exit codes by rank."""
        deadline = time.monotonic() + grace
        for p in self.children.values():
            _wait(p, max(0.0, deadline - time.monotonic()))
        for p in self.children.values():
            if p.poll() is None:
                p.terminate()
        for p in self.children.values():
            if not _wait(p, 3.0):
                p.kill()
                p.wait()
        return {r: p.returncode for r, p in self.children.items()}


def _wait(p: subprocess.Popen, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``p``; True when it has exited."""
    try:
        p.wait(timeout=seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


def _destroy() -> None:
    """Destroy the process group while the interpreter is fully alive.

    DistributedDataParallel and communication hooks form reference cycles that hold the
    group; left to the collector at interpreter exit, the group's gloo threads are torn
    down during finalisation and the process can abort ("terminate called without an
    active exception", seen on a loaded 2-core machine). Collecting first frees the
    objects the block no longer references, so the group dies here.
    """
    gc.collect()
    dist.destroy_process_group()


@contextmanager
def process_group(nproc: int, argv: Sequence[str], backend: str = "gloo",
                  timeout: float = MAX_TIMEOUT) -> Iterator[tuple[int, int]]:
    """Be one rank of a process group: join it under a launcher, or start it here.

    Under ``torchrun`` (or as a child of a ``LocalCluster``) the rank joins the group the
    environment describes. Otherwise this process becomes rank 0 of ``nproc`` and starts
    ranks 1..nproc−1 running ``argv`` (typically this very script, which then takes the
    first branch). Leaving the block destroys the group; rank 0 then waits for its
    children and raises ``RuntimeError`` with the last line of any that failed. Build the
    DDP model inside a function called in the block (as examples/ddp_gpt.py does): its
    objects are then freed before the group is destroyed.

    Yields:
        ``(rank, world size)``.

    Raises:
        UsageError: ``nproc`` < 1 (when not under a launcher), naming it.
    """
    if not under_launcher() and (isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1):
        raise UsageError("must be an int >= 1 (the processes of the group, this one included)", field="nproc",
                         value=nproc)
    if under_launcher():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        if os.environ.get(ENV_STORE) == "1":
            watch_parent()
        init(rank, world, backend, timeout)
        try:
            yield rank, world
        finally:
            _destroy()
        return
    logs = Path(tempfile.mkdtemp(prefix="naig-ranks-"))
    try:
        with LocalCluster(argv, nproc, timeout, logs) as cluster:
            init(0, nproc, backend, timeout, store=cluster.store)
            try:
                yield 0, nproc
            finally:
                _destroy()
            codes = cluster.shutdown()
            failed = {r: cluster.log_tail(r) for r, c in codes.items() if c != 0}
        if failed:
            raise RuntimeError("; ".join(f"rank {r} failed: {tail}" for r, tail in failed.items()))
    finally:
        shutil.rmtree(logs, ignore_errors=True)
