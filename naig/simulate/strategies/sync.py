"""``sync``: the synchronous all-reduce ideal — every gradient taken at θ_t, uniform mean."""

from __future__ import annotations

from naig.simulate.strategies.base import register
from naig.simulate.strategies.hogwild import Hogwild

__all__ = ["Sync"]


@register
class Sync(Hogwild):
    """ĝ = (1/K) Σ_k ∇L_k(θ_t): the simulator treats every τ_k as 0 (``uses_lags = False``)."""

    name = "sync"
    uses_lags = False
