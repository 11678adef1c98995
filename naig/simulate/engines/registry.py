"""Which engine runs a (setting, rule) pair, and what its runs hold: the one lookup."""

from __future__ import annotations

from typing import TYPE_CHECKING

from naig.choices import LOCAL_METHODS

if TYPE_CHECKING:
    from naig.simulate.config import SimulateConfig
    from naig.simulate.engines.base import Engine, Run
    from naig.simulate.workload import Workload

__all__ = ["select", "start", "buffer_rows", "GOSSIP_METHODS"]

GOSSIP_METHODS = ("gasloc", "gossip-adam")
"""The decentralised local-update methods: their own engine (``naig.simulate.arrivals.gossip``), no server."""


def select(config: SimulateConfig, rule: str) -> Engine:
    """The simulated engine that runs ``rule`` in ``config``'s setting.

    Fixed lags run every gradient rule; with arrivals, the local-update methods run on the
    local engine and the gradient rules (``sync`` as timed rounds) on the arrivals engine.
    """
    if config.setting.NAME == "lags":
        from naig.simulate.lags.engine import LagsEngine

        return LagsEngine
    if rule in GOSSIP_METHODS:
        from naig.simulate.arrivals.gossip import GossipEngine

        return GossipEngine
    if rule in LOCAL_METHODS:
        from naig.simulate.arrivals.local import LocalEngine

        return LocalEngine
    from naig.simulate.arrivals.engine import ArrivalsEngine

    return ArrivalsEngine


def buffer_rows(config: SimulateConfig) -> tuple[int, str]:
    """The most (n,)-sized float32 buffers any run of ``config`` keeps, and the option that sets them.

    Fixed lags: K gradients, K stale parameter rows and the ring of min(max τ, steps − 1) + 1
    versions; arrivals: 2B window rows and at most K + 1 versions; local updates: per worker a
    replica, a gradient, a pseudo-gradient and AdamW's two moments; plus θ and its optimizer (3);
    gasloc and gossip-adam: at most 9 per worker (docs/design.md §13).
    """
    s, k = config.setting, config.workers
    if s.NAME == "lags":
        return 2 * k + min(max(s.lags), config.steps - 1) + 1 + 3, "lags"
    local = 5 * k + 3 if any(r in LOCAL_METHODS for r in config.strategies) else 0
    if {"gasloc", "gossip-adam"} & set(config.strategies):  # + θ^i, previous, proposals (Adam's moments)
        local = 9 * k + 3
    return max(2 * config.window + k + 1 + 3, local), "arrivals" if s.NAME == "arrivals" else "nproc"


def start(config: SimulateConfig, workload: Workload, rule: str, seed: int, lr: float | None = None) -> Run:
    """A simulated run of ``rule`` at step 0 on its engine (``lr``: default the first configured).

    The engine is handed the workload, ``config``'s setting and its ``run_rules``, not the tree.
    """
    return select(config, rule).start(workload, config.setting, config.run_rules, rule, seed,
                                      config.lr[0] if lr is None else lr)
