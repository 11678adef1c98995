"""Gradient-combination rules for the simulator (docs/design.md §8, §10), one file per rule.

``STRATEGIES`` maps the strategy names to classes; ``make_strategy``
instantiates one. Rules: ``sync``, ``hogwild``, ``naig``, ``staleness``,
``dc-asgd``, ``naig-exact``; baselines and ablations ``fresh-only`` (lockstep oracle),
``drop-stale`` (arrivals), ``naig-blind``, ``staleness-lr``, ``dc-asgd-a``,
``gap-aware``; robust aggregation ``median``, ``trimmed-mean``, ``krum``,
``multi-krum``, ``centered-clip``.

Example:
    >>> import torch
    >>> s = make_strategy("hogwild")
    >>> g = torch.tensor([[1.0, 0.0], [3.0, 2.0]])
    >>> batch = Batch(g, torch.tensor([0, 5]), torch.tensor([0, 1]), torch.zeros(2), torch.zeros(2, 2))
    >>> s.combine(batch).grad.tolist()
    [2.0, 1.0]
"""

from __future__ import annotations

from naig.simulate.strategies import (  # noqa: F401  (each module registers its rule)
    centered_clip,
    dc_asgd,
    dc_asgd_a,
    drop_stale,
    fresh_only,
    gap_aware,
    hogwild,
    krum,
    median,
    multi_krum,
    naig,
    naig_blind,
    naig_exact,
    staleness,
    staleness_lr,
    sync,
    trimmed_mean,
)
from naig.simulate.strategies.base import (
    MODES,
    REFERENCES,
    STRATEGIES,
    Batch,
    Strategy,
    StrategyOptions,
    Update,
    make_strategy,
    parse_clip,
    register,
)

__all__ = [
    "MODES",
    "REFERENCES",
    "STRATEGIES",
    "Batch",
    "Strategy",
    "StrategyOptions",
    "Update",
    "make_strategy",
    "parse_clip",
    "register",
]
