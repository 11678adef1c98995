"""``drop-stale``: discard gradients staler than ``max_staleness``, average the rest.

ĝ = (1/|S|) Σ_{k∈S} g_k with S = {k : τ_k ≤ max_staleness} (default K, the number of
workers); π_k = 1/|S| on S and 0 elsewhere (left out of the sum). When S is empty no
step is taken (``Update.lr_scale = 0``). A standard bounded-staleness baseline: the
server enforces the bound by discarding (the stale synchronous parallel server of Ho et
al. 2013 enforces a bound by making fast workers wait instead).

Defined in arrival mode only. With fixed lags (lockstep) dropping by τ keeps a fixed
subset of the workers for the whole run, and at the default bound it is ``fresh-only``,
the lockstep oracle, under another name; it is refused there (use ``fresh-only``).
"""

from __future__ import annotations

import torch

from naig.simulate.strategies.base import (
    Batch,
    Strategy,
    StrategyOptions,
    Update,
    no_step,
    register,
    weighted_sum,
)

__all__ = ["DropStale"]


@register
class DropStale(Strategy):
    """Mean of the gradients with τ_k ≤ ``max_staleness``; no step when none is left."""

    name = "drop-stale"
    modes = frozenset({"arrivals"})

    def __init__(self, options: StrategyOptions) -> None:
        super().__init__(options)
        bound = options.workers if options.max_staleness is None else options.max_staleness
        if bound is None:
            raise ValueError("drop-stale needs StrategyOptions.max_staleness or .workers (K)")
        self.max_staleness = bound

    @classmethod
    def mode_hint(cls, mode: str) -> str:
        """Points at fresh-only."""
        return ("with fixed lags it keeps a fixed subset of workers (at the default bound it is "
                "the oracle fresh-only); use fresh-only, or arrival mode")

    def combine(self, batch: Batch) -> Update:
        """See the module docstring and ``Strategy.combine``."""
        grads = batch.grads
        keep = (batch.staleness <= self.max_staleness).to(grads.device)
        kept = int(keep.sum())
        if kept == 0:
            return no_step(grads)
        pi = keep.to(torch.float64) / kept
        return Update(weighted_sum(pi, grads), pi)
