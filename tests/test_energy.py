"""Energy, relative friction, ridge and null space (docs/design.md §4)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from naig.energy import e_max, energy, energy_spread, null_space_basis, relative_friction, ridge_basis
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


def _random_hash_energies(delta: np.ndarray, psi: np.ndarray, draws: int, seed: int) -> np.ndarray:
    """E(SΔ) for ``draws`` independent uniform hashes (buckets and signs from numpy's generator)."""
    rng = np.random.default_rng(seed)
    buckets = rng.integers(0, 14, size=(draws, delta.size))
    signs = rng.choice([-1.0, 1.0], size=(draws, delta.size))
    d = np.zeros((draws, 14))
    np.add.at(d, (np.repeat(np.arange(draws), delta.size), buckets.ravel()), (signs * delta).ravel())
    return energy(d, psi)


@pytest.mark.parametrize("line", [(1, 2, 4), (2, 3, 5)])
@pytest.mark.parametrize("kind", ["spread", "few", "one"])
def test_energy_spread_matches_random_hashes(line, kind):
    """The closed form of docs/design.md §5.1 against 20,000 draws of a truly random hash."""
    rng = np.random.default_rng(1)
    delta = {"spread": rng.normal(size=300) * rng.uniform(0.1, 3, size=300),
             "few": np.array([5.0, -3.0, 1.0, 0.5]), "one": np.array([2.0])}[kind]
    psi = fano_fisher_metric(line)
    e = _random_hash_energies(delta, psi, 20_000, seed=2)
    s2, s4 = float(delta @ delta), float((delta**2) @ (delta**2))
    assert e.mean() == pytest.approx(np.trace(psi) * s2 / 14, rel=0.03)
    assert e.std() == pytest.approx(energy_spread(s2, s4, psi), rel=0.04)


def test_energy_spread_limits():
    psi = fano_fisher_metric((1, 2, 4))
    mean = np.trace(psi) / 14  # E[E] for ‖Δ‖ = 1
    assert energy_spread(1.0, 0.0, psi) / mean == pytest.approx(np.sqrt(0.5), rel=1e-12)  # χ²₄
    diag = np.diag(psi)  # one coordinate: E = Ψ_aa Δ² with a uniform bucket a
    assert energy_spread(1.0, 1.0, psi) == pytest.approx(diag.std(), rel=1e-12)
    assert energy_spread(4.0, 2.0, psi, sketches=4) == pytest.approx(energy_spread(4.0, 2.0, psi) / 2)
    assert np.isnan(energy_spread(float("inf"), 1.0, psi))
