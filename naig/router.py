"""``naig.Router``: NAIG routing for your own training loop (docs/design.md §5–§7).

Given K worker gradients g_k (state dicts or flat tensors) and a reference g_R
(by default the gradient of the first worker with the smallest staleness):

    d_k = S g_k − S g_R ∈ R^14      S: the signed-hash sketch (seeded, linear)
    E_k = d_kᵀ Ψ_ℓ d_k               Ψ_ℓ: the rank-4 Fano–Fisher metric of line ℓ
    π_k = exp(−β E_k) / Σ_j exp(−β E_j)    β = "auto": 1 / median of positive E_k
    ĝ   = Σ_k π_k g_k                hand ĝ to your unchanged optimizer

Staleness changes every step in a real asynchronous system, so every call may pass
the current ``staleness`` (τ_k per gradient); the ``lags`` given at construction are
the default.

A ``None`` entry of a state dict (an unused parameter's ``p.grad``) is a zero gradient:
it adds nothing to the sketch (S is linear) and counts as zeros in ``combine``; a name
that is ``None`` in every gradient stays ``None`` in ĝ, as ``p.grad`` would. A gradient
of weight π_k = 0 (a NaN worker) is left out of ĝ, so it cannot poison it through 0·NaN.

Example:
    >>> import torch
    >>> router = Router(lags=(0, 10), seed=0)
    >>> grads = [{"w": torch.ones(64)}, {"w": torch.linspace(-3, 3, 64)}]
    >>> router.energies(grads).round(2).tolist()  # worker 0 is the reference
    [0.0, 18.28]
    >>> router.weights(grads).round(4).tolist()  # β = auto = 1/18.28
    [0.7311, 0.2689]
    >>> router.weights(grads, staleness=(5, 0)).round(4).tolist()  # worker 1 is fresher now
    [0.2689, 0.7311]
    >>> router.combine(grads, router.weights(grads))["w"].shape
    torch.Size([64])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from naig.energy import energy
from naig.errors import UsageError, a_type
from naig.gibbs import combine as mge_combine
from naig.gibbs import gibbs_weights, parse_beta, reference_index
from naig.metric import fano_fisher_metric, parse_line
from naig.sketch.core import SKETCH_DIM, check_seed
from naig.sketch.torch_sketch import TorchSketch

__all__ = ["Router", "Gradient"]

Gradient = Mapping[str, Tensor | None] | Tensor
"""A worker gradient: a state dict {name: tensor or None} or one flat tensor (named ``"flat"``)."""

_FLAT = "flat"


class Router:
    """Gibbs routing of worker gradients by Fano–Fisher energy of their sketched drift.

    Args:
        lags: default staleness τ_k per worker (the reference is the first worker with
            the smallest); ``None`` means every call passes ``staleness`` or ``reference``.
        beta: inverse temperature, a float ≥ 0 (0 = Hogwild! uniform) or ``"auto"``.
        line: oriented Fano line ℓ of the metric Ψ_ℓ, e.g. ``(1, 2, 4)``.
        seed: sketch seed, an int in 0..2^64−1; the same seed sketches every step consistently.

    Raises:
        UsageError: for an empty/negative/non-integer ``lags``, a bad ``beta``, a non-Fano
            ``line`` or a seed outside 0..2^64−1 (``UsageError.field`` names the argument).
    """

    def __init__(self, lags: Sequence[int] | None = (0, 10, 20, 35), beta: float | str = "auto",
                 line: Sequence[int] = (1, 2, 4), seed: int = 0) -> None:
        self.lags = None if lags is None else _check_staleness(lags, "lags")
        self.beta = parse_beta(beta)
        self.line = parse_line(line)
        self.seed = check_seed(seed)
        self._psi = torch.from_numpy(fano_fisher_metric(self.line))  # (14, 14) float64
        self._hashes: dict[tuple[str, int, str], TorchSketch] = {}

    def sketch(self, grad: Gradient) -> Tensor:
        """S g: (14,) float64 sketch of one gradient (hash arrays cached per tensor).

        Args:
            grad: a state dict {name: tensor or None} or a flat tensor (sketched as tensor
                ``"flat"``); a ``None`` entry is a zero gradient and adds nothing.

        Raises:
            UsageError: if ``grad`` is neither a tensor nor a mapping of tensors (field ``grads``).
        """
        _check_gradient(grad, "grads")
        items = grad.items() if isinstance(grad, Mapping) else [(_FLAT, grad)]
        out = torch.zeros(SKETCH_DIM, dtype=torch.float64)
        for name, x in items:
            if x is None:
                continue
            flat = x.detach().reshape(-1)
            out += self._hash(name, flat.numel(), flat.device)(flat).cpu()
        return out

    def _hash(self, name: str, numel: int, device: torch.device) -> TorchSketch:
        key = (name, numel, str(device))
        if key not in self._hashes:
            self._hashes[key] = TorchSketch.build([(name, numel)], self.seed, device)
        return self._hashes[key]

    def energies(self, grads: Sequence[Gradient], reference: Gradient | None = None,
                 staleness: Sequence[int] | None = None) -> np.ndarray:
        """E_k = d_kᵀ Ψ d_k with d_k = S g_k − S g_R.

        Args:
            grads: K gradients (state dicts with the same names and shapes, or flat tensors).
            reference: g_R; default: the gradient of the first worker with the smallest
                ``staleness`` (or, without it, the smallest construction ``lags``).
            staleness: τ_k of each gradient at this call, K non-negative ints.

        Returns:
            (K,) float64 numpy array.

        Raises:
            UsageError: if K differs from the length of ``staleness``/``lags`` when they
                choose the reference, if no reference can be chosen, if the state dicts do
                not share names and shapes, or if ``reference`` has other tensor names or
                shapes than the gradients (field ``reference``, the tensors named).
        """
        _check_same_layout(grads)
        if reference is not None:
            _check_reference(grads[0], reference)
        ref = self.sketch(self._reference(grads, reference, staleness))
        d = torch.stack([self.sketch(g) for g in grads]) - ref  # (K, 14)
        return energy(d, self._psi).numpy()

    def _reference(self, grads: Sequence[Gradient], reference: Gradient | None,
                   staleness: Sequence[int] | None) -> Gradient:
        if reference is not None:
            return reference
        if staleness is None and self.lags is None:
            raise UsageError("pass staleness= (τ per gradient) or reference=; the Router was "
                             "built with lags=None", field="staleness")
        field, taus = ("staleness", staleness) if staleness is not None else ("lags", self.lags)
        taus = _check_staleness(taus, field)
        if len(taus) != len(grads):
            raise UsageError(f"{len(grads)} gradients but {len(taus)} values; pass one per "
                             "gradient or an explicit reference", field=field, value=tuple(taus))
        return grads[reference_index(taus)]

    def weights(self, grads: Sequence[Gradient], reference: Gradient | None = None,
                staleness: Sequence[int] | None = None) -> np.ndarray:
        """Gibbs weights π: (K,) float64 numpy array, non-negative, summing to 1.

        Args:
            grads: as ``energies``.
            reference: as ``energies``.
            staleness: as ``energies``.

        Raises:
            UsageError: as ``energies``.
            DataError: if every energy is non-finite (NaN/Inf gradients).

        Example:
            >>> import torch
            >>> Router(lags=(0, 0), beta=0).weights([torch.ones(4), -torch.ones(4)]).tolist()
            [0.5, 0.5]
        """
        return gibbs_weights(self.energies(grads, reference, staleness), self.beta)

    def combine(self, grads: Sequence[Gradient], pi: Any) -> Gradient:
        """ĝ = Σ_{k: π_k ≠ 0} π_k g_k (the MGE einsum), in the structure and dtype of the gradients.

        A gradient of weight 0 is left out (a NaN worker with π_k = 0 cannot poison ĝ); a
        ``None`` entry counts as zeros, and a name ``None`` in every gradient stays ``None``.

        Args:
            grads: K gradients, all state dicts (same names and shapes) or all flat tensors.
            pi: (K,) finite weights ≥ 0: a numpy array, a torch tensor or a list, e.g. from
                ``weights``.

        Returns:
            A state dict {name: tensor or None} or one tensor, like ``grads[0]``.

        Raises:
            UsageError: if ``pi`` is not K finite numbers ≥ 0 (field ``pi``) or the
                gradients differ (field ``grads``).
        """
        _check_same_layout(grads)
        pi = _check_pi(pi, len(grads))
        if isinstance(grads[0], Mapping):
            return {name: self._mix([g[name] for g in grads], pi) for name in grads[0]}
        return self._mix(list(grads), pi)

    @staticmethod
    def _mix(tensors: list[Tensor | None], pi: Tensor) -> Tensor | None:
        present = [t for t in tensors if t is not None]
        if not present:
            return None
        stacked = torch.stack([(t if t is not None else torch.zeros_like(present[0])).detach()
                               for t in tensors])  # (K, ...); None counts as zeros
        return mge_combine(pi, stacked)


def _as_int(t: object) -> int | None:
    """An int from an int, numpy integer or 0-d integer array/tensor; None for anything else."""
    if isinstance(t, Tensor | np.ndarray) and t.ndim == 0:
        t = t.item()
    return int(t) if isinstance(t, int | np.integer) and not isinstance(t, bool) else None


def _check_staleness(values: Any, field: str) -> tuple[int, ...]:
    """K non-negative ints (a sequence, numpy array or torch tensor) as a tuple."""
    try:
        items = [_as_int(t) for t in values]
    except TypeError:
        raise UsageError("use a sequence of non-negative ints, one per worker, e.g. (0, 10)",
                         field=field, value=values) from None
    if not items or any(t is None or t < 0 for t in items):
        raise UsageError("use non-negative ints, one per worker", field=field,
                         value=values if isinstance(values, tuple) else tuple(values))
    return tuple(items)


def _check_gradient(g: object, field: str, k: int | None = None) -> None:
    """A tensor, or a mapping of names to tensors or None."""
    which = "" if k is None else f"gradient {k} "
    if isinstance(g, Tensor):
        return
    if not isinstance(g, Mapping):
        raise UsageError(f"{which}is a {type(g).__name__}; pass a torch tensor or a state dict "
                         "{name: tensor}", field=field)
    bad = [n for n, t in g.items() if t is not None and not isinstance(t, Tensor)]
    if bad:
        raise UsageError(f"{which}has non-tensor entries {bad[:3]} ({type(g[bad[0]]).__name__}); "
                         "pass torch tensors (None for an unused parameter)", field=field)


def _layout(g: Gradient) -> Any:
    """{name: shape or None} of a state dict, or a tensor's shape."""
    if isinstance(g, Mapping):
        return {n: None if t is None else tuple(t.shape) for n, t in g.items()}
    return tuple(g.shape)


