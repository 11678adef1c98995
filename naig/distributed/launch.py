"""The process launcher, kept at its old import path: it lives in ``naig.launch`` (below the monitor,
which uses its timeout bound).

``from naig.distributed.launch import process_group`` keeps working.
"""

from naig.launch import (
    ENV_PARENT,
    ENV_STORE,
    MAX_TIMEOUT,
    RENDEZVOUS_SECONDS,
    LocalCluster,
    backend_for,
    init,
    process_group,
    under_launcher,
    watch_parent,
)

__all__ = ["ENV_STORE", "ENV_PARENT", "MAX_TIMEOUT", "RENDEZVOUS_SECONDS", "LocalCluster", "backend_for",
           "under_launcher", "init", "watch_parent", "process_group"]
