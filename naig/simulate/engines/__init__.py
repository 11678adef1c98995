"""The engine interface and the one lookup (docs/design.md §8).

Each setting is a package holding its settings dataclass and its engines:

=========================  ==================================================================
``lags.engine``            fixed lags τ_k: every rule of ``naig.simulate.strategies`` in lockstep
``arrivals.engine``        gradient arrivals on a simulated clock (``sync``: timed rounds)
``arrivals.local``         local updates through a server on the same clock (diloco, ...)
``arrivals.gossip``        decentralised local updates, no server (gasloc, gossip-adam)
``distributed``            real processes on ``torch.distributed``: a server and K workers
=========================  ==================================================================

This package holds what they share: ``base`` (the ``Engine`` and ``Run`` protocols,
``OnServer``), ``simulated`` (the session of the simulated engines in this process) and
``registry``.

``registry.select`` is the one place where a (setting, rule) pair is given its engine, and
``open_session`` the one place where the experiment is given its session (``simulated``: the
simulated engines in this process; ``distributed``: the processes). The run contracts they
implement are in ``naig.simulate.runs``, which imports no engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from naig.simulate.engines.registry import GOSSIP_METHODS, buffer_rows, select, start

if TYPE_CHECKING:
    from naig.simulate.config import SimulateConfig
    from naig.simulate.runs import Session

__all__ = ["select", "start", "open_session", "buffer_rows", "GOSSIP_METHODS"]


def open_session(config: SimulateConfig) -> Session | None:
    """The experiment's session: simulated engines in this process, or the distributed engine's
    processes (None on a worker rank under a launcher, after it served)."""
    if config.setting.NAME == "distributed":
        from naig.simulate.distributed import open_distributed

        return open_distributed(config)
    from naig.simulate.engines.simulated import SimulatedSession

    return SimulatedSession(config)
