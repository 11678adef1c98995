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

__all__ = ["energy", "e_max", "relative_friction", "energy_spread", "ridge_basis", "null_space_basis"]


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


def energy_spread(
    delta_sq: float, delta_4th: float, psi: np.ndarray | None = None, sketches: int = 1
) -> float:
    """Standard deviation of the sketched energy E(SΔ) over the random sketch hash.

    With d = SΔ (docs/design.md §5) and each coordinate's bucket and sign independent and
    uniform, S₂ = ‖Δ‖², S₄ = Σ Δ_i⁴ and n_b = 14 buckets (derivation: docs/design.md §5.1):

        E[E]  = tr Ψ · S₂ / n_b
        Var E = [2 tr(Ψ²) S₂² + S₄ (n_b Σ_a Ψ_aa² − (tr Ψ)² − 2 tr(Ψ²))] / n_b²

    For a drift spread over many coordinates (S₄ ≪ S₂²) this is the χ²₄ law
    E ≈ (8/3)(S₂/14)·χ²₄ with relative std √(1/2) ≈ 0.71. The mean of R independent
    sketches has 1/√R of this spread.

    Args:
        delta_sq: S₂ = ‖x_k − x_R‖² in full dimension.
        delta_4th: S₄ = Σ (x_k − x_R)⁴ in full dimension.
        psi: (14, 14) metric; default Ψ for the line (1, 2, 4).
        sketches: R, the number of independent sketches averaged into the energy.

    Returns:
        The standard deviation of E (float, ≥ 0); NaN for non-finite inputs.

    Example:
        >>> s = energy_spread(1.0, 1e-9)  # ‖Δ‖ = 1, spread over many coordinates
        >>> round(s / (32 / 3 / 14), 4)  # relative to the mean E tr Ψ / 14
        0.7071
    """
    psi = fano_fisher_metric(DEFAULT_LINE) if psi is None else np.asarray(psi, dtype=np.float64)
    nb = psi.shape[0]
    tr, tr2, diag2 = np.trace(psi), np.sum(psi * psi), np.sum(np.diag(psi) ** 2)
    var = (2 * tr2 * delta_sq**2 + delta_4th * (nb * diag2 - tr**2 - 2 * tr2)) / nb**2
    return float(np.sqrt(max(var, 0.0)) / np.sqrt(sketches)) if np.isfinite(var) else float("nan")


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
