"""The settings of a simulation: exactly one per experiment, each validating only its own fields.

=====================  =====================================================================
``LagsSetting``        fixed lags τ_k (``naig.simulate.engines.lags``)
``ArrivalsSetting``    gradient arrivals on a simulated clock (``engines.arrivals``); its
                       ``local`` block holds the local-update options (``engines.local``)
``DistributedSetting`` real processes: a parameter server and K workers (``engines.distributed``)
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

import math
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import ClassVar

from naig.arrivals import ArrivalModel
from naig.choices import ARRIVAL_MODES, GASLOC_FORMS, LOCAL_METHODS, MAX_TIMEOUT, TOPOLOGIES
from naig.errors import UsageError
from naig.simulate.options import DEFAULT_LAGS, DEFAULT_LOCAL_STEPS, DOCS, option

__all__ = ["LagsSetting", "ArrivalsSetting", "LocalUpdates", "DistributedSetting", "Setting", "SETTINGS",
           "DEFAULT_LAGS", "MAX_LAG", "MAX_STEPS", "DEFAULT_LOCAL_STEPS", "MAX_TIMEOUT", "LOCAL_USERS",
           "check", "check_writable_dir", "as_tuple", "is_int", "is_number"]

MAX_LAG = 2**31 - 1  # any lag >= steps already means "always θ_0"; beyond this: a typo
MAX_STEPS = 10**9  # server steps per run, and inner steps per phase


def check_writable_dir(path: str, name: str) -> None:
    """The folder ``path`` is, or would be created in, a writable directory (else ``UsageError``)."""
    p = Path(path)
    check(not p.exists() or p.is_dir(), name, path,
          "is a file, so it is not a directory; pass a directory (it is created if missing)")
    existing = next(q for q in (p, *p.parents) if q.exists() or q == q.parent)
    check(existing.is_dir(), name, path, f"{existing} is not a directory; pass a directory (it is created if "
          "missing)")
    check(os.access(existing, os.W_OK | os.X_OK), name, path,
          f"{existing} is not writable; pass a directory you can write to")


def as_tuple(value: object, name: str, example: str) -> tuple:
    """A list option as a tuple: a sequence as is, one number as a one-item tuple.

    Raises:
        UsageError: naming ``name`` for text or anything else that is not a list of values.

    Example:
        >>> as_tuple([0, 1], "lags", "0, 10"), as_tuple(5, "local_steps", "10")
        ((0, 1), (5,))
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise UsageError(f"use a list of values, e.g. [{example}]", field=name, value=value)
    return tuple(value)


def is_int(value: object) -> bool:
    """Whether ``value`` is an int and not a bool (a config's ``true`` is not 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """Whether ``value`` is an int or a float and not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def check(ok: bool, name: str, value: object, message: str) -> None:
    """Raise ``UsageError(message, field=name, value=value)`` unless ``ok``."""
    if not ok:
        raise UsageError(message, field=name, value=value)


