"""What the monitor's rank scripts (tests/monitor_*_ranks.py) share: each rank's batches and a gather
of one small tensor per rank with a timeout (every collective of a test has one)."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["gather_rows", "rank_batch"]


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
