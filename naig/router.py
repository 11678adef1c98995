"""``naig.Router``: NAIG routing for your own training loop (SPEC §2.5–§2.7).

Given K worker gradients g_k (state dicts or flat tensors) and a reference g_R
(by default the gradient of the worker with the smallest lag):

    d_k = S g_k − S g_R ∈ R^14      S: the SPEC §2.5 signed-hash sketch (seeded, linear)
    E_k = d_kᵀ Ψ_ℓ d_k               Ψ_ℓ: the rank-4 Fano–Fisher metric of line ℓ
    π_k = exp(−β E_k) / Σ_j exp(−β E_j)    β = "auto": 1 / median of positive E_k
    ĝ   = Σ_k π_k g_k                hand ĝ to your unchanged optimizer

Example:
    >>> import torch
    >>> router = Router(lags=(0, 10), seed=0)
    >>> grads = [{"w": torch.ones(64)}, {"w": torch.linspace(-3, 3, 64)}]
    >>> router.energies(grads).round(decimals=2).tolist()  # worker 0 is the reference
    [0.0, 18.28]
    >>> router.weights(grads).round(decimals=4).tolist()  # β = auto = 1/18.28
    [0.7311, 0.2689]
    >>> router.combine(grads, router.weights(grads))["w"].shape
    torch.Size([64])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from naig.errors import UsageError
from naig.gibbs import combine as mge_combine
from naig.gibbs import parse_beta
from naig.metric import fano_fisher_metric, parse_line
from naig.sketch import SKETCH_DIM, check_seed
from naig.sketch_torch import TorchSketch
from naig.strategies.naig import gibbs_pi

__all__ = ["Router", "Gradient"]

Gradient = Mapping[str, Tensor] | Tensor
"""A worker gradient: a state dict {name: tensor} or one flat tensor (named ``"flat"``)."""

_FLAT = "flat"


class Router:
    """Gibbs routing of worker gradients by Fano–Fisher energy of their sketched drift.

    Args:
        lags: τ_k per worker; the default reference is the first worker with min lag.
        beta: inverse temperature, a float ≥ 0 (0 = Hogwild! uniform) or ``"auto"``.
        line: oriented Fano line ℓ of the metric Ψ_ℓ, e.g. ``(1, 2, 4)``.
        seed: sketch seed, an int in 0..2^64−1; the same seed sketches every step consistently.

    Raises:
        UsageError: for an empty/negative ``lags``, a bad ``beta``, a non-Fano ``line``
            or a seed outside 0..2^64−1 (messages name the argument, e.g. ``beta=``).
    """

    def __init__(self, lags: Sequence[int] = (0, 10, 20, 35), beta: float | str = "auto",
                 line: Sequence[int] = (1, 2, 4), seed: int = 0) -> None:
        if not lags or any(int(t) < 0 for t in lags):
            raise UsageError(f"lags={tuple(lags)!r}: use non-negative ints, one per worker")
        self.lags = tuple(int(t) for t in lags)
        self.beta = parse_beta(beta, "beta")
        self.line = parse_line(tuple(line), "line")
        self.seed = check_seed(seed, "seed")
        self._psi = torch.from_numpy(fano_fisher_metric(self.line))  # (14, 14) float64
        self._hashes: dict[tuple[str, int, str], TorchSketch] = {}

    def sketch(self, grad: Gradient) -> Tensor:
        """S g: (14,) float64 sketch of one gradient (hash arrays cached per tensor).

        Args:
            grad: a state dict {name: tensor} or a flat tensor (sketched as tensor ``"flat"``).
        """
        items = grad.items() if isinstance(grad, Mapping) else [(_FLAT, grad)]
        out = None
        for name, x in items:
            flat = x.detach().reshape(-1)
            s = self._hash(name, flat.numel(), flat.device)(flat)
            out = s if out is None else out + s
        return out if out is not None else torch.zeros(SKETCH_DIM, dtype=torch.float64)

    def _hash(self, name: str, numel: int, device: torch.device) -> TorchSketch:
        key = (name, numel, str(device))
        if key not in self._hashes:
            self._hashes[key] = TorchSketch.build([(name, numel)], self.seed, device)
        return self._hashes[key]

    def energies(self, grads: Sequence[Gradient], reference: Gradient | None = None) -> Tensor:
        """E_k = d_kᵀ Ψ d_k with d_k = S g_k − S g_R.

        Args:
            grads: K gradients (state dicts with the same names/shapes, or flat tensors).
            reference: g_R; default: ``grads[argmin(lags)]`` (needs K == len(lags)).

        Returns:
            (K,) float64 tensor on the CPU.

        Raises:
            UsageError: if ``reference`` is None and K differs from ``len(lags)``.
        """
        if reference is None:
            if len(grads) != len(self.lags):
                raise UsageError(f"{len(grads)} gradients but {len(self.lags)} lags; "
                                 "pass one gradient per lag or an explicit reference")
            reference = grads[self.lags.index(min(self.lags))]
        ref = self.sketch(reference).cpu()
        d = torch.stack([self.sketch(g).cpu() for g in grads]) - ref  # (K, 14)
        return torch.einsum("ka,ab,kb->k", d, self._psi, d)

    def weights(self, grads: Sequence[Gradient], reference: Gradient | None = None) -> Tensor:
        """Gibbs weights π (K,) float64, non-negative, summing to 1.

        Raises:
            UsageError: as ``energies``.
            DataError: if every energy is non-finite (NaN/Inf gradients).

        Example:
            >>> import torch
            >>> Router(lags=(0, 0), beta=0).weights([torch.ones(4), -torch.ones(4)]).tolist()
            [0.5, 0.5]
        """
        return gibbs_pi(self.energies(grads, reference), self.beta)

    def combine(self, grads: Sequence[Gradient], pi: Tensor) -> Gradient:
        """ĝ = Σ_k π_k g_k (the MGE einsum), in the structure and dtype of the gradients.

        Args:
            grads: K gradients, all state dicts or all flat tensors.
            pi: (K,) weights, e.g. from ``weights``.

        Returns:
            A state dict {name: tensor} or one tensor, like ``grads[0]``.
        """
        if isinstance(grads[0], Mapping):
            return {name: self._mix([g[name] for g in grads], pi) for name in grads[0]}
        return self._mix(list(grads), pi)

    @staticmethod
    def _mix(tensors: list[Tensor], pi: Tensor) -> Tensor:
        stacked = torch.stack([t.detach() for t in tensors])  # (K, ...)
        return mge_combine(pi.to(stacked.device), stacked)
