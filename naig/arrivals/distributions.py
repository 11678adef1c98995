"""Time distributions of the arrival model, each given by its mean (docs/design.md §10).

A distribution is written as ``KIND:MEAN[:PARAM]`` in seconds:

=================  ===========================================  ================
spec               law                                          variance
=================  ===========================================  ================
``const:M``        the value M                                  0
``exp:M``          Exp with mean M                              M²
``shifted-exp``    SHIFT + Exp with mean M − SHIFT (M:SHIFT)    (M − SHIFT)²
``gamma:M:K``      Gamma with shape K and scale M/K             M²/K
``lognormal:M:S``  exp(μ + S·Z), μ = ln M − S²/2, Z ~ N(0, 1)   M²(e^{S²} − 1)
=================  ===========================================  ================

**Ranges.** A non-zero mean (and a shift) lies in [1e-100, 1e100] seconds, and the
squared coefficient of variation Var/mean² = e^{σ²} − 1 of ``lognormal`` is at most 1e30
(σ ≤ 8.3), and a ``gamma`` shape is at least 0.01: beyond, rates, variances and sums of
times leave float64 (or most draws underflow to 0), so such laws are refused with a
``UsageError`` naming the option rather than simulated into overflow.

Randomness is explicit: every worker draws each component (downlink, compute,
per-sample compute, uplink) from its own numpy ``Generator``, seeded from
``SeedSequence(seed, spawn_key=(family, worker, component))``. numpy's generators fill
arrays one value after the other, so a stream gives the same values whether it is
drawn one at a time or in blocks; the vectorised engine and the online clock rely on
this (a test checks it for every kind).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from naig.errors import UsageError, a_type

__all__ = [
    "KINDS",
    "Distribution",
    "parse_distribution",
    "parse_distributions",
    "worker_stream",
    "DOWNLINK",
    "COMPUTE",
    "PER_SAMPLE",
    "UPLINK",
    "MEAN_RANGE",
    "MAX_CV2",
    "MIN_SHAPE",
]

KINDS: dict[str, int] = {"const": 0, "exp": 0, "shifted-exp": 1, "gamma": 1, "lognormal": 1}
"""Each kind and the number of parameters it takes after the mean."""

DOWNLINK, COMPUTE, PER_SAMPLE, UPLINK = 0, 1, 2, 3
"""Component indices of a worker's random streams."""

MEAN_RANGE = (1e-100, 1e100)
"""Smallest and largest non-zero mean (and shift), seconds."""
MAX_CV2 = 1e30
"""Largest squared coefficient of variation Var/mean² of a ``lognormal`` law."""
MIN_SHAPE = 0.01
"""Smallest ``gamma`` shape (below it most draws underflow to 0)."""


