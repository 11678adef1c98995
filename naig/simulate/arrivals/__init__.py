"""The arrivals setting and its engines: staleness from worker speeds on a clock (docs/design.md §11).

- ``setting``: ``ArrivalsSetting`` and its ``LocalUpdates`` block, validated on construction;
- ``engine``: ``ArrivalsEngine``, the gradient rules as arrivals (``sync`` as timed rounds);
- ``local``: ``LocalEngine``, local updates through a server (diloco, diloco-naig, local-sgd, ...);
- ``gossip``: ``GossipEngine``, decentralised local updates with no server (gasloc, gossip-adam).

Importing this package loads no torch; its names load their submodules on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from naig.lazy import lazy_names

_HOME = {"setting": ("ArrivalsSetting", "LocalUpdates"), "engine": ("ArrivalsEngine",),
         "local": ("LocalEngine",), "gossip": ("GossipEngine",)}

if TYPE_CHECKING:
    from naig.simulate.arrivals.engine import ArrivalsEngine
    from naig.simulate.arrivals.gossip import GossipEngine
    from naig.simulate.arrivals.local import LocalEngine
    from naig.simulate.arrivals.setting import ArrivalsSetting, LocalUpdates

__all__ = ["ArrivalsSetting", "LocalUpdates", "ArrivalsEngine", "LocalEngine", "GossipEngine"]

__getattr__, __dir__ = lazy_names(__name__, _HOME, globals())
