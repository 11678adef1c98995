"""The closed choices of naig's options, and the defaults and limits the CLI shows, defined once:
the library checks against them and the CLI builds its choices and help from them.

Light on purpose (no imports): ``naig_cli`` imports it at start-up.

Example:
    >>> OPTIMIZERS, ENGINES
    (('sgd', 'adam'), ('simulated', 'distributed'))
"""

__all__ = ["OPTIMIZERS", "DEVICES", "MODELS", "REFERENCES", "ENGINES", "ARRIVAL_MODES", "LOCAL_METHODS",
           "TOPOLOGIES", "GASLOC_FORMS", "DEFAULT_THREADS", "MAX_TIMEOUT",
           "MIN_TIMEOUT"]

OPTIMIZERS = ("sgd", "adam")  # the server optimizer: torch.optim.SGD / Adam, default settings otherwise
DEVICES = ("cpu", "cuda", "auto")
MODELS = ("gpt-nano", "gpt-micro", "gpt2-124m")  # the presets of naig.simulate.model.PRESETS
REFERENCES = ("auto", "batch", "ema")  # naig's reference: by setting, the freshest of the batch, an EMA
ENGINES = ("simulated", "distributed")  # one process, or real processes on torch.distributed
ARRIVAL_MODES = ("blocking", "non-blocking", "shared-memory")  # how a worker waits for parameters
# the local-update methods of naig.simulate.arrivals.local (on the arrivals clock; not Batch → Update rules)
LOCAL_METHODS = ("diloco", "diloco-naig", "diloco-naig-exact", "gasloc", "gossip-adam", "local-sgd",
                 "allreduce")
# gasloc's communication graph of a round: a random perfect matching, the union of two, K − 1 peers, a ring
TOPOLOGIES = ("one-peer", "two-peer", "complete", "ring")
# where gasloc's momentum acts: on the mixed iterates (DiLoCo on a complete graph) or the un-mixed proposals
GASLOC_FORMS = ("mixed", "summarised")
DEFAULT_THREADS = 1  # torch CPU threads per process (naig.threads: measured, docs/design.md)
MAX_TIMEOUT = 30.0  # seconds: the longest any one collective or message may take (naig.launch)
# seconds: the shortest wait of a collective or message: gloo counts whole milliseconds, and a shorter
# one reads as 0, which means its group's own timeout (minutes) or an immediate failure
MIN_TIMEOUT = 0.001
