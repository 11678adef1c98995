"""The NAIG routing DDP hook, kept at its old import path: it lives in ``naig.monitor.routing``.

``from naig.distributed.ddp import NaigCommHook, naig_comm_hook, HookRecord`` keeps working.
"""

from naig.monitor.routing import TWO_RANKS, HookRecord, NaigCommHook, energies_to_mean, naig_comm_hook

__all__ = ["HookRecord", "NaigCommHook", "naig_comm_hook", "energies_to_mean", "TWO_RANKS"]
