"""Energy, relative friction, ridge and null space (docs/design.md §4)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from naig.energy import e_max, energy, null_space_basis, relative_friction, ridge_basis
from naig.metric import fano_fisher_metric

drifts = arrays(np.float64, 14, elements=st.floats(-1e6, 1e6, allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(drifts)
def test_energy_bounded_by_emax(d):
    e = float(energy(d))
    assert -1e-9 * (1 + e_max(d)) <= e <= e_max(d) * (1 + 1e-12) + 1e-300
    rho = float(relative_friction(d))
    assert 0.0 <= rho <= 1.0 + 1e-12


def test_ridge_attains_emax_and_null_space_is_free():
    r, n = ridge_basis(), null_space_basis()
    assert r.shape == (14, 4) and n.shape == (14, 10)
    rng = np.random.default_rng(0)
    d_ridge = r @ rng.normal(size=4)
    d_null = n @ rng.normal(size=10)
    np.testing.assert_allclose(energy(d_ridge), e_max(d_ridge), rtol=1e-12)
    assert abs(float(energy(d_null))) <= 1e-12
    assert float(relative_friction(d_ridge)) == np.float64(1.0) or abs(
        float(relative_friction(d_ridge)) - 1) < 1e-12


def test_zero_drift_has_zero_friction():
    assert float(relative_friction(np.zeros(14))) == 0.0
    assert float(energy(np.zeros(14))) == 0.0


def test_batched_shapes_and_other_line():
    d = np.random.default_rng(1).normal(size=(3, 5, 14))
    psi = fano_fisher_metric((2, 3, 5))
    assert energy(d, psi).shape == (3, 5)
    np.testing.assert_allclose(energy(d, psi)[1, 2], d[1, 2] @ psi @ d[1, 2])


def test_non_finite_drift_has_nan_friction():
    d = np.zeros(14)
    d[4] = np.nan
    assert np.isnan(relative_friction(d))
    d[4] = np.inf
    assert np.isnan(relative_friction(d))
