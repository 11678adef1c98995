"""A worker process of the asynchronous parameter server (docs/design.md §14).

Loop: receive a command; on ``PARAMS`` receive θ, compute the gradient of the next
minibatch of this worker's own stream at θ (the same model, data and stream as the
simulated arrival mode: ``Workload.worker_grad``), apply this worker's injected faults
(``naig.simulate.faults``: gradient kinds change what it sends, sketch included; ``kill``
and ``hang`` stop the process), wait (slowdown − 1) × the compute time when slowed down,
then push the head and, in one message, the 14-float sketch and
the gradient (sketch-first: the sketch alone). ``FETCH`` sends the gradient of the last
push; ``PING`` is ignored; ``STOP`` ends the loop. A worker never decides anything: the
server holds θ, its version and the optimizer.
"""

from __future__ import annotations

import math
import os
import signal
import time
from typing import TYPE_CHECKING

import torch

from naig.simulate.distributed.transport import CODE_FETCH, CODE_PING, CODE_STOP, Command, Head, Link
from naig.simulate.faults import GRADIENT_FAULTS
from naig.simulate.workload import Workload, fault_seed, stream_seed
from naig.sketch.core import SKETCH_DIM

if TYPE_CHECKING:
    from naig.simulate.distributed.setting import DistributedSetting
    from naig.simulate.runs import RunRules

__all__ = ["Worker"]


class Worker:
    """Worker ``index`` (rank index + 1) of a parameter server, talking over its pair ``link``.

    Args:
        sim: the simulation's workload (model, data, sketch), built from the same config as the server's.
        setting: the distributed setting (this worker's slowdown, sketch-first).
        rules: the runs' rules (this worker's faults).
        link: the pair's process group, peer rank 0.
        index: the worker index w (0-based).
    """

    def __init__(self, sim: Workload, setting: DistributedSetting, rules: RunRules, link: Link,
                 index: int) -> None:
        self.sim, self.link, self.index = sim, link, index
        self.slowdown = setting.slowdown[index] if setting.slowdown else 1.0
        self.sketch_first = setting.sketch_first
        self.faults = [f for f in rules.faults if f.worker == index]
        n, device = sim.n_params, sim.device
        self.theta = torch.empty(n, device=device)
        self.payload = torch.empty(SKETCH_DIM + n, device=device)  # [sketch | gradient]: one message
        self.sketch, self.grad = self.payload[:SKETCH_DIM], self.payload[SKETCH_DIM:]
        self.command = torch.empty(4, dtype=torch.float64, device=device)
        self.run_id = -1
        self.gen = self.fault_gen = sim.generator(0)

    def run(self) -> int:
        """Serve commands until ``STOP``; returns the number of gradients computed."""
        jobs = 0
        while True:
            self.link.recv(self.command)
            cmd = Command.decode(self.command.cpu())
            if cmd.code == CODE_STOP:
                return jobs
            if cmd.code == CODE_PING:
                continue
            if cmd.code == CODE_FETCH:
                self.link.send(self.grad)
                continue
            self.link.recv(self.theta)
            self._job(cmd)
            jobs += 1

    def _job(self, cmd: Command) -> None:
        """One gradient at the θ just received, pushed as head, sketch (and gradient)."""
        if cmd.run != self.run_id:  # a new run: this worker's stream of that seed from its start
            self.run_id, self.gen = cmd.run, self.sim.generator(stream_seed(cmd.seed, self.index))
            self.fault_gen = self.sim.generator(fault_seed(cmd.seed, self.index))
        self._crash_faults(cmd.version)
        start = time.perf_counter()
        loss = float(self.sim.worker_grad(self.theta, self.gen, self.grad))
        for f in self.faults:
            if f.kind in GRADIENT_FAULTS and f.active(cmd.version):
                f.apply(self.grad, self.fault_gen)
                loss = math.nan if f.kind == "nan" else loss
        time.sleep((self.slowdown - 1.0) * (time.perf_counter() - start))
        self.sketch.copy_(self.sim.sketch(self.grad))  # float64 → float32 on the wire: 56 B
        head = Head(cmd.version, loss, time.perf_counter() - start, cmd.run)
        self.link.send(head.encode().to(self.grad.device))
        self.link.send(self.sketch if self.sketch_first else self.payload)

    def _crash_faults(self, version: int) -> None:
        """``kill``: SIGKILL this process; ``hang``: never answer again."""
        active = [f for f in self.faults if f.active(version)]
        if any(f.kind == "kill" for f in active):
            os.kill(os.getpid(), signal.SIGKILL)
        if any(f.kind == "hang" for f in active):
            while True:
                time.sleep(3600)
