"""Octonion algebra on the Fano plane (docs/design.md §1).

Octonions are real 8-vectors over the basis e0 (the real unit), e1..e7. The
product is fixed by the seven oriented Fano lines ``FANO_LINES``: for each line
(i, j, k) and its cyclic rotations, e_i e_j = e_k and e_j e_i = −e_k; e_i e_i =
−e0 for i ≥ 1; e0 is the identity; the product is bilinear.

Example:
    >>> from naig.octonion import basis, mul
    >>> mul(basis(1), basis(2)).tolist() == basis(4).tolist()
    True
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

__all__ = [
    "FANO_LINES",
    "oriented_lines",
    "structure_constants",
    "basis",
    "mul",
    "associator",
]

FANO_LINES: tuple[tuple[int, int, int], ...] = (
    (1, 2, 4),
    (2, 3, 5),
    (3, 4, 6),
    (4, 5, 7),
    (5, 6, 1),
    (6, 7, 2),
    (7, 1, 3),
)


def oriented_lines() -> list[tuple[int, int, int]]:
    """Return the 21 oriented lines: each Fano line and its two cyclic rotations.

    Returns:
        List of 21 ``(i, j, k)`` triples, in the order of ``FANO_LINES``, each
        line followed by its rotations ``(j, k, i)`` and ``(k, i, j)``.
    """
    return [(t[r], t[(r + 1) % 3], t[(r + 2) % 3]) for t in FANO_LINES for r in range(3)]


@lru_cache(maxsize=1)
def structure_constants() -> np.ndarray:
    """Return C with e_a e_b = Σ_c C[a, b, c] e_c.

    Returns:
        int64 array of shape (8, 8, 8) with entries in {−1, 0, 1}; read-only.
    """
    c = np.zeros((8, 8, 8), dtype=np.int64)
    for a in range(8):
        c[0, a, a] = c[a, 0, a] = 1
    for a in range(1, 8):
        c[a, a, 0] = -1
    for i, j, k in oriented_lines():
        c[i, j, k] = 1
        c[j, i, k] = -1
    c.setflags(write=False)
    return c


def basis(i: int) -> np.ndarray:
    """Return the unit octonion e_i as an int64 8-vector (0 ≤ i ≤ 7)."""
    e = np.zeros(8, dtype=np.int64)
    e[i] = 1
    return e


def mul(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Octonion product xy.

    Args:
        x: Array of shape (..., 8), any real or integer dtype.
        y: Array of shape (..., 8), broadcastable with ``x``.

    Returns:
        Array of shape (..., 8); integer inputs give exact integer results.
    """
    return np.einsum("...a,...b,abc->...c", x, y, structure_constants())


def associator(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Associator [x, y, z] = (xy)z − x(yz), shape (..., 8).

    It vanishes when two arguments are equal (alternativity) and on the three
    units of any Fano line, e.g. [e1, e2, e4] = 0, but [e1, e2, e3] ≠ 0.
    """
    return mul(mul(x, y), z) - mul(x, mul(y, z))
