"""pytest, at the root: the optional integrations' library modules are left out of the doctest
collection (``--doctest-modules`` imports every module of naig/) when their extra is not installed;
their tests skip with a reason (``pytest.importorskip``)."""

import importlib.util

_EXTRAS = {"naig/monitor/lightning.py": "lightning", "naig/monitor/transformers.py": "transformers",
           "naig/monitor/accelerate.py": "accelerate"}

collect_ignore = [path for path, package in _EXTRAS.items() if importlib.util.find_spec(package) is None]
