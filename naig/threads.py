"""torch's intra-op CPU threads, set on purpose by every command that trains or computes gradients.

torch starts with one intra-op thread per core. For naig's models (gpt-nano: 120k parameters, a
few ms per step) that is a poor trade: ``benchmarks/threads.py`` measured a step of ``naig
simulate`` on the 2-core machine at 0.78× the time with a second thread when quiet, but 1.98×
beside one busy process (every parallel region waits for the descheduled thread) and 12.6× on a
loaded machine (docs/results/benchmarks.md). So ``simulate`` and ``detect`` default to
``DEFAULT_THREADS`` per process, the distributed engine's workers included, and use the cores
for processes instead (``simulate``'s runs side by side, ``naig.simulate.parallel``); each takes a
thread count (the ``threads`` field) for larger models.

numpy's own BLAS (OpenBLAS in the numpy and scipy wheels) also starts one thread per core, and
for the small matrices of the monitor's detectors (a 100 × 100 solve, a 14 × 14 inverse) that is
far worse: beside busy processes, as every rank of a CPU training run is, a 100 × 100
``np.linalg.solve`` took 14 ms with two threads and 0.34 ms with one (2-core machine,
2026-12-05). ``one_blas_thread`` runs a block with numpy's BLAS on one thread (threadpoolctl);
``Monitor.decide`` and ``Detector.update`` run under it, whatever ``OMP_NUM_THREADS`` says.

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

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from threadpoolctl import ThreadpoolController

from naig.choices import DEFAULT_THREADS  # intra-op threads per process unless `threads` says otherwise
from naig.errors import UsageError

__all__ = ["DEFAULT_THREADS", "MAX_THREADS", "check_threads", "one_blas_thread", "torch_threads"]

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
    import torch  # here, not at the top: the detectors use one_blas_thread without torch

    n = check_threads(threads)
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


_LOCK = threading.Lock()  # one thread at a time inside one_blas_thread
_INSIDE = threading.local()  # .depth: this thread's nesting (an inner block changes nothing)
_FOUND: dict = {"modules": -1, "controller": None}


def _blas() -> ThreadpoolController:
    """The BLAS libraries loaded in this process (numpy's and scipy's OpenBLAS), found again when
    modules have been imported since (a library such as scipy's comes with an extension module;
    finding them takes ~0.5 ms). Called with ``_LOCK`` held."""
    if _FOUND["modules"] != len(sys.modules):
        _FOUND["controller"] = ThreadpoolController().select(user_api="blas")
        _FOUND["modules"] = len(sys.modules)
    return _FOUND["controller"]


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run the block with numpy's and scipy's BLAS on one thread, restoring their counts after.

    For many small matrix operations on a busy machine (see the module); ~10 µs per block. The
    count is per process, so numpy called meanwhile from another thread runs on one thread too.
    Blocks nest, and blocks in several threads run one at a time (a lock: threadpoolctl's limits
    entered and left out of order by two threads would leave the count wrong). threadpoolctl ≥ 3.6
    lets only one thread at a time change OpenBLAS's count: while another thread holds its own
    ``threadpool_limits``, this one changes nothing. torch's own threads (``torch.set_num_threads``,
    OpenMP) are left as they are; where threadpoolctl finds no BLAS (numpy built on Accelerate)
    nothing changes.

    Example:
        >>> import numpy as np
        >>> with one_blas_thread():
        ...     float(np.linalg.solve(2 * np.eye(3), np.ones(3))[0])
        0.5
    """
    depth = getattr(_INSIDE, "depth", 0)
    if depth:  # nested in this thread: the outer block holds the lock and the limit
        _INSIDE.depth = depth + 1
        try:
            yield
        finally:
            _INSIDE.depth = depth
        return
    with _LOCK, _blas().limit(limits=1, user_api="blas"):
        _INSIDE.depth = 1
        try:
            yield
        finally:
            _INSIDE.depth = 0
