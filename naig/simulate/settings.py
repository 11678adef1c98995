"""The settings of a simulation: exactly one per experiment, each validating only its own fields.

=====================  =====================================================================
``LagsSetting``        fixed lags τ_k (``naig.simulate.lags``)
``ArrivalsSetting``    gradient arrivals on a simulated clock (``naig.simulate.arrivals``); its
                       ``local`` block holds the local-update options (``arrivals.local``)
``DistributedSetting`` real processes: a parameter server and K workers (``naig.simulate.distributed``)
=====================  =====================================================================

Local updates are a block of the arrivals setting, not a setting of their own: diloco,
gasloc and their kin run on the same clock as the gradient rules listed beside them, and
compare with them side by side (docs/design.md §13).

Every field defaults to "not given" where the difference matters (``None``): the local
block's fields are only accepted with a local-update method, and ``SimulateConfig`` checks
what joins a setting to the rest (docs/design.md §8).

Example:
    >>> ArrivalsSetting(compute="exp:1,exp:2").workers
    2
    >>> LagsSetting(lags=(0, -1))
    Traceback (most recent call last):
    ...
    naig.errors.UsageError: lags=(0, -1): use non-negative ints, one per worker, e.g. 0,10,20,35
"""

from __future__ import annotations

from naig.simulate.arrivals.setting import LOCAL_USERS, ArrivalsSetting, LocalUpdates
from naig.simulate.distributed.setting import DistributedSetting
from naig.simulate.lags.setting import LagsSetting

__all__ = ["LagsSetting", "ArrivalsSetting", "LocalUpdates", "DistributedSetting", "Setting", "SETTINGS",
           "LOCAL_USERS"]

Setting = LagsSetting | ArrivalsSetting | DistributedSetting
SETTINGS: dict[str, type[Setting]] = {s.NAME: s for s in (LagsSetting, ArrivalsSetting, DistributedSetting)}
