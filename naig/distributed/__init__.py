"""NAIG on real processes with ``torch.distributed`` (docs/design.md §14).

- ``run_distributed``: the ``naig simulate`` runs on an asynchronous parameter server
  (rank 0 holds θ, its version and the optimizer) and K worker processes, spawned here
  on one machine or started by ``torchrun`` on several; gloo on CPU, NCCL on CUDA.
- ``NaigCommHook`` (``naig.distributed.ddp``): a ``DistributedDataParallel`` communication
  hook that sketches each rank's bucket, shares the 14 floats, logs E_k, cos and π_k and
  optionally routes the all-reduce.
- Pieces: ``protocol`` (messages), ``launch`` (processes and groups), ``server``,
  ``worker``, ``screen`` (sketch-first), ``report`` (staleness vs prediction), ``faults``.
"""

from naig.distributed.ddp import HookRecord, NaigCommHook, naig_comm_hook
from naig.distributed.faults import WORKER_FAULTS, WorkerFault, parse_worker_faults
from naig.distributed.run import DETERMINISM, config_from_json, config_to_json, run_distributed

__all__ = ["run_distributed", "DETERMINISM", "config_to_json", "config_from_json", "NaigCommHook",
           "naig_comm_hook", "HookRecord", "WORKER_FAULTS", "WorkerFault", "parse_worker_faults"]
