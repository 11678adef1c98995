"""The asynchronous parameter server: rank 0 holds θ, its version and the optimizer (docs/design.md §14).

One thread per worker owns that worker's pair link: it sends the server's orders
(parameters, a fetch, stop; a ping while the server is busy) and receives the worker's
pushes, which it posts on one event queue. The main thread takes the events in arrival
order and applies them as the simulated arrival mode does:

    arrival of worker w (pulled version v, sketch, gradient):
        τ = version − v                          (measured, recorded for every arrival)
        B = 1:  ĝ = strategy.combine(one row)    → optimizer step unless lr_scale = 0
                reply θ_version to w at once
        B ≥ 2:  the row joins the window; w gets the current version at once; the B-th
                arrival closes it: one combine, one step, version + 1
        held windows (``sync``: all live workers; sketch-first with B ≥ 2): the workers
                wait, and all get the new version when the window closes

``Update.lr_scale == 0`` means no step and no new version. A worker whose link fails
(process killed, machine gone, silent past the timeout) is reported with the run and
update at which it was lost; the server goes on with the others, and every update
already applied stays applied. Between runs the server waits for the jobs in flight and
discards them, so each run starts with every worker pulling version 0.
"""

from __future__ import annotations

import math
import queue
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from naig.simulate.distributed.report import staleness_block
from naig.simulate.distributed.screen import SketchScreen
from naig.simulate.distributed.transport import (
    CODE_FETCH,
    CODE_PARAMS,
    CODE_PING,
    CODE_STOP,
    COMMAND_BYTES,
    HEAD_BYTES,
    SKETCH_WIRE_BYTES,
    Command,
    Head,
    Link,
)
from naig.simulate.results import RunResult, pi_stats
from naig.simulate.runs import RunContext, StepEvent, evaluates, evaluation_points
from naig.simulate.server import ServerState
from naig.simulate.strategies import Batch, Strategy, Update
from naig.simulate.workload import Workload
from naig.sketch.core import SKETCH_DIM

if TYPE_CHECKING:
    from naig.simulate.config import SimulateConfig

__all__ = ["ParameterServer", "MAX_LOGGED"]

MAX_LOGGED = 100  # non-finite arrivals listed one by one per run (all are counted)


@dataclass
class _Order:
    command: Command
    theta: Tensor | None = None


@dataclass
class _Arrival:
    worker: int
    head: Head
    sketch: Tensor  # (14,) float32
    grad: Tensor | None  # the channel's buffer (None with sketch-first); valid until w is answered
    at: float  # perf_counter when the head arrived
    receive: float  # seconds receiving the sketch and gradient after the head
    reply: float  # seconds the server spent sending the θ this job was computed on
    up: int  # payload bytes of this push (head, sketch, gradient unless sketch-first)
    down: int  # payload bytes of the command and θ that started the job


@dataclass
class _Fetched:
    worker: int
    receive: float
    up: int  # the gradient
    down: int  # the fetch command


@dataclass
class _Lost:
    worker: int
    error: str
    at: float


