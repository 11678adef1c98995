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
from naig.errors import UsageError
from naig.gibbs import combine as mge_combine
from naig.gibbs import gibbs_weights, parse_beta, reference_index
from naig.metric import fano_fisher_metric, parse_line
from naig.sketch.core import SKETCH_DIM, check_seed
from naig.sketch.torch_sketch import TorchSketch

__all__ = ["Router", "Gradient"]

Gradient = Mapping[str, Tensor] | Tensor
"""A worker gradient: a state dict {name: tensor} or one flat tensor (named ``"flat"``)."""

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
        UsageError: for an empty/negative ``lags``, a bad ``beta``, a non-Fano ``line``
            or a seed outside 0..2^64−1 (``UsageError.field`` names the argument).
    """

    def __init__(self, lags: Sequence[int] | None = (0, 10, 20, 35), beta: float | str = "auto",
                 line: Sequence[int] = (1, 2, 4), seed: int = 0) -> None:
        self.lags = None if lags is None else _check_staleness(lags, "lags")
        self.beta = parse_beta(beta)
        self.line = parse_line(tuple(line))
        self.seed = check_seed(seed)
        self._psi = torch.from_numpy(fano_fisher_metric(self.line))  # (14, 14) float64
        self._hashes: dict[tuple[str, int, str], TorchSketch] = {}

    def sketch(self, grad: Gradient) -> Tensor:
        """S g: (14,) float64 sketch of one gradient (hash arrays cached per tensor).

        Args:
            grad: a state dict {name: tensor} or a flat tensor (sketched as tensor ``"flat"``).
        """
        items = grad.items() if isinstance(grad, Mapping) else [(_FLAT, grad)]
        out = torch.zeros(SKETCH_DIM, dtype=torch.float64)
        for name, x in items:
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
                choose the reference, if no reference can be chosen, or if the state
                dicts do not share names and shapes.
        """
        _check_same_layout(grads)
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
            grads, reference, staleness: as ``energies``.

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
        """ĝ = Σ_k π_k g_k (the MGE einsum), in the structure and dtype of the gradients.

        Args:
            grads: K gradients, all state dicts (same names and shapes) or all flat tensors.
            pi: (K,) weights: a numpy array, a torch tensor or a list, e.g. from ``weights``.

        Returns:
            A state dict {name: tensor} or one tensor, like ``grads[0]``.

        Raises:
            UsageError: if ``pi`` does not hold K weights or the state dicts differ.
        """
        _check_same_layout(grads)
        pi = torch.as_tensor(np.asarray(pi, dtype=np.float64) if not isinstance(pi, Tensor) else pi)
        if pi.shape != (len(grads),):
            raise UsageError(f"expected {len(grads)} weights, one per gradient; got shape "
                             f"{tuple(pi.shape)}", field="pi")
        if isinstance(grads[0], Mapping):
            return {name: self._mix([g[name] for g in grads], pi) for name in grads[0]}
        return self._mix(list(grads), pi)

    @staticmethod
    def _mix(tensors: list[Tensor], pi: Tensor) -> Tensor:
        stacked = torch.stack([t.detach() for t in tensors])  # (K, ...)
        return mge_combine(pi, stacked)


def _check_staleness(values: Sequence[int], field: str) -> tuple[int, ...]:
    taus = tuple(int(t) for t in values)
    if not taus or any(t < 0 for t in taus):
        raise UsageError("use non-negative ints, one per worker", field=field, value=tuple(values))
    return taus


def _check_same_layout(grads: Sequence[Gradient]) -> None:
    """Every gradient has the first one's structure: the same names and shapes, or a tensor."""
    if not grads:
        raise UsageError("no gradients; pass one per worker", field="grads")
    first = grads[0]
    for k, g in enumerate(grads[1:], start=1):
        if isinstance(first, Mapping) != isinstance(g, Mapping):
            raise UsageError(f"gradient {k} and gradient 0 mix a state dict and a tensor", field="grads")
        a = {n: tuple(t.shape) for n, t in first.items()} if isinstance(first, Mapping) else first.shape
        b = {n: tuple(t.shape) for n, t in g.items()} if isinstance(g, Mapping) else g.shape
        if a != b:
            raise UsageError(f"gradient {k} has other names or shapes than gradient 0 "
                             f"({_diff(a, b)}); pass state dicts of one model", field="grads")


def _diff(a: Any, b: Any) -> str:
    if not isinstance(a, dict):
        return f"shape {tuple(b)} vs {tuple(a)}"
    missing, extra = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    if missing or extra:
        return f"missing {missing[:3]}, extra {extra[:3]}"
    name = next(n for n in a if a[n] != b[n])
    return f"{name!r} has shape {b[name]}, expected {a[name]}"
