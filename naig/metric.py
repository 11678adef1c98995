"""The Fano–Fisher metric Ψ_ℓ and its exact certificate (docs/design.md §3, Theorem 4.1).

For an oriented reference line ℓ = (i, j, k) the associator energy
E_ℓ(θ) = ‖[e_i, e_j, exp(X_θ) e_k]‖² vanishes to first order at θ = 0, and its
Hessian there is Ψ_ℓ = 2 V_ℓᵀ V_ℓ with V_ℓ ∈ R^{8×14}, column a = [e_i, e_j, X_a e_k].
Theorem 4.1: det(λI − Ψ_ℓ) = λ^10 (λ − 8/3)^4 for all 21 oriented lines, i.e.
rank 4, non-zero eigenvalues all 8/3, a 10-dimensional null space.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache

import numpy as np

from naig.errors import UsageError
from naig.g2 import g2_basis, g2_rational_basis
from naig.octonion import associator, oriented_lines

__all__ = [
    "DEFAULT_LINE",
    "E_MAX_FACTOR",
    "EXPECTED_CHARPOLY",
    "parse_line",
    "associator_columns",
    "fano_fisher_metric",
    "exact_charpoly",
]

DEFAULT_LINE: tuple[int, int, int] = (1, 2, 4)
E_MAX_FACTOR = 8.0 / 3.0  # the non-zero eigenvalue of Ψ_ℓ; E(d) ≤ (8/3)‖d‖²
EXPECTED_CHARPOLY: tuple[Fraction, ...] = (0,) * 10 + (  # type: ignore[assignment]
    Fraction(4096, 81),
    Fraction(-2048, 27),
    Fraction(128, 3),
    Fraction(-32, 3),
    Fraction(1),
)
"""Coefficients, low → high degree, of λ^10 (λ − 8/3)^4."""


@lru_cache(maxsize=1)
def _oriented() -> frozenset[tuple[int, int, int]]:
    return frozenset(oriented_lines())


def parse_line(line: str | tuple[int, ...] | list[int], field: str = "line") -> tuple[int, int, int]:
    """Validate an oriented Fano line.

    Args:
        line: ``"1,2,4"`` or a sequence of three ints.
        field: the argument name errors carry (``UsageError.field``).

    Returns:
        The line as ``(i, j, k)``.

    Raises:
        UsageError: if it is not one of the 21 oriented lines (a Fano line or a
            cyclic rotation of one), e.g. ``1,2,3``.
    """
    try:
        parts = line.split(",") if isinstance(line, str) else list(line)
        ints = all(isinstance(p, int | np.integer) and not isinstance(p, bool) for p in parts)
        if not isinstance(line, str) and (isinstance(line, dict | set | frozenset) or not ints):
            raise TypeError("not ints")  # 1.9 would truncate to 1, True count as 1, a dict give its keys
        triple = tuple(int(p) for p in parts)
    except (TypeError, ValueError, OverflowError):
        triple = ()
    if len(triple) == 3 and triple in _oriented():
        return triple  # type: ignore[return-value]
    valid = " ".join(",".join(map(str, t)) for t in oriented_lines()[::3])
    raise UsageError(f"not an oriented Fano line; use one of {valid} or a cyclic rotation of one",
                     field=field, value=line)


def associator_columns(line: tuple[int, int, int], basis: np.ndarray) -> np.ndarray:
    """V_ℓ: column a = [e_i, e_j, B_a e_k] for each basis matrix B_a.

    Args:
        line: Oriented line (i, j, k).
        basis: (n, 8, 8) array of g2 basis matrices (float or integer).

    Returns:
        Array of shape (8, n), dtype of ``basis`` (exact for integer bases).
    """
    i, j, k = line
    eye = np.eye(8, dtype=basis.dtype)
    cols = associator(eye[i], eye[j], basis[:, :, k])  # (n, 8): B_a e_k is column k
    return cols.T


def fano_fisher_metric(line: tuple[int, int, int] = DEFAULT_LINE) -> np.ndarray:
    """The Fano–Fisher metric Ψ_ℓ = 2 V_ℓᵀ V_ℓ in the orthonormal g2 basis.

    Args:
        line: Oriented Fano line (i, j, k); default (1, 2, 4).

    Returns:
        float64 array of shape (14, 14), symmetric PSD, rank 4, eigenvalues 8/3 and 0.

    Raises:
        UsageError: if ``line`` is not an oriented Fano line.

    Example:
        >>> import numpy as np
        >>> bool(np.isclose(np.linalg.eigvalsh(fano_fisher_metric()).max(), 8 / 3))
        True
    """
    v = associator_columns(parse_line(line), g2_basis())  # (8, 14)
    return 2.0 * v.T @ v


def _solve_exact(g: list[list[Fraction]], p: list[list[Fraction]]) -> list[list[Fraction]]:
    """G⁻¹P by Gauss–Jordan elimination over the rationals."""
    n = len(g)
    aug = [list(g[r]) + list(p[r]) for r in range(n)]
    for col in range(n):
        piv = next(r for r in range(col, n) if aug[r][col] != 0)
        aug[col], aug[piv] = aug[piv], aug[col]
        inv = 1 / aug[col][col]
        aug[col] = [v * inv for v in aug[col]]
        for r in range(n):
            if r != col and aug[r][col] != 0:
                f = aug[r][col]
                aug[r] = [a - f * b for a, b in zip(aug[r], aug[col], strict=True)]
    return [row[n:] for row in aug]


def _charpoly(m: list[list[Fraction]]) -> list[Fraction]:
    """Coefficients (low → high) of det(λI − M) by Faddeev–LeVerrier, exact."""
    n = len(m)
    coeffs = [Fraction(0)] * n + [Fraction(1)]
    mk = [[Fraction(0)] * n for _ in range(n)]
    for k in range(1, n + 1):
        for r in range(n):
            mk[r][r] += coeffs[n - k + 1]
        mk = [[sum(m[r][t] * mk[t][c] for t in range(n)) for c in range(n)] for r in range(n)]
        coeffs[n - k] = -sum(mk[r][r] for r in range(n)) / k
    return coeffs


def exact_charpoly(line: tuple[int, int, int] = DEFAULT_LINE) -> list[Fraction]:
    """Characteristic polynomial of Ψ_ℓ in exact rational arithmetic.

    Uses the integer basis R of ``g2_rational_basis``: its Gram matrix G and
    P = 2 V_Rᵀ V_R are integer, and Ψ_ℓ is similar to G⁻¹P, so
    det(λI − Ψ_ℓ) = det(λI − G⁻¹P), computed with ``fractions.Fraction``.

    Args:
        line: Oriented Fano line.

    Returns:
        15 ``Fraction`` coefficients, low → high degree. Theorem 4.1 says these
        equal ``EXPECTED_CHARPOLY``.

    Raises:
        UsageError: if ``line`` is not an oriented Fano line.
    """
    rs = g2_rational_basis()  # (14, 8, 8) int64
    v = associator_columns(parse_line(line), rs)  # (8, 14) int64
    gram = np.einsum("aij,bij->ab", rs, rs)
    p = 2 * v.T @ v
    to_q = lambda a: [[Fraction(int(x)) for x in row] for row in a]  # noqa: E731
    return _charpoly(_solve_exact(to_q(gram), to_q(p)))