def _same(a: Any, b: Any) -> bool:
    """Same layout; a None entry (unused parameter) matches any shape of the same name."""
    if isinstance(a, dict) != isinstance(b, dict):
        return False
    if not isinstance(a, dict):
        return a == b
    return a.keys() == b.keys() and all(a[n] is None or b[n] is None or a[n] == b[n] for n in a)


def _check_same_layout(grads: Sequence[Gradient]) -> None:
    """Every gradient has the first one's structure: the same names and shapes, or a tensor."""
    if isinstance(grads, Mapping | str | bytes) or not isinstance(grads, Sequence | Tensor):
        raise UsageError(f"got {a_type(grads)}; pass a list of K gradients (state dicts "
                         "or tensors), one per worker", field="grads")
    if not len(grads):
        raise UsageError("no gradients; pass one per worker", field="grads")
    for k, g in enumerate(grads):
        _check_gradient(g, "grads", k)
    first = _layout(grads[0])
    for k, g in enumerate(grads[1:], start=1):
        b = _layout(g)
        if isinstance(first, dict) != isinstance(b, dict):
            raise UsageError(f"gradient {k} and gradient 0 mix a state dict and a tensor", field="grads")
        if not _same(first, b):
            raise UsageError(f"gradient {k} has other names or shapes than gradient 0 "
                             f"({_diff(first, b)}); pass state dicts of one model", field="grads")
    if not any(_numel(g) for g in grads):
        raise UsageError(f"every one of the {len(grads)} gradients is empty (0 elements): no energy tells "
                         "them apart; pass the workers' gradients after backward()", field="grads")


