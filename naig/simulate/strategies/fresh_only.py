"""``fresh-only``: only the freshest gradient of a server step (a lockstep oracle).

ĝ = g_R with R the least stale worker (min τ, ties to the lowest worker index):
π_R = 1, every other π_k = 0 (left out of the sum, so a NaN there is harmless).

With fixed lags the lag-0 worker delivers a fresh gradient at every server step,
something no asynchronous system has, so the rule is an oracle: it is shown in tables
but never chosen as the best baseline (docs/design.md §12). It is refused in arrival
mode, where ``drop-stale`` with ``max_staleness`` 0 is the realisable version.
"""

from __future__ import annotations

import torch

from naig.simulate.strategies.base import Batch, Strategy, Update, reference_row, register

__all__ = ["FreshOnly"]


@register
class FreshOnly(Strategy):
    """ĝ = g_R, the least stale gradient; π = one-hot on R."""

    name = "fresh-only"
    modes = frozenset({"lockstep"})

    @classmethod
    def mode_hint(cls, mode: str) -> str:
        """Points at drop-stale."""
        return ("it is the fixed-lag (lockstep) oracle; in arrival mode use drop-stale with "
                "`max_staleness`=0")

    def combine(self, batch: Batch) -> Update:
        """See the module docstring and ``Strategy.combine``."""
        grads = batch.grads
        ref = reference_row(batch.staleness, batch.workers)
        pi = torch.zeros(grads.shape[0], dtype=torch.float64, device=grads.device)
        pi[ref] = 1.0
        return Update(grads[ref].clone(), pi)