@dataclass(frozen=True)
class Distribution:
    """A non-negative time distribution given by its mean, in seconds.

    Args:
        kind: one of ``const``, ``exp``, ``shifted-exp``, ``gamma``, ``lognormal``.
        mean: E[X] in seconds (> 0, or 0 for ``const``).
        param: SHIFT (``shifted-exp``, in [0, mean)), shape (``gamma``, > 0) or σ
            (``lognormal``, > 0); 0 for ``const`` and ``exp``.

    Example:
        >>> d = parse_distribution("gamma:2:4", "compute")
        >>> d.mean, d.variance, d.spec
        (2.0, 1.0, 'gamma:2:4')
    """

    kind: str
    mean: float
    param: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UsageError(f"unknown distribution; use one of {', '.join(KINDS)}", field="kind",
                             value=self.kind)
        spec = f"{self.kind}:{self.mean}:{self.param}"
        for v in (self.mean, self.param):
            if not (isinstance(v, int | float) and math.isfinite(v)):
                raise UsageError("numbers must be finite", field="distribution", value=spec)
        _check(self.kind, self.mean, self.param, "distribution", spec, positive=False)

    @property
    def variance(self) -> float:
        """Var[X] in s², from the table of the module docstring (``inf`` past float64)."""
        m, p = self.mean, self.param
        if self.kind == "lognormal":
            return m * m * math.expm1(p * p) if p * p < 700 else math.inf
        return {"const": 0.0, "exp": m * m, "shifted-exp": (m - p) * (m - p),
                "gamma": m * m / p if p else 0.0}[self.kind]

    @property
    def is_exponential(self) -> bool:
        """True for ``exp`` (and ``shifted-exp`` with shift 0, and ``gamma`` with shape 1)."""
        return (self.kind == "exp" or (self.kind == "shifted-exp" and self.param == 0)
                or (self.kind == "gamma" and self.param == 1))

    @property
    def spec(self) -> str:
        """The distribution written back as ``KIND:MEAN[:PARAM]``."""
        text = f"{self.kind}:{self.mean:g}"
        return text + (f":{self.param:g}" if KINDS[self.kind] else "")

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """Draw ``size`` values, float64 seconds, shape (size,), from ``rng``.

        Example:
            >>> d = Distribution("exp", 2.0)
            >>> x = d.sample(np.random.default_rng(0), 100_000)
            >>> x.shape, bool(abs(x.mean() - 2.0) < 0.05)
            ((100000,), True)
        """
        m, p = self.mean, self.param
        if self.kind == "const":
            return np.full(size, m)
        if self.kind == "exp":
            return rng.exponential(m, size)
        if self.kind == "shifted-exp":
            return p + rng.exponential(m - p, size)
        if self.kind == "gamma":
            return rng.gamma(p, m / p, size)
        return rng.lognormal(math.log(m) - p * p / 2, p, size)

    def frozen(self) -> object | None:
        """The law as a frozen ``scipy.stats`` distribution (``None`` for ``const``)."""
        from scipy import stats

        m, p = self.mean, self.param
        if self.kind == "const":
            return None
        if self.kind in ("exp", "shifted-exp"):
            return stats.expon(loc=p, scale=m - p)
        if self.kind == "gamma":
            return stats.gamma(p, scale=m / p)
        return stats.lognorm(p, scale=math.exp(math.log(m) - p * p / 2))


def _number(text: str, field: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{text!r} is not a number; write e.g. exp:1.5 or gamma:2:4",
                         field=field, value=spec) from None
    if not math.isfinite(value):
        raise UsageError("numbers must be finite, e.g. exp:1.5", field=field, value=spec)
    return value


def _check(kind: str, mean: float, param: float, field: str, spec: str, positive: bool) -> None:
    if mean < 0 or (mean == 0 and (positive or kind != "const")):
        need = "> 0" if positive else "> 0 (const:0 means no delay)"
        raise UsageError(f"the mean must be {need}", field=field, value=spec)
    if kind == "shifted-exp" and not 0 <= param < mean:
        raise UsageError("shifted-exp:MEAN:SHIFT needs 0 <= SHIFT < MEAN", field=field, value=spec)
    if kind in ("gamma", "lognormal") and param <= 0:
        what = "shape" if kind == "gamma" else "sigma"
        raise UsageError(f"{kind}:MEAN:{what.upper()} needs {what} > 0", field=field, value=spec)


def _check_range(kind: str, mean: float, param: float, field: str, spec: str) -> None:
    """Means/shifts in MEAN_RANGE (or 0), Var/mean² at most MAX_CV2 (see the module docstring)."""
    lo, hi = MEAN_RANGE
    for name, v in (("mean", mean), ("shift", param if kind == "shifted-exp" else 0.0)):
        if v != 0 and not lo <= v <= hi:
            raise UsageError(f"the {name} must lie in [{lo:g}, {hi:g}] seconds (or be 0 where allowed); "
                             "rescale the times", field=field, value=spec)
    if kind == "gamma" and param < MIN_SHAPE:
        raise UsageError(f"gamma shape {param:g} is below {MIN_SHAPE:g} (most draws would underflow to 0); "
                         f"use a shape >= {MIN_SHAPE:g}", field=field, value=spec)
    if kind == "lognormal" and param * param > math.log1p(MAX_CV2):
        raise UsageError(f"lognormal sigma {param:g} gives Var/mean^2 = e^(sigma^2) - 1 > {MAX_CV2:g}; "
                         f"use sigma <= {math.sqrt(math.log1p(MAX_CV2)):.2f}", field=field, value=spec)


