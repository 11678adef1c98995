"""torch's intra-op CPU threads, set on purpose by every command that trains or computes gradients.

torch starts with one intra-op thread per core. For naig's models (gpt-nano: 120k parameters, a
few ms per step) that is a poor trade: ``benchmarks/threads.py`` measured a step of ``naig
simulate`` on the 2-core machine at 0.78× the time with a second thread when quiet, but 1.98×
beside one busy process (every parallel region waits for the descheduled thread) and 12.6× on a
loaded machine (docs/results/benchmarks.md). So ``simulate`` and ``detect`` default to
``DEFAULT_THREADS`` per process, the distributed engine's workers included, and use the cores
for processes instead (``simulate``'s runs side by side, ``naig.simulate.parallel``); each takes a
thread count (the ``threads`` field) for larger models.

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

from naig.choices import DEFAULT_THREADS  # intra-op threads per process unless `threads` says otherwise
from naig.errors import UsageError

__all__ = ["DEFAULT_THREADS", "MAX_THREADS", "check_threads", "torch_threads"]

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
