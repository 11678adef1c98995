"""The canonical Frobenius-orthonormal basis of the Lie algebra g2 (docs/design.md §2).

g2 is the 14-dimensional algebra of derivations of the octonions: 8×8 real
matrices X (acting on octonion coordinates, e0 fixed) with X(xy) = X(x)y + xX(y).
For each point p = 1..7 the three Fano lines through p, in the order of
``FANO_LINES`` and rotated to (p, j, k), give rotation generators A_p, B_p, C_p =
E_jk; the derivations in their span are aA_p + bB_p + cC_p with a + b + c = 0.
The basis is

    X_{2(p-1)}   = (A_p − B_p) / 2
    X_{2(p-1)+1} = (A_p + B_p − 2 C_p) / (2√3)

orthonormal under ⟨X, Y⟩ = tr(XᵀY). Coordinates θ ∈ R^14 mean X_θ = Σ θ_a X_a.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from naig.octonion import FANO_LINES, mul

__all__ = [
    "G2_DIM",
    "rotation_generator",
    "point_generators",
    "g2_basis",
    "g2_rational_basis",
    "orthonormality_residual",
    "derivation_residual",
    "element",
]

G2_DIM = 14


def rotation_generator(j: int, k: int) -> np.ndarray:
    """E_jk: the 8×8 int64 rotation generator with E e_j = e_k, E e_k = −e_j, zero elsewhere."""
    e = np.zeros((8, 8), dtype=np.int64)
    e[k, j] = 1
    e[j, k] = -1
    return e


def point_generators(p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (A_p, B_p, C_p) for the point p ∈ 1..7, each an 8×8 int64 matrix.

    The three lines through p are taken in the order of ``FANO_LINES`` and
    rotated so that p comes first, (p, j, k); each gives E_jk.
    """
    gens = []
    for line in FANO_LINES:
        if p in line:
            r = line.index(p)
            j, k = line[(r + 1) % 3], line[(r + 2) % 3]
            gens.append(rotation_generator(j, k))
    a, b, c = gens
    return a, b, c


@lru_cache(maxsize=1)
def g2_basis() -> np.ndarray:
    """The canonical orthonormal g2 basis.

    Returns:
        float64 array of shape (14, 8, 8), read-only; index a is X_a of docs/design.md §2.
    """
    xs = []
    for p in range(1, 8):
        a, b, c = point_generators(p)
        xs.append((a - b) / 2.0)
        xs.append((a + b - 2 * c) / (2.0 * np.sqrt(3.0)))
    out = np.stack(xs)  # (14, 8, 8)
    out.setflags(write=False)
    return out


def g2_rational_basis() -> np.ndarray:
    """The integer basis R_{2(p-1)} = A_p − B_p, R_{2(p-1)+1} = B_p − C_p.

    Spans the same space as ``g2_basis`` and is used for the exact certificate.

    Returns:
        int64 array of shape (14, 8, 8).
    """
    rs = []
    for p in range(1, 8):
        a, b, c = point_generators(p)
        rs.extend([a - b, b - c])
    return np.stack(rs)


def element(theta: np.ndarray) -> np.ndarray:
    """X_θ = Σ_a θ_a X_a for coordinates ``theta`` of shape (..., 14); returns (..., 8, 8)."""
    return np.einsum("...a,aij->...ij", theta, g2_basis())


def orthonormality_residual(basis: np.ndarray | None = None) -> float:
    """max |tr(X_aᵀ X_b) − δ_ab| over the basis (default: ``g2_basis()``)."""
    xs = g2_basis() if basis is None else basis
    gram = np.einsum("aij,bij->ab", xs, xs)  # (14, 14)
    return float(np.abs(gram - np.eye(len(xs))).max())


def derivation_residual(basis: np.ndarray | None = None) -> float:
    """max over a and unit pairs (e_b, e_c) of |X_a(e_b e_c) − X_a(e_b)e_c − e_b X_a(e_c)|.

    Zero (up to rounding) iff every basis element is a derivation of the octonions;
    by bilinearity the unit pairs suffice.
    """
    xs = g2_basis() if basis is None else basis
    eye = np.eye(8)
    prod = mul(eye[:, None, :], eye[None, :, :])  # (8, 8, 8): e_b e_c
    lhs = np.einsum("aij,bcj->abci", xs, prod)
    xe = np.einsum("aij,bj->abi", xs, eye)  # (14, 8, 8): X_a e_b
    rhs = mul(xe[:, :, None, :], eye[None, None, :, :]) + mul(
        eye[None, :, None, :], xe[:, None, :, :]
    )
    return float(np.abs(lhs - rhs).max())
