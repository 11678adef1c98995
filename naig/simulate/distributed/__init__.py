"""The distributed setting and its engine: ``naig simulate`` on real processes (docs/design.md §14).

An asynchronous parameter server (rank 0 holds θ, its version and the optimizer, and makes
every update through ``naig.simulate.server.ServerState``) and K worker processes, spawned
here on one machine or started by ``torchrun`` on several; gloo on CPU, NCCL on CUDA.

- ``setting``: ``DistributedSetting`` (processes, window, timeout), validated on construction;
- ``session``: the experiment's processes, group and server (``open_distributed``);
- ``naig.launch``: spawning, rendezvous and process groups; ``transport``: the messages;
- ``server`` and ``worker``: the two roles; ``screen``: sketch-first; ``report``: measured
  staleness beside its prediction.

Importing this package loads no torch; its names load their submodules on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from naig.lazy import lazy_names

_HOME = {"setting": ("DistributedSetting",),
         "session": ("DETERMINISM", "DistributedSession", "NoWorkerLeft", "open_distributed",
                     "config_to_json", "config_from_json")}

if TYPE_CHECKING:
    from naig.simulate.distributed.session import (
        DETERMINISM,
        DistributedSession,
        NoWorkerLeft,
        config_from_json,
        config_to_json,
        open_distributed,
    )
    from naig.simulate.distributed.setting import DistributedSetting

__all__ = ["DistributedSetting", "DETERMINISM", "DistributedSession", "NoWorkerLeft", "open_distributed",
           "config_to_json", "config_from_json"]

__getattr__, __dir__ = lazy_names(__name__, _HOME, globals())