def parse_distribution(spec: str, field: str, *, positive: bool = False) -> Distribution:
    """Parse one ``KIND:MEAN[:PARAM]`` string.

    Args:
        spec: e.g. ``exp:1``, ``shifted-exp:1:0.2``, ``gamma:1:4``, ``lognormal:1:0.5``.
        field: the option it came from (``compute``, ``uplink``, …), named in errors.
        positive: require mean > 0 (compute times); otherwise ``const:0`` is allowed.

    Returns:
        The ``Distribution``.

    Raises:
        UsageError: unknown kind, wrong number of parameters, or a value out of range
            (also the ranges of the module docstring: ``MEAN_RANGE``, ``MAX_CV2``, ``MIN_SHAPE``).

    Example:
        >>> parse_distribution("shifted-exp:1:0.25", "uplink")
        Distribution(kind='shifted-exp', mean=1.0, param=0.25)
    """
    parts = [p.strip() for p in spec.strip().split(":")]
    kind = parts[0].lower()
    if kind not in KINDS:
        raise UsageError(f"unknown distribution {kind!r}; use one of {', '.join(KINDS)}, e.g. exp:1",
                         field=field, value=spec)
    if len(parts) != 2 + KINDS[kind]:
        extra = {"shifted-exp": ":SHIFT", "gamma": ":SHAPE", "lognormal": ":SIGMA"}
        form = f"{kind}:MEAN" + extra.get(kind, "")
        raise UsageError(f"write {form}", field=field, value=spec)
    mean = _number(parts[1], field, spec)
    param = _number(parts[2], field, spec) if KINDS[kind] else 0.0
    _check(kind, mean, param, field, spec, positive)
    _check_range(kind, mean, param, field, spec)
    return Distribution(kind, mean, param)


def parse_distributions(spec: str, field: str, *, positive: bool = False) -> tuple[Distribution, ...]:
    """Parse one spec for every worker or a comma list with one per worker.

    Raises:
        UsageError: a spec that is not text, an empty item or a malformed distribution, naming ``field``.

    Example:
        >>> [d.mean for d in parse_distributions("exp:0.5, exp:1,const:2", "compute")]
        [0.5, 1.0, 2.0]
    """
    if not isinstance(spec, str):
        hint = "; join a list with commas" if isinstance(spec, list | tuple) else ""
        raise UsageError(f"must be a spec text, e.g. 'exp:1' or 'exp:1,exp:2' (got "
                         f"{a_type(spec)}{hint})", field=field, value=spec)
    items = [s for s in spec.split(",")]
    if not spec.strip() or any(not s.strip() for s in items):
        raise UsageError("give one distribution, or one per worker separated by commas, e.g. exp:1,exp:2",
                         field=field, value=spec)
    return tuple(parse_distribution(s, field, positive=positive) for s in items)


def worker_stream(seed: int, worker: int, component: int, family: int = 0) -> np.random.Generator:
    """The random stream of one worker's component (``DOWNLINK``, ``COMPUTE``, …).

    Streams depend on (seed, family, worker, component) only, so adding workers leaves
    the draws of the others unchanged. Family 0 drives the asynchronous arrivals,
    family 1 the synchronous rounds.

    Example:
        >>> a = worker_stream(0, 3, COMPUTE).random(2)
        >>> bool((a == worker_stream(0, 3, COMPUTE).random(2)).all())
        True
    """
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(family, worker,
                                                                                        component))))
