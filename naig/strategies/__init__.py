"""Gradient-combination rules for ``naig simulate`` (SPEC §3.3), one file per rule.

``STRATEGIES`` maps the ``--strategies`` names to classes; ``make_strategy``
instantiates one. Rules: ``sync``, ``hogwild``, ``naig``, ``staleness``,
``dc-asgd``, ``naig-exact``.

Example:
    >>> import torch
    >>> s = make_strategy("hogwild")
    >>> g = torch.tensor([[1.0, 0.0], [3.0, 2.0]])
    >>> s.combine(g, torch.tensor([0, 5]), torch.zeros(2), torch.zeros(2, 2))[0].tolist()
    [2.0, 1.0]
"""

from __future__ import annotations

from naig.strategies import dc_asgd, hogwild, naig, naig_exact, staleness, sync  # noqa: F401
from naig.strategies.base import STRATEGIES, Strategy, StrategyOptions, make_strategy, register

__all__ = ["STRATEGIES", "Strategy", "StrategyOptions", "make_strategy", "register"]
