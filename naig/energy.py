"""Fano–Fisher energy and relative friction of a drift (docs/design.md §4).

For a drift d ∈ R^14 in g2 coordinates, E(d) = dᵀ Ψ_ℓ d with
0 ≤ E(d) ≤ E_max = (8/3)‖d‖². The ridge (the 4-dimensional "Information
Ridge") is range(Ψ_ℓ) and the null space (10-dimensional, "Fano-compatible")
is ker(Ψ_ℓ). Relative friction ρ(d) = E(d) / ((8/3)‖d‖²) ∈ [0, 1], 0 for d = 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from naig.metric import DEFAULT_LINE, E_MAX_FACTOR, fano_fisher_metric

__all__ = ["energy", "e_max", "relative_friction", "ridge_basis", "null_space_basis"]


def energy(d: Any, psi: Any = None) -> Any:
    """E(d) = dᵀ Ψ d for each drift, for numpy arrays and torch tensors alike.

    Args:
        d: drifts of shape (..., 14) in g2 coordinates: a numpy array (any float dtype)
            or a torch tensor (float64 expected, as the sketches are).
        psi: (14, 14) metric of the same library as ``d`` (a torch ``psi`` on ``d``'s
            device); default Ψ for the line (1, 2, 4).

    Returns:
        Energies of shape (...): a float64 numpy array, or a tensor in ``d``'s dtype
        and device. NaN/Inf drifts give non-finite energies.

    Example:
        >>> float(energy(np.eye(14)[4]))
        2.0
    """
    psi = fano_fisher_metric(DEFAULT_LINE) if psi is None else psi
    if type(d).__module__.startswith("torch"):
        import torch

        psi = torch.as_tensor(psi, dtype=d.dtype, device=d.device)
        return ((d @ psi) * d).sum(-1)  # dᵀΨd per row: one (.., 14) @ (14, 14) matmul
    d = np.asarray(d, dtype=np.float64)
    return np.einsum("...a,ab,...b->...", d, psi, d)


def e_max(d: np.ndarray) -> np.ndarray:
    """E_max = (8/3)‖d‖², the largest energy any drift of this norm can have; shape (...)."""
    d = np.asarray(d, dtype=np.float64)
    return E_MAX_FACTOR * np.einsum("...a,...a->...", d, d)


def relative_friction(d: np.ndarray, psi: np.ndarray | None = None) -> np.ndarray:
    """ρ(d) = E(d) / E_max(d) ∈ [0, 1], defined as 0 where d = 0; shape (...)."""
    e, top = energy(d, psi), e_max(d)
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.where(top > 0, e / np.where(top > 0, top, 1.0), 0.0)
    return np.where(np.isfinite(top), rho, np.nan)  # a NaN/Inf drift has no friction


def _eigvecs(psi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    vals, vecs = np.linalg.eigh(psi)
    return vals, vecs


def ridge_basis(line: tuple[int, int, int] = DEFAULT_LINE) -> np.ndarray:
    """Orthonormal basis of the ridge range(Ψ_ℓ): float64 array of shape (14, 4)."""
    vals, vecs = _eigvecs(fano_fisher_metric(line))
    return vecs[:, vals > E_MAX_FACTOR / 2]


def null_space_basis(line: tuple[int, int, int] = DEFAULT_LINE) -> np.ndarray:
    """Orthonormal basis of the null space ker(Ψ_ℓ): float64 array of shape (14, 10)."""
    vals, vecs = _eigvecs(fano_fisher_metric(line))
    return vecs[:, vals <= E_MAX_FACTOR / 2]
