"""Imported by the tests' servers before they fork runs (``tests.cli_child.preload``): the installed
integrations of ``OPTIONAL``, each left out when it fails to import (an extra
built for another torch, say): a server must start whatever an extra does, and the tests of that
extra then fail on the import error themselves, in the run that needs it. Never collected
(the root conftest): importing it imports the frameworks."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util

__all__ = ["OPTIONAL"]

OPTIONAL = (("lightning", "lightning.pytorch"), ("transformers", "transformers.trainer"),
            ("accelerate", "accelerate"))
"""(optional extra, module): the runs and ranks that use Lightning, the Trainer or Accelerate then do
not import them each (1.7 s of CPU for lightning.pytorch, 1.5 s for transformers' Trainer, per
process, after torch)."""

for _extra, _module in OPTIONAL:
    if importlib.util.find_spec(_extra) is not None:
        with contextlib.suppress(Exception):  # (see the module: the run that needs it says why)
            importlib.import_module(_module)
