"""Octonion identities on the Fano table (docs/design.md §1)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from naig.octonion import FANO_LINES, associator, basis, mul, oriented_lines, structure_constants

octs = arrays(np.float64, 8, elements=st.floats(-10, 10, allow_nan=False))


def test_fano_products_and_anticommutation():
    for i, j, k in oriented_lines():
        assert mul(basis(i), basis(j)).tolist() == basis(k).tolist()
        assert mul(basis(j), basis(i)).tolist() == (-basis(k)).tolist()


def test_units_square_to_minus_one_and_e0_is_identity():
    for i in range(1, 8):
        assert mul(basis(i), basis(i)).tolist() == (-basis(0)).tolist()
        assert mul(basis(0), basis(i)).tolist() == basis(i).tolist()
        assert mul(basis(i), basis(0)).tolist() == basis(i).tolist()


def test_table_is_complete():
    # every pair of distinct imaginary units lies on exactly one line
    c = structure_constants()
    nonzero = (c != 0).sum(axis=2)
    assert (nonzero == 1).all()
    assert len(oriented_lines()) == 21 and len(FANO_LINES) == 7


def test_associator_on_lines():
    assert not associator(basis(1), basis(2), basis(4)).any()
    assert associator(basis(1), basis(2), basis(3)).any()
    for i, j, k in oriented_lines():
        assert not associator(basis(i), basis(j), basis(k)).any()


@settings(max_examples=200, deadline=None)
@given(octs, octs)
def test_alternativity(a, b):
    scale = 1 + np.abs(a).max() ** 2 * np.abs(b).max()
    assert np.abs(associator(a, a, b)).max() <= 1e-12 * scale
    assert np.abs(associator(a, b, b)).max() <= 1e-12 * (1 + np.abs(a).max() * np.abs(b).max() ** 2)


@settings(max_examples=200, deadline=None)
@given(octs, octs)
def test_norm_multiplicativity(a, b):
    lhs = np.linalg.norm(mul(a, b))
    rhs = np.linalg.norm(a) * np.linalg.norm(b)
    assert lhs == pytest.approx(rhs, rel=1e-12, abs=1e-12)
