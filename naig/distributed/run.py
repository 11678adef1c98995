"""``run_distributed``: the simulate runs on real processes, rank 0 the parameter server (docs/design.md §14).

On one machine (no launcher environment) this process becomes rank 0 and spawns the K
workers (``LocalCluster``); under ``torchrun`` every rank calls it, rank 0 serves and
returns the result, the others work and return None. The runs are those of ``naig
simulate`` (every strategy × seed × lr, one after another, on the same processes) and
the result is the same ``SimulateResult``, with the measured staleness of every run and
a ``distributed`` block (processes, lost workers, bytes, server time).

Results are not reproducible run to run: the arrival order depends on the operating
system's scheduling, so the same seed gives different staleness sequences and losses
(``DETERMINISM``). Run several seeds, or the same command several times, and report the
spread.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from naig.distributed.launch import LocalCluster, backend_for, init, pair_groups, under_launcher, watch_parent
from naig.distributed.protocol import Link
from naig.distributed.server import ParameterServer
from naig.distributed.worker import Worker
from naig.errors import UsageError
from naig.simulate.config import SimulateConfig
from naig.simulate.loop import ROUTING_BYTES, RunContext, Simulation, StepEvent, environment
from naig.simulate.results import RunResult, SimulateResult, summarise

__all__ = ["DETERMINISM", "run_distributed", "worker_main", "config_to_json", "config_from_json"]

DETERMINISM = ("not reproducible: the order in which gradients arrive depends on the operating system's "
               "scheduling of the processes, so staleness and losses differ from run to run for the same "
               "seed; compare the spread over seeds or repeated runs, not single values")


def config_to_json(config: SimulateConfig) -> str:
    """The config as a JSON object (every field)."""
    return json.dumps(dataclasses.asdict(config))


def config_from_json(text: str) -> SimulateConfig:
    """A config from ``config_to_json``'s text (lists become tuples); validated again.

    Example:
        >>> c = SimulateConfig(engine="distributed", nproc=3, steps=4)
        >>> config_from_json(config_to_json(c)) == c
        True
    """
    fields = json.loads(text)
    return SimulateConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


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
    _device(config)
    sim = Simulation(config)
    init(rank, world, backend_for(sim.device), config.timeout)
    groups = pair_groups(rank, world, config.timeout)
    jobs = Worker(sim, Link(groups[rank], 0), rank - 1).run()
    dist.destroy_process_group()
    return jobs


def run_distributed(config: SimulateConfig,
                    progress: Callable[[StepEvent], None] | None = None) -> SimulateResult | None:
    """Run every strategy, seed and lr of ``config`` on a parameter server and K worker processes.

    Args:
        config: a config with ``engine`` distributed (``nproc`` = K + 1 processes).
        progress: called on rank 0 after every step-equivalent (K gradients) of every run.

    Returns:
        On rank 0 the ``SimulateResult`` (``interrupted`` after Ctrl-C: the finished runs and
        the interrupted one, evaluated where it stopped); on other ranks None.

    Raises:
        UsageError: ``engine`` is not distributed, or the launcher's world size is not ``nproc``.
    """
    if config.engine != "distributed":
        raise UsageError("needs engine distributed", field="engine", value=config.engine)
    if under_launcher():
        world = int(os.environ["WORLD_SIZE"])
        if world != config.nproc:
            raise UsageError(f"the launcher started {world} processes; pass {world} or leave it out",
                             field="nproc", value=config.nproc)
        if int(os.environ["RANK"]) != 0:
            worker_main(config)
            return None
        return _serve(config, progress, None, "torchrun")
    with _scratch() as tmp:
        cfg = tmp / "config.json"
        cfg.write_text(config_to_json(config))
        argv = [sys.executable, "-m", "naig.distributed", str(cfg)]
        with LocalCluster(argv, config.nproc, config.timeout, tmp) as cluster:
            return _serve(config, progress, cluster, "local")


@contextmanager
def _scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="naig-distributed-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the server as Ctrl-C does (results kept, workers reaped)."""
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _serve(config: SimulateConfig, progress: Callable[[StepEvent], None] | None,
           cluster: LocalCluster | None, launcher: str) -> SimulateResult:
    """Rank 0: build, join, serve every run, shut down; the result."""
    _device(config)
    threads = torch.get_num_threads()
    if cluster is not None:
        torch.set_num_threads(cluster.threads)
    try:
        with _sigterm_as_interrupt():
            sim = Simulation(config)
            init(0, config.nproc, backend_for(sim.device), config.timeout,
                 store=None if cluster is None else cluster.store)
            groups = pair_groups(0, config.nproc, config.timeout)
            server = ParameterServer(sim, {r - 1: Link(g, r) for r, g in groups.items()})
            runs, untrained, interrupted = _runs(server, progress)
            if not interrupted:
                server.close()
            if cluster is not None:
                cluster.stop([rec["rank"] for rec in server.lost])  # a hung worker never exits by itself
                if interrupted:
                    cluster.shutdown(grace=0.0)
    finally:
        torch.set_num_threads(threads)
        if dist.is_initialized():
            dist.destroy_process_group()
    n = sim.n_params
    block = _block(config, sim, server, cluster, launcher)
    summaries, best = summarise(runs, config.strategies, "arrivals")
    return SimulateResult(config, str(sim.device), n, statistics.fmean(untrained) if untrained else math.nan,
                          ROUTING_BYTES, 4 * n, tuple(runs), summaries, (),
                          environment(str(sim.device)), interrupted, best, distributed=block)


def _runs(server: ParameterServer,
          progress: Callable[[StepEvent], None] | None) -> tuple[list[RunResult], list[float], bool]:
    """Every (seed, strategy, lr) run in ``simulate``'s order; stops early on Ctrl-C or with no worker."""
    sim, c = server.sim, server.config
    runs: list[RunResult] = []
    untrained: list[float] = []
    run_id = 0
    try:
        for seed in range(c.seeds):
            ctx = _context(sim, seed, progress)
            untrained.append(ctx.untrained)
            for name in c.strategies:
                for lr in c.lr:
                    if not server.live:
                        return runs, untrained, False
                    runs.append(server.run(sim.strategy(name), seed, lr, run_id, ctx))
                    run_id += 1
    except KeyboardInterrupt:
        partial = server.partial_result()
        return runs + ([partial] if partial is not None else []), untrained, True
    return runs, untrained, False


def _context(sim: Simulation, seed: int, progress: Callable[[StepEvent], None] | None) -> RunContext:
    val = sim.val_batches(seed)
    test = sim.test_batches(seed) if sim.config.tuning else None
    return RunContext(val, test, sim.evaluate(sim.init_params(seed), val), progress or (lambda event: None))


def _block(config: SimulateConfig, sim: Simulation, server: ParameterServer, cluster: LocalCluster | None,
           launcher: str) -> dict[str, Any]:
    """The result's ``distributed`` block: processes, lost workers, determinism."""
    lost = [dict(rec, log=cluster.log_tail(rec["rank"]) if cluster else None,
                 exit_code=cluster.exit_code(rec["rank"]) if cluster else None) for rec in server.lost]
    return {"engine": "distributed", "launcher": launcher, "backend": backend_for(sim.device),
            "nproc": config.nproc, "workers": config.workers, "window": config.window,
            "sketch_first": config.sketch_first, "slowdown": list(config.slowdown) or None,
            "timeout_seconds": config.timeout, "worker_faults": list(config.worker_faults),
            "threads_per_process": torch.get_num_threads() if cluster is None else cluster.threads,
            "lost": lost, "live_at_end": sorted(server.live), "deterministic": False,
            "determinism": DETERMINISM}
