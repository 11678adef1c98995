"""naig inside the user's own data-parallel training (docs/design.md §14).

- ``NaigCommHook`` (``naig.distributed.ddp``, defined in ``naig.monitor.routing``): a
  ``DistributedDataParallel`` communication hook that sketches each rank's bucket, shares the
  14 floats, logs E_k, cos and π_k and optionally routes the all-reduce. Per-rank signals,
  naming a bad rank and acting on it: ``naig.monitor.MonitorHook``.

Importing this package loads no simulator module and no scipy. naig's own real-process
engine (a parameter server and workers for ``naig simulate --engine distributed``) lives
in ``naig.simulate.distributed``.
"""

from naig.distributed.ddp import HookRecord, NaigCommHook, naig_comm_hook

__all__ = ["NaigCommHook", "naig_comm_hook", "HookRecord"]
