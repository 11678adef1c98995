"""The online arrival clock a training loop drives, one arrival at a time (docs/design.md §10).

``ArrivalClock`` replays the process of ``simulate_arrivals`` event by event, with the
same per-worker random streams, but lets the caller decide when the server applies an
update: ``next_arrival()`` returns the next gradient to reach the master, ``applied()``
advances the version (once per window of B arrivals, or not at all when a window is
dropped). The reply to an arrival carries the version current when the caller asks for
the next arrival, so a worker that arrives mid-window gets the current version and the
worker that completes a window gets the new one. With every arrival applied (B = 1) its
staleness sequence is the engine's, value for value.

``RoundClock`` draws synchronous round times max_i C_i, the same values as
``round_times``.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from naig.arrivals.distributions import COMPUTE, DOWNLINK, PER_SAMPLE, UPLINK, Distribution, worker_stream
from naig.arrivals.model import ArrivalModel, check_seed

__all__ = ["Arrival", "ArrivalClock", "RoundClock"]

_CHUNK = 256


class _Stream:
    """Buffered draws of one worker's component (values do not depend on the chunk size)."""

    def __init__(self, dists: tuple[Distribution, ...], worker: int, component: int, seed: int,
                 family: int, offset: float = 0.0) -> None:
        self._dist = dists[worker] if dists else None
        self._rng = worker_stream(seed, worker, component, family) if dists else None
        self._offset, self._buf, self._pos = offset, np.zeros(0), 0

    def draw(self) -> float:
        if self._dist is None:
            return 0.0 + self._offset
        if self._pos == len(self._buf):
            self._buf, self._pos = self._dist.sample(self._rng, _CHUNK), 0
        self._pos += 1
        return float(self._buf[self._pos - 1]) + self._offset


class _Worker:
    """One worker's streams: downlink D, compute X = x0 + b·x1, uplink U (seconds)."""

    def __init__(self, model: ArrivalModel, i: int, seed: int, family: int) -> None:
        self.down = _Stream(model.downlink, i, DOWNLINK, seed, family, float(model.transfer_down()[i]))
        self.up = _Stream(model.uplink, i, UPLINK, seed, family, float(model.transfer_up()[i]))
        self.x0 = _Stream(model.compute, i, COMPUTE, seed, family)
        self.x1 = _Stream(model.per_sample, i, PER_SAMPLE, seed, family) if model.per_sample else None
        self.b = model.batch_size

    def compute(self) -> float:
        x = self.x0.draw()
        return x + self.b * self.x1.draw() if self.x1 is not None else x

    def cycle(self) -> float:
        d = self.down.draw()
        x = self.compute()
        return d + x + self.up.draw()


@dataclass(frozen=True)
class Arrival:
    """One gradient reaching the master.

    Attributes:
        worker: the worker index, 0..K−1.
        job: that worker's job index (0, 1, …).
        time: simulated seconds at the arrival.
        pulled: the parameter version the gradient was computed on.
        staleness: τ = current version − pulled (the version the update is applied at,
            since versions advance once per window).
        age: seconds from the creation of version ``pulled`` to ``time``.
    """

    worker: int
    job: int
    time: float
    pulled: int
    staleness: int
    age: float


