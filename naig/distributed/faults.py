"""Worker-process faults of the distributed engine, injected for experiments and tests.

A fault is written ``W:KIND[@STEP]``: worker W (0-based; rank W + 1) misbehaves from the
first job whose pulled parameter version is at least STEP (default 0):

========  =================================================================
``kill``  the worker process kills itself with SIGKILL (a crashed machine)
``nan``   it sends a gradient (and sketch) of NaN instead of its gradient
``hang``  it stops answering (the server's message timeout declares it lost)
========  =================================================================

Example:
    >>> [str(f) for f in parse_worker_faults(("1:kill@20", "0:nan"), workers=3)]
    ['1:kill@20', '0:nan@0']
    >>> parse_worker_faults(("3:kill",), workers=3)
    Traceback (most recent call last):
    ...
    naig.errors.UsageError: worker_faults='3:kill': worker 3 does not exist; use 0..2
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from naig.errors import UsageError

__all__ = ["WORKER_FAULTS", "WorkerFault", "parse_worker_faults"]

WORKER_FAULTS = ("kill", "nan", "hang")
_PATTERN = re.compile(r"^(?P<worker>\d+):(?P<kind>[a-z]+)(?:@(?P<step>\d+))?$")


@dataclass(frozen=True)
class WorkerFault:
    """One injected worker fault.

    Attributes:
        worker: the worker index W (rank W + 1).
        kind: ``kill``, ``nan`` or ``hang``.
        start: the first pulled parameter version at which it acts.
    """

    worker: int
    kind: str
    start: int = 0

    def __str__(self) -> str:
        return f"{self.worker}:{self.kind}@{self.start}"

    def active(self, version: int) -> bool:
        """True for a job computed on parameter version ``version`` (≥ ``start``)."""
        return version >= self.start


def parse_worker_faults(specs: Sequence[str], workers: int) -> tuple[WorkerFault, ...]:
    """Parse ``W:KIND[@STEP]`` strings for K = ``workers`` workers.

    Raises:
        UsageError: (field ``worker_faults``) for a malformed spec, an unknown kind or a
            worker outside 0..K−1.
    """
    out = []
    for spec in specs:
        m = _PATTERN.match(spec.strip())
        if m is None or m["kind"] not in WORKER_FAULTS:
            raise UsageError(f"use W:KIND[@STEP] with KIND one of {', '.join(WORKER_FAULTS)}, e.g. 1:kill@20",
                             field="worker_faults", value=spec)
        worker = int(m["worker"])
        if worker >= workers:
            raise UsageError(f"worker {worker} does not exist; use 0..{workers - 1}", field="worker_faults",
                             value=spec)
        out.append(WorkerFault(worker, m["kind"], int(m["step"] or 0)))
    return tuple(out)
