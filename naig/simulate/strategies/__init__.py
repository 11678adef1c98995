"""Gradient-combination rules for the simulator (docs/design.md §8), one file per rule.

``STRATEGIES`` maps the strategy names to classes; ``make_strategy``
instantiates one. Rules: ``sync``, ``hogwild``, ``naig``, ``staleness``,
``dc-asgd``, ``naig-exact``.

Example:
    >>> import torch
    >>> s = make_strategy("hogwild")
    >>> g = torch.tensor([[1.0, 0.0], [3.0, 2.0]])
    >>> batch = Batch(g, torch.tensor([0, 5]), torch.tensor([0, 1]), torch.zeros(2), torch.zeros(2, 2))
    >>> s.combine(batch).grad.tolist()
    [2.0, 1.0]
"""

from __future__ import annotations

from naig.simulate.strategies import dc_asgd, hogwild, naig, naig_exact, staleness, sync  # noqa: F401
from naig.simulate.strategies.base import (
    STRATEGIES,
    Batch,
    Strategy,
    StrategyOptions,
    Update,
    make_strategy,
    register,
)

__all__ = ["STRATEGIES", "Batch", "Strategy", "StrategyOptions", "Update", "make_strategy", "register"]
