"""The canonical g2 basis (docs/design.md §2)."""

import numpy as np

from naig.g2 import (
    derivation_residual,
    element,
    g2_basis,
    g2_rational_basis,
    orthonormality_residual,
    point_generators,
)
from naig.octonion import mul


def test_basis_is_orthonormal():
    assert g2_basis().shape == (14, 8, 8)
    assert orthonormality_residual() <= 1e-15


def test_every_basis_element_is_a_derivation():
    assert derivation_residual() <= 1e-15


def test_random_element_is_a_derivation_on_random_octonions():
    rng = np.random.default_rng(3)
    x = element(rng.normal(size=14))
    a, b = rng.normal(size=(2, 8))
    lhs = x @ mul(a, b)
    rhs = mul(x @ a, b) + mul(a, x @ b)
    np.testing.assert_allclose(lhs, rhs, atol=1e-12)


def test_non_derivation_is_detected():
    # a single rotation generator is not a derivation: the check can fail
    a, _, _ = point_generators(1)
    assert derivation_residual(a[None].astype(float)) > 0.5


def test_basis_fixes_e0_and_is_antisymmetric():
    xs = g2_basis()
    assert not xs[:, :, 0].any() and not xs[:, 0, :].any()
    np.testing.assert_array_equal(xs, -xs.transpose(0, 2, 1))


def test_rational_basis_spans_same_space():
    xs = g2_basis().reshape(14, 64)
    rs = g2_rational_basis().reshape(14, 64).astype(float)
    assert np.linalg.matrix_rank(np.vstack([xs, rs])) == 14
    assert np.linalg.matrix_rank(rs) == 14