def _numel(g: Gradient) -> int:
    """The elements of a gradient (a state dict's tensors summed; None entries count 0)."""
    if isinstance(g, Mapping):
        return sum(t.numel() for t in g.values() if t is not None)
    return g.numel()


def _check_reference(first: Gradient, reference: Gradient) -> None:
    """``reference`` has the gradients' names and shapes (else a UsageError naming the tensors)."""
    _check_gradient(reference, "reference")
    a, b = _layout(first), _layout(reference)
    if isinstance(a, dict) != isinstance(b, dict):
        raise UsageError("mixes a state dict and a tensor with the gradients; pass the same kind",
                         field="reference")
    if not _same(a, b):
        raise UsageError(f"has other names or shapes than the gradients ({_diff(a, b)}); pass a "
                         "gradient of the same model", field="reference")


def _check_pi(pi: Any, k: int) -> Tensor:
    """(K,) float64 weights, finite and ≥ 0 (else a UsageError with field ``pi``)."""
    try:
        w = pi.detach().to("cpu", torch.float64) if isinstance(pi, Tensor) else torch.as_tensor(
            np.asarray(pi, dtype=np.float64))
    except (TypeError, ValueError):
        raise UsageError("not numbers; pass K weights, e.g. from Router.weights", field="pi") from None
    if w.shape != (k,):
        raise UsageError(f"expected {k} weights, one per gradient; got shape {tuple(w.shape)}", field="pi")
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise UsageError(f"weights must be finite and >= 0; got {w.tolist()[:8]}; pass "
                         "Router.weights (a NaN worker gets 0 there)", field="pi")
    return w


def _diff(a: Any, b: Any) -> str:
    if not isinstance(a, dict):
        return f"shape {tuple(b)} vs {tuple(a)}"
    missing, extra = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    if missing or extra:
        return f"missing {missing[:3]}, extra {extra[:3]}"
    name = next(n for n in a if a[n] != b[n])
    return f"{name!r} has shape {b[name]}, expected {a[name]}"