@dataclass(frozen=True)
class LagsSetting:
    """Fixed lags: worker k's gradient is always τ_k server steps old (docs/design.md §8).

    Attributes:
        lags: τ_k of each worker, in server steps; K = their number.
        warmup_theta0: the old protocol: every worker from step 0, early gradients at θ_0.
        save_grads: directory for gradient files (None: save nothing).
        save_at: server steps t at which to save gradients (needs ``save_grads``).
    """

    NAME: ClassVar[str] = "lags"
    ENGINE: ClassVar[str] = "simulated"
    asynchronous: ClassVar[bool] = False
    lags: tuple[int, ...] = option("lags.lags")
    warmup_theta0: bool = option("lags.warmup_theta0")
    save_grads: str | None = option("lags.save_grads")
    save_at: tuple[int, ...] = option("lags.save_at")

    def __post_init__(self) -> None:
        object.__setattr__(self, "lags", as_tuple(self.lags, "lags", "0, 10, 20, 35"))
        object.__setattr__(self, "save_at", as_tuple(self.save_at, "save_at", "50, 100"))
        check(isinstance(self.warmup_theta0, bool), "warmup_theta0", self.warmup_theta0, "use true or false")
        check(len(self.lags) > 0 and all(is_int(t) and t >= 0 for t in self.lags), "lags", self.lags,
              "use non-negative ints, one per worker, e.g. 0,10,20,35")
        check(all(t <= MAX_LAG for t in self.lags), "lags", self.lags,
              f"a lag must be at most {MAX_LAG:,}; any lag >= `steps` already means the worker never joins "
              "(with `warmup_theta0`: every gradient it sends is taken at θ_0)")
        self._check_saving()

    @property
    def workers(self) -> int:
        """K, the number of lags."""
        return len(self.lags)

    @property
    def window(self) -> int:
        """Fixed lags combine the K joined workers of a step: no window (1)."""
        return 1

    def describe(self) -> str:
        """One phrase for headers and plot titles."""
        return f"lags {','.join(map(str, self.lags))}" + (" (warm-up at θ_0)" if self.warmup_theta0 else "")

    def check_rules(self, strategies: tuple[str, ...], steps: int) -> None:
        """No local-update method (they run on the arrivals clock); ``save_at`` in 0..steps−1; at least
        one worker joins within ``steps`` (else no update is ever made)."""
        check(self.warmup_theta0 or min(self.lags) < steps, "lags", self.lags,
              f"no worker joins within `steps` ({steps}): a lag-τ worker sends its first gradient at step τ; "
              "use smaller lags, more `steps`, or `warmup_theta0`")
        local = [n for n in strategies if n in LOCAL_METHODS]
        check(not local, "strategies", ",".join(local), "runs on the simulated clock and needs `arrivals` "
              "(compute seconds per inner step, e.g. exp:1,exp:1,exp:2,exp:4)")
        check(all(0 <= s < steps for s in self.save_at), "save_at", self.save_at,
              f"steps must lie in 0..{steps - 1} (`steps` is {steps})")

    def _check_saving(self) -> None:
        if self.save_grads is None:
            check(not self.save_at, "save_at", self.save_at,
                  "needs `save_grads` (the directory to write the gradient files to)")
            return
        check(self.save_grads.strip() != "", "save_grads", self.save_grads,
              "give a directory to write gradient files to, e.g. runs/grads")
        check(bool(self.save_at), "save_grads", self.save_grads,
              "needs `save_at` (the server steps to save at, e.g. 50)")
        check_writable_dir(self.save_grads, "save_grads")

    def notes(self, steps: int) -> tuple[str, ...]:
        """One-line notes: a worker whose lag is at least ``steps`` never joins."""
        late = [w for w, t in enumerate(self.lags) if t >= steps and not self.warmup_theta0]
        if not late:
            return ()
        return (f"worker(s) {','.join(map(str, late))} never join: their `lags` reach `steps` ({steps}); "
                "a lag-τ "
                "worker sends its first gradient at step τ (`warmup_theta0` starts them at θ_0)",)


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


@dataclass(frozen=True)
class DistributedSetting:
    """Real processes on ``torch.distributed`` (docs/design.md §14).

    Attributes:
        nproc: processes, the server plus K = nproc − 1 workers.
        window: B arrivals per update (1: ASGD; K: K-batch-async).
        slowdown: compute-time factor ≥ 1 per worker (empty: full speed).
        sketch_first: workers push 14 floats; the server fetches a gradient when w ≥ 0.01.
        timeout: seconds any one message may take (at most 30).
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
              and 0 < self.timeout <= MAX_TIMEOUT, "timeout", self.timeout, "use seconds in (0, 30]")

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

    def check_rules(self, strategies: tuple[str, ...], steps: int) -> None:
        """Gradient rules only; sketch-first screens with naig's weights, so naig alone."""
        check(not self.sketch_first or set(strategies) == {"naig"}, "sketch_first", True,
              "screens gradients with naig's weights; use `strategies` naig")
        local = [n for n in strategies if n in LOCAL_METHODS]
        check(not local, "strategies", ",".join(local), "local-update methods run on the simulated clock "
              "only; drop them or use `arrivals` instead of `engine` distributed")


Setting = LagsSetting | ArrivalsSetting | DistributedSetting
SETTINGS: dict[str, type[Setting]] = {s.NAME: s for s in (LagsSetting, ArrivalsSetting, DistributedSetting)}
