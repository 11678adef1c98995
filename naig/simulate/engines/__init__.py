"""The engines: each way of running a simulation is one module (docs/design.md §8).

=================  ==========================================================================
``lags``           fixed lags τ_k: every rule of ``naig.simulate.strategies`` in lockstep
``arrivals``       gradient arrivals on a simulated clock (``sync``: timed synchronous rounds)
``local``          local updates and gossip on the same clock (diloco, diloco-naig, gasloc, ...)
``distributed``    real processes on ``torch.distributed``: a parameter server and K workers
=================  ==========================================================================

``select`` is the one place where a (setting, rule) pair is given its engine, and
``open_session`` the one place where the experiment is given its session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from naig.choices import LOCAL_METHODS

if TYPE_CHECKING:
    from naig.simulate.config import SimulateConfig
    from naig.simulate.engines.base import Engine, Run
    from naig.simulate.experiment import Session
    from naig.simulate.workload import Workload

__all__ = ["select", "start", "open_session", "buffer_rows"]


def select(config: SimulateConfig, rule: str) -> Engine:
    """The simulated engine that runs ``rule`` in ``config``'s setting.

    Fixed lags run every gradient rule; with arrivals, the local-update methods run on the
    local engine and the gradient rules (``sync`` as timed rounds) on the arrivals engine.
    """
    if config.setting.NAME == "lags":
        from naig.simulate.engines.lags import LagsEngine

        return LagsEngine
    if rule in LOCAL_METHODS:
        from naig.simulate.engines.local import LocalEngine

        return LocalEngine
    from naig.simulate.engines.arrivals import ArrivalsEngine

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


def start(workload: Workload, rule: str, seed: int, lr: float | None = None) -> Run:
    """A simulated run of ``rule`` at step 0 on its engine (``lr``: default the first configured)."""
    config = workload.config
    return select(config, rule).start(workload, rule, seed, config.lr[0] if lr is None else lr)


def open_session(config: SimulateConfig) -> Session | None:
    """The experiment's session: simulated engines in this process, or the distributed engine's
    processes (None on a worker rank under a launcher, after it served)."""
    if config.setting.NAME == "distributed":
        from naig.simulate.engines.distributed import open_distributed

        return open_distributed(config)
    from naig.simulate.experiment import SimulatedSession

    return SimulatedSession(config)
