"""Imported by the tests' servers before they fork runs (``tests.cli_child.preload``): the installed
integrations of ``tests.cli_child.OPTIONAL_PRELOAD``, each left out when it fails to import (an extra
built for another torch, say): a server must start whatever an extra does, and the tests of that
extra then fail on the import error themselves, in the run that needs it. Never collected
(the root conftest): importing it imports the frameworks."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util

from tests.cli_child import OPTIONAL_PRELOAD

__all__: list[str] = []

for _extra, _module in OPTIONAL_PRELOAD:
    if importlib.util.find_spec(_extra) is not None:
        with contextlib.suppress(Exception):  # (see the module: the run that needs it says why)
            importlib.import_module(_module)
