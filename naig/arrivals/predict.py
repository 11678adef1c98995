"""Predicted staleness, rates, bandwidth and round time of the arrival model (docs/design.md §10).

Each value is ``None`` where its law does not apply (the reasons are in the design
document):

- rate λ = Σ_i 1/E[C_i] (renewal superposition); non-blocking: Σ_i 1/E[X_i];
- blocking (and shared memory), any distributions: E[τ] = (K − 1)/B, exact (B = 1:
  K − 1); with B = 1 also E[τ_i] = E[C_i]·Σ_{j≠i} 1/E[C_j] and the age E[A] = K/λ;
- blocking, B = 1, every cycle exponential (exponential compute, no delays): τ_i is
  geometric with success p_i = λ_i/λ, so P(τ = k) = Σ_i (λ_i/λ)·p_i(1 − p_i)^k;
  i.i.d. workers: (1/K)((K − 1)/K)^k, Var τ = K(K − 1), P(τ = 0) = 1/K;
- synchronous round time E[max_i C_i] = ∫_0^∞ (1 − Π_i F_i(t)) dt where each C_i has one
  random part plus constants (so its CDF F_i is known);
- bandwidth at the master: λ × bytes in each direction.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from naig.arrivals.distributions import Distribution
from naig.arrivals.model import ArrivalModel
from naig.errors import UsageError, a_type

__all__ = ["SKETCH_BYTES", "Prediction", "predict", "ring_allreduce_bytes", "expected_max", "NO_QUADRATURE"]

_PMF_BLOCK = 1 << 20  # elements of one (k, distinct p) block of the pmf
NO_QUADRATURE = ("E[max C] by quadrature did not converge (a heavy-tailed law); the synchronous "
                 "round time is measured only, not predicted")
"""The warning (``RuntimeWarning``) given when the round-time quadrature fails."""

SKETCH_BYTES = 56
"""Bytes of one sketch message: 14 float32."""


def ring_allreduce_bytes(params: int, workers: int) -> float:
    """Bytes each worker sends in a ring all-reduce of ``params`` float32: 2(K − 1)/K · 4n.

    Example:
        >>> ring_allreduce_bytes(1000, 4)
        6000.0
    """
    return 2 * (workers - 1) / workers * 4 * params


@dataclass(frozen=True)
class Prediction:
    """Predicted values; ``None`` where the law does not apply.

    Attributes:
        rate: λ, gradient arrivals per second at the master.
        mean: E[τ]; ``mean_plus_one`` the τ + 1 convention.
        per_worker: (K,) E[τ_i].
        p_zero: P(τ = 0).
        variance: Var τ.
        age: E[A], seconds from the creation of the version used to the application.
        round_time: E[max_i C_i], seconds.
        geometric: (K,) success probabilities p_i of the per-worker geometric laws.
    """

    rate: float
    mean: float | None = None
    per_worker: tuple[float, ...] | None = None
    p_zero: float | None = None
    variance: float | None = None
    age: float | None = None
    round_time: float | None = None
    geometric: tuple[float, ...] | None = None

    @property
    def mean_plus_one(self) -> float | None:
        """E[τ] + 1, the "number of versions old" convention."""
        return None if self.mean is None else self.mean + 1

    def pmf(self, k: np.ndarray) -> np.ndarray | None:
        """P(τ = k) for an int array k (the geometric mixture), or ``None`` where it does not apply.

        Example:
            >>> p = predict(ArrivalModel.from_specs("exp:1", workers=4))
            >>> p.pmf(np.arange(3)).round(4).tolist()
            [0.25, 0.1875, 0.1406]
        """
        if self.geometric is None:
            return None
        p = np.asarray(self.geometric)
        q, count = np.unique(p, return_counts=True)  # i.i.d. workers share one law
        weight = count * q / p.sum() * q  # Σ over the workers of each distinct p_i
        k = np.asarray(k)
        flat, out = k.reshape(-1), np.empty(k.size)
        step = max(1, _PMF_BLOCK // len(q))  # memory bounded by the block, whatever K and k
        for a in range(0, len(flat), step):
            out[a:a + step] = (weight * (1 - q) ** flat[a:a + step, None]).sum(axis=-1)
        return out.reshape(k.shape)


def _all_exponential(model: ArrivalModel) -> bool:
    """Every cycle C_i is exponential: exponential compute, no per-sample part, no delays."""
    no_delay = all(d.kind == "const" and d.mean == 0 for d in model.uplink + model.downlink)
    no_transfer = not (model.transfer_up().any() or model.transfer_down().any())
    return (not model.per_sample and no_delay and no_transfer
            and all(d.is_exponential for d in model.compute))


def _geometric(model: ArrivalModel) -> dict:
    rates = 1.0 / model.mean_cycle()
    p = rates / rates.sum()
    # worker i sends a share w_i = p_i of the updates, so w_i·E[τ_i^k] loses one p_i (and p_i²
    # cannot underflow for rates 1e200 apart)
    second = float(((1 - p) * (2 - p) / p).sum())
    mean = float((1 - p).sum())
    return {"geometric": tuple(p.tolist()), "p_zero": float((p * p).sum()), "variance": second - mean**2}


def predict(model: ArrivalModel, *, window: int = 1) -> Prediction:
    """The predictions of the design document for ``model`` with windows of B = ``window`` arrivals.

    Raises:
        UsageError: ``model`` is not an ``ArrivalModel``, or ``window`` is not an int in 1..K.

    Example:
        >>> p = predict(ArrivalModel.from_specs("exp:0.5,exp:1,exp:2,exp:4"))
        >>> round(p.rate, 4), p.mean, [round(x, 3) for x in p.per_worker]
        (3.75, 3.0, [0.875, 2.75, 6.5, 14.0])
    """
    if not isinstance(model, ArrivalModel):
        raise UsageError(f"must be an ArrivalModel (e.g. ArrivalModel.from_specs('exp:1,exp:2')), got "
                         f"{a_type(model)}", field="model")
    k = model.workers
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= k:
        raise UsageError(f"must be an int in 1..{k} (the arrivals a window holds, at most K = {k})",
                         field="window", value=window)
    cycle = model.mean_compute() if model.mode == "non-blocking" else model.mean_cycle()
    rate = float((1.0 / cycle).sum())
    out: dict = {"rate": rate, "round_time": expected_max(model)}
    if model.mode == "non-blocking":
        return Prediction(**out)
    out["mean"] = (k - 1) / window
    if window == 1:
        inv = 1.0 / cycle
        out["per_worker"] = tuple((cycle * (inv.sum() - inv)).tolist())
        out["age"] = k / rate
        if _all_exponential(model):
            out |= _geometric(model)
    return Prediction(**out)


def _parts(model: ArrivalModel, i: int) -> list[tuple[Distribution, float]]:
    """Worker i's cycle C_i as (distribution, scale) parts, plus transfers as constants."""
    parts = [(d[i], 1.0) for d in (model.downlink, model.uplink) if d]
    parts.append((model.compute[i], 1.0))
    if model.per_sample:
        parts.append((model.per_sample[i], float(model.batch_size)))
    extra = float(model.transfer_up()[i] + model.transfer_down()[i])
    return parts + [(Distribution("const", extra), 1.0)]


