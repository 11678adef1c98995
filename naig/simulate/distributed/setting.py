"""The distributed setting: real processes, a parameter server and K workers (docs/design.md §14).

Example:
    >>> DistributedSetting(nproc=5).workers
    4
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from naig.choices import LOCAL_METHODS, MAX_TIMEOUT, MIN_TIMEOUT
from naig.simulate.checks import as_tuple, check, is_int, is_number
from naig.simulate.options import option

__all__ = ["DistributedSetting"]


@dataclass(frozen=True)
class DistributedSetting:
    """Real processes on ``torch.distributed`` (docs/design.md §14).

    Attributes:
        nproc: processes, the server plus K = nproc − 1 workers.
        window: B arrivals per update (1: ASGD; K: K-batch-async).
        slowdown: compute-time factor ≥ 1 per worker (empty: full speed).
        sketch_first: workers push 14 floats; the server fetches a gradient when w ≥ 0.01.
        timeout: seconds any one message may take, in [0.001, 30].
    """

    NAME: ClassVar[str] = "distributed"
    ENGINE: ClassVar[str] = "distributed"
    asynchronous: ClassVar[bool] = True
    nproc: int | None = option("distributed.nproc")
    window: int = option("distributed.window")
    slowdown: tuple[float, ...] = option("distributed.slowdown")
    sketch_first: bool = option("distributed.sketch_first")
    timeout: float = option("distributed.timeout")

    def __post_init__(self) -> None:
        object.__setattr__(self, "slowdown", as_tuple(self.slowdown, "slowdown", "1, 1, 2, 4"))
        check(self.nproc is not None, "nproc", None,
              "is needed with `engine` distributed: the server plus K workers, e.g. 5")
        check(is_int(self.nproc) and self.nproc >= 2, "nproc", self.nproc,
              "use an int >= 2: the server plus at least one worker, e.g. 5")
        k = self.workers
        check(is_int(self.window) and 1 <= self.window <= k, "window", self.window,
              f"use an int in 1..{k} (1: ASGD, {k}: K-batch-async)")
        check(len(self.slowdown) in (0, k) and all(is_number(v) and math.isfinite(v) and v >= 1
                                                     for v in self.slowdown),
              "slowdown", self.slowdown, f"give {k} factors >= 1, one per worker, e.g. {','.join(['1'] * k)}")
        check(isinstance(self.sketch_first, bool), "sketch_first", self.sketch_first, "use true or false")
        check(is_number(self.timeout) and math.isfinite(self.timeout)
              and MIN_TIMEOUT <= self.timeout <= MAX_TIMEOUT, "timeout", self.timeout,
              f"use seconds in [{MIN_TIMEOUT:g}, {MAX_TIMEOUT:g}] (gloo counts whole milliseconds)")

    @property
    def workers(self) -> int:
        """K = nproc − 1."""
        return (self.nproc or 2) - 1

    def describe(self) -> str:
        """One phrase for headers and plot titles."""
        first = ", sketch-first" if self.sketch_first else ""
        return f"{self.nproc} processes, window {self.window}{first}"

    def notes(self, steps: int) -> tuple[str, ...]:
        """Nothing to note."""
        return ()

    def check_outputs(self, strategies: tuple[str, ...], seeds: int, lrs: tuple[float, ...]) -> None:
        """Refuse files of this setting's own that a run would overwrite: it writes none (the runs'
        logs are checked by ``SimulateConfig``, in every setting)."""

    def check_rules(self, strategies: tuple[str, ...], steps: int) -> None:
        """Gradient rules only; sketch-first screens with naig's weights, so naig alone."""
        check(not self.sketch_first or set(strategies) == {"naig"}, "sketch_first", True,
              "screens gradients with naig's weights; use `strategies` naig")
        local = [n for n in strategies if n in LOCAL_METHODS]
        check(not local, "strategies", ",".join(local), "local-update methods run on the simulated clock "
              "only; drop them or use `arrivals` instead of `engine` distributed")
