"""The fixed-lags setting and its engine: worker k's gradient is always τ_k steps old (docs/design.md §8).

- ``setting``: ``LagsSetting`` (the lags, the gradient dumps), validated on construction;
- ``engine``: ``LagsEngine``, every gradient rule of ``naig.simulate.strategies`` in lockstep.

Importing this package loads no torch; its names load their submodules on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from naig.lazy import lazy_names

_HOME = {"setting": ("LagsSetting",), "engine": ("LagsEngine", "LagsRun")}

if TYPE_CHECKING:
    from naig.simulate.lags.engine import LagsEngine, LagsRun
    from naig.simulate.lags.setting import LagsSetting

__all__ = ["LagsSetting", "LagsEngine", "LagsRun"]

__getattr__, __dir__ = lazy_names(__name__, _HOME, globals())