class _Channel:
    """Worker w's link, owned by one daemon thread; orders in through ``inbox``, events out."""

    def __init__(self, worker: int, link: Link, sim: Workload, events: queue.Queue, ping: float,
                 sketch_first: bool) -> None:
        self.worker, self.link, self.events, self.ping = worker, link, events, ping
        self.device, self.sketch_first = sim.device, sketch_first
        self.inbox: queue.Queue[_Order] = queue.Queue()
        self.head = torch.empty(4, dtype=torch.float64, device=sim.device)
        self.payload = torch.empty(SKETCH_DIM + sim.n_params, device=sim.device)  # [sketch | gradient]
        self.sketch, self.grad = self.payload[:SKETCH_DIM], self.payload[SKETCH_DIM:]
        self.thread = threading.Thread(target=self._serve, name=f"naig-link-{worker}", daemon=True)

    def _serve(self) -> None:
        try:
            while self._one():
                pass
        except Exception as exc:  # the link is broken: a dead or silent worker
            self.events.put(_Lost(self.worker, _first_line(exc), time.perf_counter()))

    def _send_command(self, command: Command) -> None:
        self.link.send(command.encode().to(self.device))

    def _one(self) -> bool:
        try:
            order = self.inbox.get(timeout=self.ping)
        except queue.Empty:  # the server is busy (evaluating, between runs): keep the worker waiting
            self._send_command(Command(CODE_PING))
            return True
        sent, received = self.link.sent, self.link.received
        self._send_command(order.command)
        if order.command.code == CODE_STOP:
            return False
        start = time.perf_counter()
        if order.command.code == CODE_FETCH:
            self.link.recv(self.grad)
            self.events.put(_Fetched(self.worker, time.perf_counter() - start, self.link.received - received,
                                     self.link.sent - sent))
            return True
        self.link.send(order.theta)
        reply = time.perf_counter() - start
        down = self.link.sent - sent
        self.link.recv(self.head)
        return self._receive(reply, down, received)

    def _receive(self, reply: float, down: int, received: int) -> bool:
        at = time.perf_counter()
        self.link.recv(self.sketch if self.sketch_first else self.payload)
        head = Head.decode(self.head.cpu())
        grad = None if self.sketch_first else self.grad
        seconds, up = time.perf_counter() - at, self.link.received - received
        self.events.put(_Arrival(self.worker, head, self.sketch.clone(), grad, at, seconds, reply, up, down))
        return True


def _first_line(exc: BaseException) -> str:
    """The gist of a transport error: its first sentence, without gloo's source location."""
    lines = str(exc).strip().splitlines()
    text = re.sub(r"^\[[^\]]*\]\s*", "", lines[0] if lines else "")
    return (text.split(". ")[0] or type(exc).__name__)[:200]


class ParameterServer:
    """Rank 0: the workers' links, the live set, and one training run at a time.

    Args:
        sim: the simulation's workload (model, data, sketch), as every worker builds it.
        config: the simulation: the distributed engine drives its runs itself (budget, evaluation
            schedule, the rules' options), so its server is handed the tree by its session.
        links: worker index → its pair link (peer rank = index + 1).

    Attributes:
        live: workers whose link works. busy: workers with a job in flight.
        lost: one record per worker lost (run, update, seconds into the run, error).
    """

    def __init__(self, sim: Workload, config: SimulateConfig, links: dict[int, Link]) -> None:
        self.sim, self.config = sim, config
        self.events: queue.Queue = queue.Queue()
        ping, first = config.setting.timeout / 3, config.setting.sketch_first
        self.channels = {w: _Channel(w, link, sim, self.events, ping, first) for w, link in links.items()}
        self.live, self.busy = set(links), set()
        self.lost: list[dict] = []
        self.deferred: deque = deque()
        self.current: _ServerRun | None = None
        for ch in self.channels.values():
            ch.thread.start()

    def next_event(self) -> object:
        """The next event: deferred ones first, then the queue (woken twice a second for Ctrl-C)."""
        if self.deferred:
            return self.deferred.popleft()
        while True:
            try:
                return self.events.get(timeout=0.5)
            except queue.Empty:
                continue

    def order(self, worker: int, order: _Order) -> None:
        """Queue an order for a worker's link thread; a parameters order makes the worker busy."""
        if order.command.code == CODE_PARAMS:
            self.busy.add(worker)
        self.channels[worker].inbox.put(order)

    def fetch(self, worker: int) -> _Fetched | None:
        """Sketch-first: ask ``worker`` for its gradient and wait for it (other events wait too).

        Returns:
            The fetch (seconds, bytes), or None when the worker was lost meanwhile.
        """
        if worker not in self.live:
            return None
        self.order(worker, _Order(Command(CODE_FETCH)))
        while True:
            try:
                ev = self.events.get(timeout=0.5)  # bounded: the link's timeout posts a loss
            except queue.Empty:
                continue
            if isinstance(ev, _Fetched) and ev.worker == worker:
                return ev
            if isinstance(ev, _Lost) and ev.worker == worker:
                self.mark_lost(ev)
                return None
            self.deferred.append(ev)

    def mark_lost(self, ev: _Lost) -> None:
        """Record a lost worker with where the current run stood."""
        if ev.worker not in self.live:
            return
        self.live.discard(ev.worker)
        self.busy.discard(ev.worker)
        run = self.current
        self.lost.append({"worker": ev.worker, "rank": ev.worker + 1, "error": ev.error,
                          "strategy": None if run is None else run.strategy.name,
                          "seed": None if run is None else run.seed,
                          "update": None if run is None else run.t,
                          "arrivals": None if run is None else run.gradients,
                          "seconds": None if run is None else run.wall(ev.at)})
        if run is not None:
            run.lost.append(self.lost[-1])

    def run(self, strategy: Strategy, seed: int, lr: float, run_id: int, ctx: RunContext) -> RunResult:
        """Train one (strategy, seed, lr) run on the live workers to the end of its gradient budget."""
        run = _ServerRun(self, strategy, seed, lr, run_id, ctx)
        self.current = run
        for w in sorted(self.live):
            run.reply(w)
        while not run.done:
            run.handle(self.next_event())
        self.drain()
        result = run.result()
        self.current = None
        return result

    def drain(self) -> None:
        """Wait for every job in flight and discard it: afterwards every live worker is idle."""
        while self.busy:
            ev = self.next_event()
            if isinstance(ev, _Arrival):
                self.busy.discard(ev.worker)
            elif isinstance(ev, _Lost):
                self.mark_lost(ev)

    def partial_result(self) -> RunResult | None:
        """The run interrupted by Ctrl-C, evaluated where it stopped (None between runs)."""
        run, self.current = self.current, None
        return None if run is None else run.result(interrupted=True)

    def close(self, seconds: float = 10.0) -> None:
        """Tell every live worker to stop (once idle) and wait up to ``seconds`` for the link threads."""
        self.drain()
        for w in sorted(self.live):
            self.order(w, _Order(Command(CODE_STOP)))
        deadline = time.monotonic() + seconds
        for ch in self.channels.values():
            ch.thread.join(max(0.0, deadline - time.monotonic()))