class ArrivalClock:
    """Gradient arrivals at the master for a training loop; the caller applies updates.

    Args:
        model: the workers and the protocol (blocking, non-blocking, shared-memory).
        seed: 0..2^64−1, the same seed as ``simulate_arrivals`` for the same process.

    Example:
        >>> clock = ArrivalClock(ArrivalModel.from_specs("const:1,const:2"))
        >>> taus = []
        >>> for _ in range(6):
        ...     a = clock.next_arrival()
        ...     taus.append((a.worker, a.time, a.staleness))
        ...     _ = clock.applied()
        >>> taus
        [(0, 1.0, 0), (0, 2.0, 0), (1, 2.0, 2), (0, 3.0, 1), (0, 4.0, 0), (1, 4.0, 2)]
    """

    def __init__(self, model: ArrivalModel, seed: int = 0) -> None:
        seed = check_seed(seed)
        self.model = model
        self._workers = [_Worker(model, i, seed, 0) for i in range(model.workers)]
        self._blocking = model.mode != "non-blocking"
        self._heap: list[tuple[float, int, int, int, float]] = []  # time, worker, job, pulled, reply D
        self._created = [0.0]  # creation time of each version
        self._last: tuple[float, int, int, float] | None = None
        self._held = np.zeros(model.workers, dtype=np.int64)
        self.time, self.arrivals = 0.0, 0
        if self._blocking:
            for i, w in enumerate(self._workers):
                heapq.heappush(self._heap, (0.0 + w.cycle(), i, 0, 0, 0.0))
        else:
            self._start_non_blocking()

    @property
    def version(self) -> int:
        """The master's current parameter version (0 at the start; +1 per ``applied()``)."""
        return len(self._created) - 1

    def next_arrival(self) -> Arrival:
        """Advance to the next gradient arrival (ties: lower worker, then lower job, first)."""
        self._settle()
        if not self._blocking:
            self._generate()
        time, worker, job, pulled, reply = heapq.heappop(self._heap)
        self._last = (time, worker, job, reply)
        self.time, self.arrivals = time, self.arrivals + 1
        return Arrival(worker, job, time, pulled, self.version - pulled, time - self._created[pulled])

    def applied(self) -> int:
        """The server applied an update at the current time: version += 1; returns the new version."""
        self._created.append(self.time)
        return self.version

    def held(self) -> np.ndarray:
        """(K,) int64: the version each worker's latest job computes on.

        Blocking modes: the job in flight (``ArrivalTrace.pending``); the reply to the latest
        arrival is answered first, with the current version, so call it after ``applied()``.
        Non-blocking: the version of the latest job the clock has queued for each worker.
        """
        self._settle()
        return self._held.copy()

    def needed_versions(self) -> set[int]:
        """The parameter versions a queued or future job can still compute on.

        Queued jobs carry the version they pulled; a worker's next job computes on the
        version it holds or a newer one. A training loop keeps the parameters of these
        versions (and the current one) and may drop the others.
        """
        self._settle()
        queued = {int(entry[3]) for entry in self._heap}  # (time, worker, job, pulled, reply)
        newer = set(range(int(self._held.min()), self.version + 1)) if not self._blocking else set()
        return queued | {int(v) for v in self._held} | newer | {self.version}

    def _settle(self) -> None:
        """Reply to the latest arrival with the current version (the server takes 0 s)."""
        if self._last is None:
            return
        time, worker, job, reply = self._last
        self._last = None
        if self._blocking:
            self._held[worker] = self.version
            cycle = self._workers[worker].cycle()
            heapq.heappush(self._heap, (time + cycle, worker, job + 1, self.version, 0.0))
        else:
            heapq.heappush(self._replies[worker], (time + reply, self.version))

    def _start_non_blocking(self) -> None:
        """Each worker receives version 0 after D_0, then computes back to back."""
        self._replies: list[list[tuple[float, int]]] = [[] for _ in self._workers]
        self._next_job = [0] * len(self._workers)
        self._start = [w.down.draw() for w in self._workers]
        self._gen = [(s + w.compute(), i) for i, (s, w) in enumerate(zip(self._start, self._workers,
                                                                           strict=True))]
        heapq.heapify(self._gen)

    def _generate(self) -> None:
        """Queue every job whose compute ends no later than the earliest queued arrival."""
        while not self._heap or self._gen[0][0] <= self._heap[0][0]:
            end, i = heapq.heappop(self._gen)
            w, replies = self._workers[i], self._replies[i]
            while replies and replies[0][0] <= self._start[i]:
                self._held[i] = max(self._held[i], heapq.heappop(replies)[1])
            arrive = end + w.up.draw()
            heapq.heappush(self._heap, (arrive, i, self._next_job[i], int(self._held[i]), w.down.draw()))
            self._next_job[i] += 1
            self._start[i] = end
            heapq.heappush(self._gen, (end + w.compute(), i))


class RoundClock:
    """Synchronous round times max_i C_i, one round at a time (the values of ``round_times``).

    Example:
        >>> RoundClock(ArrivalModel.from_specs("const:1,const:3")).next_round()
        3.0
    """

    def __init__(self, model: ArrivalModel, seed: int = 0) -> None:
        seed = check_seed(seed)
        self._workers = [_Worker(model, i, seed, 1) for i in range(model.workers)]

    def next_round(self) -> float:
        """The duration of the next synchronous round, seconds."""
        return max(w.cycle() for w in self._workers)
