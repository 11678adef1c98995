"""Stops from outside (Ctrl-C, SIGTERM) handled one way everywhere.

A scheduler (Slurm, Kubernetes) or ``kill`` ends a job with SIGTERM, a user with Ctrl-C
(SIGINT). naig treats the two alike: ``sigterm_as_interrupt`` turns SIGTERM into the
``KeyboardInterrupt`` Ctrl-C raises, so the code that keeps finished work on Ctrl-C keeps it on
SIGTERM too; ``deferred_interrupts`` holds both back over a few milliseconds of bookkeeping that
must not be cut in two (results already computed, about to be reported), and says whether one came.
Signal handlers belong to the main thread: elsewhere both blocks change nothing.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["sigterm_as_interrupt", "deferred_interrupts"]


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM raises ``KeyboardInterrupt`` in the main thread, as Ctrl-C does;
    after it the handler is what it was.

    Example:
        >>> with sigterm_as_interrupt():
        ...     pass
    """
    try:
        old = signal.signal(signal.SIGTERM, _raise_interrupt)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextmanager
def deferred_interrupts() -> Iterator[list[int]]:
    """Within the block SIGINT and SIGTERM are recorded, not raised: the block yields the list of
    the signal numbers that arrived (empty: none), for the caller to act on once it is done.

    Example:
        >>> with deferred_interrupts() as late:
        ...     pass
        >>> late
        []
    """
    late: list[int] = []
    try:
        old = {s: signal.signal(s, lambda signum, frame: late.append(signum))
               for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread
        yield late
        return
    try:
        yield late
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
