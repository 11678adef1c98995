"""The distributed engine's session: rank 0 the parameter server, K worker processes (docs/design.md §14).

On one machine (no launcher environment) this process becomes rank 0 and spawns the K
workers (``LocalCluster``); under ``torchrun`` every rank calls ``open_distributed``: rank 0
gets the session and serves, the others work until the server says stop and get None.
The runs are those of ``naig simulate`` (``naig.simulate.experiment``: every rule × seed ×
lr, one after another, on the same processes) and the result is the same
``SimulateResult``, with the measured staleness of every run and a ``distributed`` block
(processes, lost workers, bytes, server time).

Results are not reproducible run to run: the arrival order depends on the operating
system's scheduling, so the same seed gives different staleness sequences and losses
(``DETERMINISM``). Run several seeds, or the same command several times, and report the
spread.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from naig.errors import UsageError
from naig.launch import LocalCluster, backend_for, init, under_launcher, watch_parent
from naig.simulate.config import SimulateConfig, config_tree
from naig.simulate.distributed.server import ParameterServer
from naig.simulate.distributed.transport import Link, pair_groups
from naig.simulate.distributed.worker import Worker
from naig.simulate.engines.base import NoWorkerLeft
from naig.simulate.results import RunResult
from naig.simulate.runs import RunContext, StepEvent, make_context
from naig.simulate.workload import Workload

__all__ = ["DETERMINISM", "DistributedSession", "open_distributed", "worker_main", "config_to_json",
           "config_from_json", "NoWorkerLeft", "threads_per_rank"]

DETERMINISM = ("not reproducible: the order in which gradients arrive depends on the operating system's "
               "scheduling of the processes, so staleness and losses differ from run to run for the same "
               "seed; compare the spread over seeds or repeated runs, not single values")


def config_to_json(config: SimulateConfig) -> str:
    """The config's tree as a JSON object (``SimulateConfig.to_dict``)."""
    return json.dumps(config.to_dict())


def config_from_json(text: str) -> SimulateConfig:
    """A config from ``config_to_json``'s text; validated again.

    Example:
        >>> c = SimulateConfig.from_options(engine="distributed", nproc=3, steps=4)
        >>> config_from_json(config_to_json(c)) == c
        True
    """
    return SimulateConfig.from_dict(config_tree(json.loads(text)))  # a whole simulate result works too


def _device(config: SimulateConfig) -> None:
    """On CUDA, one GPU per local rank."""
    if config.device != "cpu" and torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())


def worker_main(config: SimulateConfig) -> int:
    """A worker rank (``RANK`` ≥ 1 in the environment): serve until the server says stop.

    Returns:
        Gradients computed.
    """
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    watch_parent()
    torch.set_num_threads(config.threads)  # the process's own: set once, for its whole life
    _device(config)
    sim = Workload(config.workload)
    init(rank, world, backend_for(sim.device), config.setting.timeout)
    threads_per_rank()
    groups = pair_groups(rank, world, config.setting.timeout)
    jobs = Worker(sim, config.setting, config.run_rules, Link(groups[rank], 0), rank - 1).run()
    dist.destroy_process_group()
    return jobs


def threads_per_rank() -> list[int]:
    """Every rank's ``torch.get_num_threads()``, by rank: one all-gather, once, at start-up.

    Each process sets ``config.threads`` itself (``worker_main``; rank 0 within ``run_experiment``);
    this reads back what each one runs with, for the result's ``distributed`` block.
    """
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, torch.get_num_threads())
    return [int(t) for t in out]


def open_distributed(config: SimulateConfig) -> DistributedSession | None:
    """Rank 0's session (spawning the workers when no launcher started them); None on a worker
    rank under a launcher, after it served.

    Raises:
        UsageError: ``engine`` is not distributed, or the launcher's world size is not ``nproc``.
    """
    if config.engine != "distributed":
        raise UsageError("needs engine distributed", field="engine", value=config.engine)
    if under_launcher():
        world = int(os.environ["WORLD_SIZE"])
        if world != config.setting.nproc:
            raise UsageError(f"the launcher started {world} processes; pass {world} or leave it out",
                             field="nproc", value=config.setting.nproc)
        if int(os.environ["RANK"]) != 0:
            worker_main(config)
            return None
        return DistributedSession(config, spawn=False)
    return DistributedSession(config, spawn=True)