@dataclass
class _Row:
    """One gradient of a window (or the single arrival at B = 1)."""

    worker: int
    tau: int
    stale: Tensor  # (n,) the parameters it was computed on
    sketch: Tensor
    grad: Tensor | None
    receive: float
    index: int  # its arrival index in the run's log


@dataclass
class _Log:
    """Per-arrival records of one run."""

    worker: list[int] = field(default_factory=list)
    tau: list[int] = field(default_factory=list)
    time: list[float] = field(default_factory=list)
    weight: list[float] = field(default_factory=list)  # coefficient × lr scale; 0: no step / not fetched
    fetched: list[bool] = field(default_factory=list)
    compute: list[float] = field(default_factory=list)
    non_finite: list[dict] = field(default_factory=list)
    non_finite_count: int = 0
    receive: list[float] = field(default_factory=list)  # per update, seconds
    route: list[float] = field(default_factory=list)  # per update: combine + optimizer step + snapshot
    reply: list[float] = field(default_factory=list)  # per arrival: sending θ back
    up: int = 0  # payload bytes of the arrivals (and fetches) counted, worker → server
    down: int = 0  # payload bytes of the commands and θ that started them, server → worker


class _ServerRun:
    """One run's state on the server: θ, versions, the open window, the records."""

    def __init__(self, server: ParameterServer, strategy: Strategy, seed: int, lr: float, run_id: int,
                 ctx: RunContext) -> None:
        sim, c = server.sim, server.config
        self.server, self.sim, self.config, self.ctx = server, sim, c, ctx
        self.strategy, self.seed, self.lr, self.run_id = strategy, seed, lr, run_id
        self.state = ServerState(sim.init_params(seed), strategy, c.optimizer, lr, c.workers)  # faults: at
        self.theta = self.state.theta  # the workers (what they send), not here
        self.version, self.t, self.gradients = 0, 0, 0
        self.versions: dict[int, Tensor] = {0: self.theta.detach().clone()}
        self.held: dict[int, int] = {}
        self.k, self.budget = c.workers, c.steps * c.workers
        self.window = c.window if strategy.uses_lags else c.workers
        self.hold = not strategy.uses_lags or (c.setting.sketch_first and self.window > 1)
        self.screen = SketchScreen(c.beta, c.line) if c.setting.sketch_first else None
        held = self.window > 1 or self.hold  # a held window of one (sync with one worker) keeps its row too
        self.grads = self.theta.detach().new_empty(self.window, sim.n_params) if held else None
        self.rows: list[_Row] = []
        self.log, self.lost = _Log(), []
        self.diverged_at: int | None = None
        self.start, self.paused, self.progress_done, self.said_end = time.perf_counter(), 0.0, 0, False
        self.curve, self.seconds = [(0, ctx.untrained)], [0.0]

    # -- bookkeeping ---------------------------------------------------------------------------

    def wall(self, at: float | None = None) -> float:
        """Seconds since the run started, evaluation pauses excluded."""
        return (time.perf_counter() if at is None else at) - self.start - self.paused

    @property
    def done(self) -> bool:
        """Budget spent, diverged, or no worker left."""
        return self.gradients >= self.budget or self.diverged_at is not None or not self.server.live

    def reply(self, worker: int) -> None:
        """Send worker the current version (it holds that version until its next arrival)."""
        if worker not in self.server.live:
            return
        self.held[worker] = self.version
        cmd = Command(CODE_PARAMS, self.version, self.seed, self.run_id)
        self.server.order(worker, _Order(cmd, self.versions[self.version]))
        needed = set(self.held.values()) | {self.version}
        for v in [v for v in self.versions if v not in needed]:
            del self.versions[v]

    # -- events --------------------------------------------------------------------------------

    def handle(self, ev: object) -> None:
        """Apply one event (an arrival, or a lost worker)."""
        if isinstance(ev, _Lost):
            self.server.mark_lost(ev)
            self.held.pop(ev.worker, None)
            if self.hold and self.rows:
                self._maybe_close()
        elif isinstance(ev, _Arrival):
            self._arrival(ev)

    def _arrival(self, ev: _Arrival) -> None:
        w = ev.worker
        self.server.busy.discard(w)
        if ev.head.run != self.run_id:  # cannot happen after a drain; never mix runs
            self.reply(w)
            return
        tau = self.version - ev.head.version
        row = _Row(w, tau, self.versions[ev.head.version], ev.sketch, ev.grad, ev.receive, self.gradients)
        self._record(ev, tau)
        if self.window == 1 and not self.hold:
            self._single(row)
            self.reply(w)
        else:
            self._add(row)
        self._evaluate_if_due()

    def _record(self, ev: _Arrival, tau: int) -> None:
        log = self.log
        log.worker.append(ev.worker)
        log.tau.append(tau)
        log.time.append(self.wall(ev.at))
        log.weight.append(0.0)
        log.fetched.append(not self.config.setting.sketch_first)
        log.compute.append(ev.head.compute)
        log.reply.append(ev.reply)
        log.up += ev.up
        log.down += ev.down
        if not bool(torch.isfinite(ev.sketch).all()):
            log.non_finite_count += 1
            if len(log.non_finite) < MAX_LOGGED:
                log.non_finite.append({"worker": ev.worker, "arrival": self.gradients, "update": self.t})
        self.gradients += 1

    def _single(self, row: _Row) -> None:
        """B = 1: one combine and at most one step; sketch-first: naig's w from the sketch, a fetch
        only when w ≥ 0.01, applied with lr η·w."""
        if self.screen is None:
            self._combine([row])
            return
        w = self.screen.single(row.sketch)
        if self.screen.fetch(w, 1) and self._fetch(row, None):
            self._combine([row], torch.tensor([w], dtype=torch.float64), w)

    def _fetch(self, row: _Row, slot: int | None) -> bool:
        """Sketch-first: get the row's gradient from its worker, into window row ``slot`` (None:
        leave it in the link's buffer); False if the worker was lost."""
        fetched = self.server.fetch(row.worker)
        if fetched is None:
            return False
        grad = self.server.channels[row.worker].grad
        row.grad = grad if slot is None else self.grads[slot].copy_(grad)
        row.receive += fetched.receive
        self.log.up += fetched.up
        self.log.down += fetched.down
        self.log.fetched[row.index] = True
        return True

    def _add(self, row: _Row) -> None:
        """A window row: held windows wait for all; others answer the worker at once."""
        if row.grad is not None:
            row.grad = self.grads[len(self.rows)].copy_(row.grad)
        self.rows.append(row)
        if self.hold:
            self._maybe_close()
            return
        if len(self.rows) == self.window:
            self._combine(self.rows)
            self.rows = []
        self.reply(row.worker)

    def _maybe_close(self) -> None:
        """Close a held window once it has B rows or every live worker waits in it."""
        waiting = {r.worker for r in self.rows}
        if len(self.rows) < self.window and not self.server.live <= waiting:
            return
        rows, self.rows = self.rows, []
        if self.screen is None:
            self._combine(rows)
        else:
            self._screened_window(rows)
        for w in sorted(waiting):
            self.reply(w)

    def _screened_window(self, rows: list[_Row]) -> None:
        """Sketch-first in a window: π from the sketches, fetch the rows with π ≥ 0.01/B, ĝ = Σ π_k g_k."""
        pi = self.screen.window(torch.stack([r.sketch for r in rows]), [r.tau for r in rows],
                                [r.worker for r in rows])
        fetched, weights = [], []
        for r, p in zip(rows, pi.tolist(), strict=True):
            if self.screen.fetch(p, len(rows)) and self._fetch(r, len(fetched)):
                fetched.append(r)
                weights.append(p)
        if fetched:
            self._combine(fetched, torch.tensor(weights, dtype=torch.float64))

    # -- the update ----------------------------------------------------------------------------

    def _combine(self, rows: list[_Row], weights: Tensor | None = None, lr_scale: float = 1.0) -> Update:
        """One combine of the rows and, unless lr_scale is 0, one optimizer step.

        Without ``weights`` the strategy combines them; with them (sketch-first) ĝ = Σ π_k g_k.
        """
        start = time.perf_counter()
        if len(rows) == 1:
            grads, stale = rows[0].grad.unsqueeze(0), rows[0].stale.unsqueeze(0)
        else:
            grads, stale = self.grads[:len(rows)], torch.stack([r.stale for r in rows])
        device = self.sim.device
        workers = torch.tensor([r.worker for r in rows], dtype=torch.long, device=device)
        if weights is None:
            taus = torch.tensor([r.tau for r in rows], dtype=torch.long, device=device)
            update = self.state.apply(Batch(grads, taus, workers, self.theta.detach(), stale), step=self.t)
        else:  # sketch-first: the screen's weights
            w = weights.to(device=grads.device)
            update = Update(w.to(grads.dtype) @ grads, w, lr_scale)
            self.state.commit(update, workers)
        if update.lr_scale != 0.0:
            self._stepped(update, rows)
        self.log.route.append(time.perf_counter() - start)
        self.log.receive.append(sum(r.receive for r in rows))
        return update

    def _stepped(self, update: Update, rows: list[_Row]) -> None:
        """After ``ServerState`` made the step: the log, divergence, the new version."""
        weights = update.weights.detach().to(torch.float64).cpu()
        for r, wt in zip(rows, weights.tolist(), strict=True):
            self.log.weight[r.index] = wt
        if self.state.diverged:
            self.diverged_at = self.t
        self.t += 1
        self.version += 1
        self.versions[self.version] = self.theta.detach().clone()

    # -- evaluation and results ----------------------------------------------------------------

    def _evaluate_if_due(self) -> None:
        c = self.config
        progress = self.gradients // self.k
        ended = self.diverged_at is not None and not self.said_end  # the run's last event, said once
        if progress <= self.progress_done and not ended:
            return
        due = evaluates(c, progress, self.progress_done) and self.diverged_at is None
        loss = self._evaluate() if due else None
        ended = self.diverged_at is not None and not self.said_end  # the evaluation may find it diverged
        self.progress_done, self.said_end = max(progress, self.progress_done), self.said_end or ended
        event = StepEvent(self.strategy.name, self.seed, self.lr, self.progress_done, c.steps, loss,
                          self.wall(), diverged_at=self.diverged_at if ended else None)
        self.ctx.progress(event)

    def _evaluate(self) -> float:
        start = time.perf_counter()
        seconds = self.wall(start)
        loss = self.sim.evaluate(self.theta.detach(), self.ctx.val)
        if not math.isfinite(loss) and self.diverged_at is None:  # θ finite, its loss not: diverged
            self.diverged_at = max(self.t - 1, 0)
            loss = math.nan
        self.curve.append((self.t, loss))
        self.seconds.append(seconds)
        self.paused += time.perf_counter() - start
        return loss

    def result(self, interrupted: bool = False) -> RunResult:
        """The run's ``RunResult`` (the same fields as the simulated arrival mode's)."""
        wall = self.wall()
        complete = self.progress_done >= self.config.steps
        if self.diverged_at is None and not complete:
            self._evaluate()  # where it stopped (workers lost, Ctrl-C)
        final = self.curve[-1][1] if self.diverged_at is None else math.nan
        self._pad_curve(wall)
        test = None
        if self.ctx.test is not None:
            test = math.nan if self.diverged_at is not None else self.sim.evaluate(self.theta.detach(),
                                                                                   self.ctx.test)
        log = self.log
        tau, who = np.asarray(log.tau, dtype=np.int64), np.asarray(log.worker, dtype=np.int64)
        staleness = staleness_block(tau, who, np.asarray(log.time), self.k, self.window,
                                    applies=not self.hold and not self.lost)
        return RunResult(self.strategy.name, self.seed, final, tuple(self.curve),
                         ms_per_step=1000 * wall / max(self.t, 1), diverged_at=self.diverged_at, lr=self.lr,
                         final_test_loss=test, curve_seconds=tuple(self.seconds), updates=self.t,
                         staleness=staleness, distributed=self._details(wall, interrupted),
                         correction=self.state.corrections.mean,
                         complete=complete or self.diverged_at is not None,
                         **pi_stats(self.state.history.rows()))

    def _pad_curve(self, wall: float) -> None:
        """NaN at the evaluation points a diverged or cut-short run did not reach (equal curve lengths)."""
        points = len(evaluation_points(self.config))
        while len(self.curve) < points:
            self.curve.append((self.t, math.nan))
            self.seconds.append(wall)
        del self.curve[points:], self.seconds[points:]

    def _details(self, wall: float, interrupted: bool) -> dict:
        log, n = self.log, self.sim.n_params
        up, down = log.up, log.down
        arrivals = max(len(log.worker), 1)
        fetched = sum(log.fetched)
        per_worker = np.bincount(np.asarray(log.worker, dtype=np.int64), minlength=self.k)
        return {
            "arrivals": len(log.worker), "arrivals_per_worker": per_worker.tolist(), "updates": self.t,
            "no_step_arrivals": sum(1 for wt in log.weight if wt == 0.0),
            "window": self.window, "held_window": self.hold, "interrupted": interrupted,
            "wall_seconds": wall, "eval_seconds": self.paused, "lost": list(self.lost),
            "non_finite": {"count": log.non_finite_count, "arrivals": log.non_finite,
                           "weights": [log.weight[a["arrival"]] for a in log.non_finite]},
            "compute_seconds": _per_worker_mean(log.compute, log.worker, self.k),
            "bytes": {"up": up, "down": down, "up_per_arrival": up / arrivals,
                      "down_per_arrival": down / arrivals, "gradient": 4 * n, "sketch": SKETCH_WIRE_BYTES,
                      "head": HEAD_BYTES, "command": COMMAND_BYTES, "fetched": fetched,
                      "not_fetched": len(log.worker) - fetched,
                      "saved_up": (len(log.worker) - fetched) * 4 * n},
            "server_ms": _server_ms(log),
        }


def _per_worker_mean(values: list[float], workers: list[int], k: int) -> list[float]:
    v, w = np.asarray(values), np.asarray(workers, dtype=np.int64)
    return [float(v[w == i].mean()) if (w == i).any() else math.nan for i in range(k)]


def _server_ms(log: _Log) -> dict:
    """Milliseconds per update: receive, route + apply and their sum (means and medians), and per reply."""
    def ms(x: list[float], stat: object = np.mean) -> float:
        return 1000 * float(stat(x)) if x else math.nan

    total = [a + b for a, b in zip(log.receive, log.route, strict=True)]
    return {"receive": ms(log.receive), "route_apply": ms(log.route), "per_update": ms(total),
            "reply": ms(log.reply), "median": {"receive": ms(log.receive, np.median),
                                               "route_apply": ms(log.route, np.median),
                                               "per_update": ms(total, np.median)}}
