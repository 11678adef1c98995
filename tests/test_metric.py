"""The Fano–Fisher metric Ψ and its exact certificate (docs/design.md §3)."""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from naig.errors import UsageError
from naig.g2 import g2_basis
from naig.metric import EXPECTED_CHARPOLY, exact_charpoly, fano_fisher_metric, parse_line
from naig.octonion import associator, oriented_lines

S3 = math.sqrt(3.0)


def test_default_line_blocks_match_spec():
    psi = fano_fisher_metric()
    expected = np.zeros((14, 14))
    neg = np.array([[2, -2 / S3], [-2 / S3, 2 / 3]])
    pos = np.array([[2, 2 / S3], [2 / S3, 2 / 3]])
    for (a, b), blk in zip([(4, 5), (8, 9), (10, 11), (12, 13)], [neg, neg, pos, pos], strict=True):
        expected[a : b + 1, a : b + 1] = blk
    np.testing.assert_allclose(psi, expected, atol=1e-14)


@pytest.mark.parametrize("line", oriented_lines())
def test_spectrum_every_line(line):
    eigs = np.linalg.eigvalsh(fano_fisher_metric(line))
    np.testing.assert_allclose(eigs[:10], 0.0, atol=1e-13)
    np.testing.assert_allclose(eigs[10:], 8 / 3, atol=1e-13)


@pytest.mark.parametrize("line", oriented_lines())
def test_exact_certificate_every_line(line):
    coeffs = exact_charpoly(line)
    assert all(isinstance(c, Fraction) for c in coeffs)
    assert coeffs == list(EXPECTED_CHARPOLY)
    assert coeffs[10:] == [
        Fraction(4096, 81),
        Fraction(-2048, 27),
        Fraction(128, 3),
        Fraction(-32, 3),
        1,
    ]


def _energy_torch(theta: torch.Tensor, line) -> torch.Tensor:
    i, j, k = line
    basis = torch.from_numpy(np.array(g2_basis()))
    x = torch.einsum("a,aij->ij", theta, basis)
    v = torch.linalg.matrix_exp(x)[:, k].numpy()
    eye = np.eye(8)
    return float(np.sum(associator(eye[i], eye[j], v) ** 2))


@pytest.mark.parametrize("line", [(1, 2, 4), (3, 4, 6), (3, 7, 1)])
def test_psi_equals_finite_difference_hessian(line):
    """Central second differences of E_ℓ(θ) = ‖[e_i, e_j, exp(X_θ)e_k]‖² at θ = 0."""
    h = 1e-4
    eye = torch.eye(14, dtype=torch.float64)
    f = lambda t: _energy_torch(t, line)  # noqa: E731
    hess = np.zeros((14, 14))
    for a in range(14):
        for b in range(14):
            ea, eb = h * eye[a], h * eye[b]
            hess[a, b] = (f(ea + eb) - f(ea - eb) - f(eb - ea) + f(-ea - eb)) / (4 * h * h)
    assert f(torch.zeros(14, dtype=torch.float64)) == 0.0
    np.testing.assert_allclose(hess, fano_fisher_metric(line), atol=1e-6)


@pytest.mark.parametrize("bad", ["1,2,3", "1,2", "4,2,1", "a,b,c", "1,2,4,5", "", "0,1,2"])
def test_parse_line_rejects_non_fano(bad):
    with pytest.raises(UsageError, match="not an oriented Fano line"):
        parse_line(bad)


@pytest.mark.parametrize("bad", [(1.9, 2.2, 4.0), (True, 2, 4), {1: 0, 2: 0, 4: 0}, (float("inf"), 2, 4),
                                 None])
def test_parse_line_takes_ints_only(bad):
    """Floats were truncated (1.9 → 1), True read as 1, a dict as its keys, inf an OverflowError."""
    with pytest.raises(UsageError, match="not an oriented Fano line"):
        parse_line(bad)
    assert parse_line(np.array([1, 2, 4])) == (1, 2, 4)


def test_parse_line_accepts_rotations():
    assert parse_line("2,4,1") == (2, 4, 1)
    assert parse_line([7, 1, 3]) == (7, 1, 3)
