"""What the monitor's rank scripts (tests/monitor_*_ranks.py) share: each rank's batches and a gather
of one small tensor per rank with a timeout (every collective of a test has one)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["exit_after", "gather_rows", "rank_batch"]


def rank_batch(rank: int, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch at ``step``: x (size, 8) float32 and its 4-class label (size,) int64."""
    g = torch.Generator().manual_seed(10_000 * rank + step)
    x = torch.randn(size, 8, generator=g)
    return x, (x[:, :4].sum(1) > 0).long() + 2 * (x[:, 4:].sum(1) > 0).long()


def gather_rows(x: torch.Tensor, world: int, timeout: float) -> list[list]:
    """All-gather ``x`` from every rank, waiting at most ``timeout`` seconds; (world, ...) as lists."""
    out = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(out, x, async_op=True).wait(timeout=timedelta(seconds=timeout))
    return torch.stack(out).tolist()


def exit_after(main: Callable[[str], None], out: str) -> None:
    """Run a rank script's ``main(out)``; once it has returned (the group destroyed, rank 0's children
    waited for and the results written), leave without interpreter finalisation.

    A finished rank that tears down gloo's threads during finalisation can still abort
    ("terminate called without an active exception"; seen once in four clean-clone CI runs of the
    DDP rank script, under load) although its work is complete and checked; ``os._exit`` after
    flushing skips that teardown. An exception in ``main`` propagates as usual (exit status 1).
    """
    main(out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