def _split(model: ArrivalModel, i: int) -> tuple[float, Distribution | None, float] | None:
    """C_i = shift + scale·Y with Y the one random part (``None`` if C_i is constant), or ``None``
    when C_i has two random parts."""
    parts = _parts(model, i)
    random = [(d, s) for d, s in parts if d.kind != "const"]
    if len(random) > 1:
        return None
    shift = sum(d.mean * s for d, s in parts if d.kind == "const")
    return (shift, random[0][0], random[0][1]) if random else (shift, None, 1.0)


def expected_max(model: ArrivalModel) -> float | None:
    """E[max_i C_i] by quadrature of ∫_0^∞ (1 − Π_i F_i(t)) dt, or ``None`` when some C_i
    is a sum of two random parts (no closed CDF; the report then shows the simulated value)
    or when the quadrature does not converge (then a ``RuntimeWarning``, ``NO_QUADRATURE``).

    Example:
        >>> m = ArrivalModel.from_specs("exp:1", workers=3)
        >>> round(expected_max(m), 9) == round(1 + 1/2 + 1/3, 9)
        True
    """
    laws = [_split(model, i) for i in range(model.workers)]
    if any(law is None for law in laws):
        return None
    const = max((law[0] for law in laws if law[1] is None), default=0.0)
    groups: dict[tuple, int] = {}  # identical workers share one CDF: Π_i F_i = Π_g F_g^count
    for law in laws:
        if law[1] is not None:
            groups[law] = groups.get(law, 0) + 1
    if not groups:
        return const
    return _integrate_max(const, [(s, d.frozen(), c, n) for (s, d, c), n in groups.items()])


def _integrate_max(const: float, rand: list[tuple]) -> float | None:
    """lo + ∫_lo^top (1 − Π_g F_g((t − s_g)/c_g)^{n_g}) dt, where max C >= lo surely."""
    from scipy import integrate

    def survival(t: float) -> float:
        return 1.0 - math.prod(float(f.cdf((t - s) / c)) ** n for s, f, c, n in rand)

    low = [s + c * float(f.support()[0]) for s, f, c, _ in rand]  # C_i >= low_i
    top = max(s + c * float(f.ppf(1 - 1e-15)) for s, f, c, _ in rand)
    lo = max(const, min(low))
    points = sorted({x for x in low if lo < x < top})
    with warnings.catch_warnings():
        warnings.simplefilter("error", integrate.IntegrationWarning)
        try:
            tail, _ = integrate.quad(survival, lo, top, points=points or None, limit=200, epsabs=1e-12,
                                     epsrel=1e-10)
        except integrate.IntegrationWarning:
            tail = math.nan
    if not math.isfinite(tail):
        warnings.warn(NO_QUADRATURE, RuntimeWarning, stacklevel=3)
        return None
    return lo + tail
