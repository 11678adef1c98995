"""The distributed engine: ``naig simulate`` on real processes, ``torch.distributed`` (docs/design.md §14).

An asynchronous parameter server (rank 0 holds θ, its version and the optimizer, and makes
every update through ``naig.simulate.server.ServerState``) and K worker processes, spawned
here on one machine or started by ``torchrun`` on several; gloo on CPU, NCCL on CUDA.

- ``session``: the experiment's processes, group and server (``open_distributed``);
- ``launcher``: spawning, rendezvous and process groups; ``transport``: the messages;
- ``server`` and ``worker``: the two roles; ``screen``: sketch-first; ``report``: measured
  staleness beside its prediction.
"""

from naig.simulate.engines.distributed.session import (
    DETERMINISM,
    DistributedSession,
    NoWorkerLeft,
    config_from_json,
    config_to_json,
    open_distributed,
)

__all__ = ["DETERMINISM", "DistributedSession", "NoWorkerLeft", "open_distributed", "config_to_json",
           "config_from_json"]