class DistributedSession:
    """Rank 0 for one experiment: the processes, the process group and the parameter server.

    Entering starts them (spawned here with ``spawn``, else already started by the launcher);
    leaving stops the workers, reaps the processes and destroys the group, whatever happened.
    SIGTERM stops the experiment as Ctrl-C does (``run_experiment`` turns it into one).
    """

    def __init__(self, config: SimulateConfig, spawn: bool) -> None:
        self.config, self.spawn = config, spawn
        self.cluster: LocalCluster | None = None
        self.server: ParameterServer | None = None
        self.run_id = 0
        self.jobs = 1  # the runs share the processes: one at a time
        self.interrupted = False
        self.threads: list[int] = []  # torch.get_num_threads() measured on each rank, by rank
        self._stack = ExitStack()
        _device(config)
        self.workload = Workload(config.workload)  # before the processes: a bad corpus is refused at once
        rows = 2 * config.window + config.workers + 4  # the server's buffers
        self.workload.check_memory(rows, "nproc", config.setting.nproc)

    def context(self, seed: int, progress: Callable[[StepEvent], None] | None) -> RunContext:
        """What the runs of ``seed`` share, evaluated here on the server (``runs.make_context``)."""
        return make_context(self.config, self.workload, seed, progress)

    def __enter__(self) -> DistributedSession:
        try:
            self._start()
        except BaseException:
            self._stop()
            raise
        return self

    def _start(self) -> None:
        c = self.config
        if self.spawn:
            tmp = self._stack.enter_context(_scratch())
            cfg = tmp / "config.json"
            cfg.write_text(config_to_json(c))
            argv = [sys.executable, "-m", "naig.simulate.distributed", str(cfg)]
            cluster = LocalCluster(argv, c.setting.nproc, c.setting.timeout, tmp, threads=c.threads)
            self.cluster = self._stack.enter_context(cluster)
        init(0, c.setting.nproc, backend_for(self.workload.device), c.setting.timeout,
             store=None if self.cluster is None else self.cluster.store)
        self.threads = threads_per_rank()
        groups = pair_groups(0, c.setting.nproc, c.setting.timeout)
        self.server = ParameterServer(self.workload, c, {r - 1: Link(g, r) for r, g in groups.items()})

    def run(self, rule: str, seed: int, lr: float, ctx: RunContext) -> RunResult:
        """One run on the live workers (raises ``NoWorkerLeft`` when none is)."""
        assert self.server is not None
        if not self.server.live:
            raise NoWorkerLeft
        from naig.simulate.strategies import make_strategy

        strategy = make_strategy(rule, self.config.strategy_options(self.workload.sketch, lr))
        result = self.server.run(strategy, seed, lr, self.run_id, ctx)
        self.run_id += 1
        return result

    def partial(self) -> RunResult | None:
        """After Ctrl-C: the interrupted run, evaluated where it stopped."""
        self.interrupted = True
        return None if self.server is None else self.server.partial_result()

    def block(self) -> dict[str, Any] | None:
        """The result's ``distributed`` block: processes, lost workers, determinism."""
        c, server, cluster = self.config, self.server, self.cluster
        lost = [] if server is None else [
            dict(rec, log=cluster.log_tail(rec["rank"]) if cluster else None,
                 exit_code=cluster.exit_code(rec["rank"]) if cluster else None) for rec in server.lost]
        return {"engine": "distributed", "launcher": "local" if self.spawn else "torchrun",
                "backend": backend_for(self.workload.device), "nproc": c.setting.nproc, "workers": c.workers,
                "window": c.window, "sketch_first": c.setting.sketch_first,
                "slowdown": list(c.setting.slowdown) or None,
                "timeout_seconds": c.setting.timeout, "faults": list(c.faults),
                "threads_per_process": self.threads, "lost": lost,
                "live_at_end": [] if server is None else sorted(server.live), "deterministic": False,
                "determinism": DETERMINISM}

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def _stop(self) -> None:
        """Stop the workers, reap the processes, destroy the group (the block stays readable)."""
        try:
            if self.server is not None and not self.interrupted:
                self.server.close()
            if self.cluster is not None:
                self.cluster.stop([rec["rank"] for rec in (self.server.lost if self.server else [])])
                if self.interrupted:
                    self.cluster.shutdown(grace=0.0)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            self._stack.close()


@contextmanager
def _scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="naig-distributed-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
