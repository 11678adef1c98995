"""pytest, at the root: bytecode cached for every process of the suite; the optional integrations' library
modules are left out of the doctest collection (``--doctest-modules`` imports every module of naig/) when
their extra is not installed or they hold no example; their tests skip with a reason without the extra
(``tests.conftest.needs``). The helper modules of tests/ that are not test files (the scripts each rank of
a multi-process test runs, ``tests/*_ranks.py``, and the CLI child) hold no doctests and are never
collected: importing them would import the integrations' frameworks (and fail without their extra) for
nothing."""

import importlib.util
import os
import sys
from pathlib import Path

# Bytecode is cached (in the ``__pycache__`` folders, which git ignores) even where
# PYTHONDONTWRITEBYTECODE asks otherwise, before anything else is imported: the suite starts many
# interpreters (xdist workers, the servers, ranks, fresh interpreters), and each compiled naig's and
# the tests' sources again (pytest's rewritten test modules too). 2026-12-07, this 2-core VM, the
# whole suite: 538 s of CPU against 583-627 s (277.6 against 301.8-322.8 s).
if sys.dont_write_bytecode:
    sys.dont_write_bytecode = False
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import torch  # noqa: E402  (after the bytecode setting)

# Without CUDA the Triton kernels run interpreted; the variable must be set before anything imports
# triton, and one xdist worker runs many test files.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_EXTRAS = {"naig/monitor/lightning.py": "lightning", "naig/monitor/transformers.py": "transformers",
           "naig/monitor/accelerate.py": "accelerate"}

# (left out with their extra installed too while they hold no example: each xdist worker would import
# Lightning, the Trainer and Accelerate to find none, ~3 s of CPU; their tests import them)
_ROOT = Path(__file__).parent
collect_ignore = [path for path, package in _EXTRAS.items()
                  if importlib.util.find_spec(package) is None or ">>>" not in (_ROOT / path).read_text()]
collect_ignore_glob = ["tests/*_ranks.py", "tests/monitor_rank_tools.py", "tests/cli_child.py",
                       "tests/preload_extras.py"]
