"""The arrivals setting: staleness emerges from worker speeds on a simulated clock (docs/design.md §11).

Local updates are a block of this setting (``LocalUpdates``), not a setting of their own:
diloco, gasloc and their kin run on the same clock as the gradient rules listed beside them,
and compare with them side by side (docs/design.md §13). Every field of the block defaults to
"not given" (``None``): it is only accepted with a local-update method.

Example:
    >>> ArrivalsSetting(compute="exp:1,exp:2").workers
    2
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

from naig.arrivals import ArrivalModel
from naig.choices import ARRIVAL_MODES, GASLOC_FORMS, TOPOLOGIES
from naig.errors import UsageError
from naig.simulate.checks import MAX_STEPS, as_tuple, check, is_int, is_number
from naig.simulate.options import DEFAULT_LOCAL_STEPS, DOCS, option

__all__ = ["ArrivalsSetting", "LocalUpdates", "LOCAL_USERS", "DEFAULT_LOCAL_STEPS"]


@dataclass(frozen=True)
class LocalUpdates:
    """The local-update methods' options (docs/design.md §13); None: the method's default.

    Attributes:
        steps: inner steps H per round, one value or one per worker (None: 10).
        outer_lr: outer learning rate η (None: 0.7 for diloco and gasloc, the inner lr for
            gossip-adam).
        outer_momentum: diloco's Nesterov momentum, gasloc's γ, gossip-adam's Adam β1 (None: 0.9).
        topology: gasloc's graph of a round, one of ``TOPOLOGIES`` (None: ``one-peer``).
        gossip_step: gasloc's gossip step α of W = I − αΛ, in (0, 1/d] for the topology's largest
            degree d (None: 1/(d_max + 1) of each round's graph, Xiao and Boyd 2004).
        form: gasloc's momentum on the ``mixed`` iterates or the un-mixed proposals
            (``summarised``), one of ``GASLOC_FORMS`` (None: ``mixed``).
    """

    steps: tuple[int, ...] | None = option("arrivals.local.steps")
    outer_lr: float | None = option("arrivals.local.outer_lr")
    outer_momentum: float | None = option("arrivals.local.outer_momentum")
    topology: str | None = option("arrivals.local.topology")
    gossip_step: float | None = option("arrivals.local.gossip_step")
    form: str | None = option("arrivals.local.form")

    def __post_init__(self) -> None:
        if self.steps is not None:
            object.__setattr__(self, "steps", as_tuple(self.steps, "local_steps", "10, 10, 5, 2"))
        h = self.steps
        check(h is None or (len(h) > 0 and all(is_int(v) and 1 <= v <= MAX_STEPS for v in h)),
              "local_steps", h, "use one int >= 1, or one per worker, e.g. 10 or 10,10,5,2")
        lr = self.outer_lr
        check(lr is None or (is_number(lr) and math.isfinite(lr) and lr > 0), "outer_lr", lr,
              "use a finite value > 0, e.g. 0.7")
        m = self.outer_momentum
        check(m is None or (is_number(m) and math.isfinite(m) and 0 <= m < 1),
              "outer_momentum", m,
              "use a value in [0, 1), e.g. 0.9 (0: no momentum)")
        check(self.topology is None or self.topology in TOPOLOGIES, "topology", self.topology,
              f"use one of {', '.join(TOPOLOGIES)}")
        a = self.gossip_step
        top = self.topology or "one-peer"
        degree = {"one-peer": "d = 1, e.g. 0.5", "two-peer": "d = 2, e.g. 0.5", "ring": "d = 2, e.g. 0.5",
                  "complete": "d = K − 1, e.g. 0.25 for 5 workers"}.get(top, "e.g. 0.5")
        check(a is None or (is_number(a) and math.isfinite(a) and 0 < a <= 1), "gossip_step", a,
              f"use a value in (0, 1/d] for the largest degree d of a {top} graph ({degree})")
        check(self.form is None or self.form in GASLOC_FORMS, "gasloc_form", self.form,
              f"use one of {', '.join(GASLOC_FORMS)}")

    def given(self) -> dict[str, object]:
        """The options given (not None), by their option names."""
        return {_LOCAL_OPTION.get(k, k): v for k, v in vars(self).items() if v is not None}

    def max_degree(self, workers: int) -> int:
        """The largest degree any round's graph of ``topology`` can have with ``workers`` workers."""
        k, top = workers, self.topology or "one-peer"
        return {"one-peer": 1, "two-peer": 2, "complete": k - 1, "ring": 2}[top] if k > 2 else min(k - 1, 1)


_LOCAL_OPTION = {d.path[-1]: d.name for d in DOCS if d.section == "arrivals.local"}  # steps → local_steps
# the local-update options and the methods that use them (the others refuse them)
_OUTER = ("diloco", "diloco-naig", "diloco-naig-exact", "gasloc", "gossip-adam")
LOCAL_USERS = {"local_steps": (*_OUTER, "local-sgd"), "outer_lr": _OUTER, "outer_momentum": _OUTER,
               "topology": ("gasloc",), "gossip_step": ("gasloc",), "gasloc_form": ("gasloc",)}


@dataclass(frozen=True)
class ArrivalsSetting:
    """Gradient arrivals: staleness emerges from worker speeds (docs/design.md §11).

    Attributes:
        compute: compute-time spec(s) in seconds, one per worker (e.g. ``"exp:1,exp:2"``);
            K = the list length (a single spec: one worker).
        uplink, downlink: message latency spec(s) in seconds (None: none).
        mode: the protocol, ``blocking``, ``non-blocking`` or ``shared-memory``.
        window: B arrivals per update (1: ASGD; K: K-batch-async).
        bandwidth: link bytes/s, one or one per worker (empty: infinite).
        local: the local-update methods' options.
    """

    NAME: ClassVar[str] = "arrivals"
    ENGINE: ClassVar[str] = "simulated"
    asynchronous: ClassVar[bool] = True
    compute: str = option("arrivals.compute")
    uplink: str | None = option("arrivals.uplink")
    downlink: str | None = option("arrivals.downlink")
    mode: str = option("arrivals.mode")
    window: int = option("arrivals.window")
    bandwidth: tuple[float, ...] = option("arrivals.bandwidth")
    local: LocalUpdates = field(default_factory=LocalUpdates)

    def __post_init__(self) -> None:
        object.__setattr__(self, "bandwidth", as_tuple(self.bandwidth, "bandwidth", "1e6"))
        for name in ("compute", "uplink", "downlink"):
            value = getattr(self, name)
            check(value is None or isinstance(value, str), "arrivals" if name == "compute" else name, value,
                  "use a text spec, e.g. exp:1,exp:2")
        if isinstance(self.local, dict):
            object.__setattr__(self, "local", LocalUpdates(**self.local))
        check(isinstance(self.local, LocalUpdates), "local", self.local,
              "use a table [arrivals.local] of steps, outer_lr, outer_momentum, topology, gossip_step, form")
        check(self.mode in ARRIVAL_MODES, "mode", self.mode, f"use one of {', '.join(ARRIVAL_MODES)}")
        try:
            k = self.arrival_model().workers  # parses the specs
        except UsageError as exc:  # the model calls the compute times `compute`
            if exc.field not in ("compute", "workers", "uplink", "downlink", "bandwidth"):
                raise
            self._check_lengths()  # a list whose length differs from K (the `arrivals` list) is at fault
            if exc.field not in ("compute", "workers"):
                raise
            raise UsageError(exc.message, field="arrivals", value=self.compute) from None
        check(is_int(self.window) and 1 <= self.window <= k, "window", self.window,
              f"use an int in 1..{k} (1: ASGD, {k}: K-batch-async)")
        h = self.local.steps
        check(h is None or len(h) in (1, k), "local_steps", h,
              f"use one int >= 1, or one per worker ({k}), e.g. 10 or 10,10,5,2")
        check(self.local.topology != "two-peer" or k > 2, "topology", self.local.topology,
              f"needs at least 3 workers: with {k} a worker has at most one peer (a one-peer matching); use "
              "one-peer, or list more workers in `arrivals`")
        d, a = self.local.max_degree(k), self.local.gossip_step
        if a is not None and d > 0:
            check(a <= 1 / d, "gossip_step", a, f"a {self.local.topology or 'one-peer'} graph of {k} workers "
                  f"has degree up to {d}; use α in (0, {1 / d:.4g}] so that W = I − αΛ stays non-negative")

    def _check_lengths(self) -> None:
        """Name the per-worker list whose length is not K, the length of the ``arrivals`` list (> 1)."""
        from naig.arrivals.distributions import parse_distributions

        try:
            k = len(parse_distributions(self.compute, "compute", positive=True))
        except UsageError:
            return  # the arrivals list itself is wrong: the caller names `arrivals`
        if k < 2:
            return
        for name in ("uplink", "downlink", "bandwidth"):
            value = getattr(self, name)
            n = len(value) if name == "bandwidth" else len(parse_distributions(value, name)) if value else 0
            if n > 1 and n != k:
                shown = tuple(f"{v:g}" for v in value) if name == "bandwidth" else value
                raise UsageError(f"lists {n} values but `arrivals` lists {k} (one per worker); give one "
                                 f"value, or {k}", field=name, value=shown)

    @cached_property
    def workers(self) -> int:
        """K, the length of the ``compute`` list."""
        return self.arrival_model().workers

    def arrival_model(self, bytes_up: float = 0.0, bytes_down: float = 0.0) -> ArrivalModel:
        """The arrival process (message sizes in bytes for transfer times)."""
        lists = (self.compute, self.uplink or "", self.downlink or "")
        single = "," not in "".join(lists) and len(self.bandwidth) <= 1  # K = the list length
        return ArrivalModel.from_specs(self.compute, workers=1 if single else None, uplink=self.uplink,
                                       downlink=self.downlink, mode=self.mode, bytes_up=bytes_up,
                                       bytes_down=bytes_down, bandwidth=self.bandwidth)

    def describe(self) -> str:
        """One phrase for headers and plot titles."""
        return f"arrivals {self.compute} ({self.mode}, window {self.window})"

    def notes(self, steps: int) -> tuple[str, ...]:
        """Nothing to note."""
        return ()

    def check_outputs(self, strategies: tuple[str, ...], seeds: int, lrs: tuple[float, ...]) -> None:
        """Refuse files of this setting's own that a run would overwrite: it writes none (the runs'
        logs are checked by ``SimulateConfig``, in every setting)."""

    def check_rules(self, strategies: tuple[str, ...], steps: int) -> None:
        """The local block's options are used by a listed local-update method."""
        for name, value in self.local.given().items():
            users = LOCAL_USERS[name]
            what = f"local-update strategies only ({', '.join(users)}); list one" if len(users) > 1 else \
                f"{users[0]} only; list it"
            check(any(n in users for n in strategies), name, value, f"applies to {what} in `strategies`")

    def inner_steps(self) -> tuple[int, ...]:
        """H_i of every worker (K values): ``local.steps`` spread to K, or the default 10 each."""
        h = self.local.steps or (DEFAULT_LOCAL_STEPS,)
        return h * self.workers if len(h) == 1 else h
