"""torch's intra-op CPU threads, set on purpose by every command that trains or computes gradients.

torch starts with one intra-op thread per core. For naig's models (gpt-nano: 120k parameters, a
few ms per step) the per-operation work is too small to split: on a 2-core machine a second
thread brings nothing when the machine is quiet and, when another process keeps a core busy,
every parallel region waits for the descheduled thread (``benchmarks/threads.py`` measured
``naig simulate`` at 1 vs 2 threads, quiet and beside a busy process; docs/results/benchmarks.md).
So ``simulate`` and ``detect`` default to ``DEFAULT_THREADS`` per process, the distributed
engine's workers included, and take a thread count (the ``threads`` field) for larger models.

Example:
    >>> import torch
    >>> before = torch.get_num_threads()
    >>> with torch_threads(1):
    ...     torch.get_num_threads()
    1
    >>> torch.get_num_threads() == before
    True
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from naig.errors import UsageError

__all__ = ["DEFAULT_THREADS", "MAX_THREADS", "check_threads", "torch_threads"]

DEFAULT_THREADS = 1
"""Intra-op threads per process unless the ``threads`` field says otherwise (see the module)."""
MAX_THREADS = 1024
"""More threads than any machine has cores: refused as a typo."""


def check_threads(value: object, field: str = "threads") -> int:
    """Validate a thread count: an int in [1, ``MAX_THREADS``].

    Raises:
        UsageError: anything else, naming ``field``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_THREADS:
        raise UsageError(f"must be an int from 1 to {MAX_THREADS} (torch CPU threads per process), e.g. 1",
                         field=field, value=value)
    return value


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(threads)``, restoring the previous count after.

    Raises:
        UsageError: for a bad ``threads`` (before anything is changed).
    """
    n = check_threads(threads)
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
