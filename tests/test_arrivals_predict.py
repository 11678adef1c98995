"""The laws of the arrival model, checked by hand and against closed forms (docs/design.md §10)."""

import math

import numpy as np
import pytest

from naig.arrivals import ArrivalModel, expected_max, predict, ring_allreduce_bytes
from naig.arrivals.predict import NO_QUADRATURE


def test_per_worker_formula_by_hand() -> None:
    """E[τ_i] = E[C_i]·Σ_{j≠i} 1/E[C_j]; for means 0.5, 1, 2, 4 (Σ 1/E[C] = 3.75)."""
    p = predict(ArrivalModel.from_specs("exp:0.5,exp:1,exp:2,exp:4"))
    assert p.rate == pytest.approx(3.75)
    assert p.per_worker == pytest.approx([0.5 * 1.75, 1 * 2.75, 2 * 3.25, 4 * 3.5])
    assert p.mean == 3 and p.mean_plus_one == 4 and p.age == pytest.approx(4 / 3.75)
    weights = np.array([2, 1, 0.5, 0.25]) / 3.75  # share of updates of each worker
    assert float(weights @ np.array(p.per_worker)) == pytest.approx(3.0)


@pytest.mark.parametrize("k", [1, 2, 8, 64])
def test_iid_exponential_is_geometric(k: int) -> None:
    p = predict(ArrivalModel.from_specs("exp:2", workers=k))
    assert p.p_zero == pytest.approx(1 / k) and p.variance == pytest.approx(k * (k - 1), abs=1e-9)
    tau = np.arange(400 * k)
    assert p.pmf(tau) == pytest.approx((1 / k) * ((k - 1) / k) ** tau, abs=1e-15)
    assert float(p.pmf(tau).sum()) == pytest.approx(1.0)
    assert float((tau * p.pmf(tau)).sum()) == pytest.approx(k - 1)


def test_heterogeneous_exponentials_mix_geometrics() -> None:
    """Worker i sees a Poisson stream of the others' arrivals: τ_i ~ Geometric(λ_i/λ)."""
    p = predict(ArrivalModel.from_specs("exp:0.5,exp:1,exp:2,exp:4", mode="shared-memory"))
    share = np.array([2, 1, 0.5, 0.25]) / 3.75
    assert p.geometric == pytest.approx(share)
    assert p.p_zero == pytest.approx(float((share**2).sum()))
    assert [(1 - q) / q for q in p.geometric] == pytest.approx(list(p.per_worker))


@pytest.mark.parametrize("kwargs", [
    {"compute": "gamma:1:2"}, {"compute": "exp:1", "uplink": "exp:0.1"},
    {"compute": "exp:1", "per_sample": "exp:0.01", "batch_size": 2},
    {"compute": "exp:1", "bytes_up": 1e6, "bandwidth": [1e9]},
])
def test_geometric_law_only_for_exponential_cycles(kwargs: dict) -> None:
    p = predict(ArrivalModel.from_specs(**kwargs, workers=4))
    assert p.geometric is None and p.p_zero is None and p.variance is None and p.pmf(np.arange(3)) is None
    assert p.mean == 3  # the K − 1 law holds for any distributions


def test_const_zero_delays_keep_the_geometric_law() -> None:
    assert predict(ArrivalModel.from_specs("exp:1", workers=4, uplink="const:0",
                                           downlink="const:0")).p_zero == 0.25


def test_non_blocking_predicts_the_rate_only() -> None:
    p = predict(ArrivalModel.from_specs("exp:0.5,exp:2", uplink="exp:3", mode="non-blocking"))
    assert p.rate == pytest.approx(2.5)
    assert (p.mean, p.per_worker, p.p_zero, p.variance, p.age, p.mean_plus_one) == (None,) * 6


def test_windows() -> None:
    p = predict(ArrivalModel.from_specs("exp:1", workers=8), window=4)
    assert p.mean == pytest.approx(7 / 4) and p.per_worker is None and p.geometric is None and p.age is None


@pytest.mark.parametrize("k", [1, 3, 16])
def test_round_time_of_iid_exponentials_is_harmonic(k: int) -> None:
    """E[max of K Exp(m)] = m·H_K."""
    h = sum(1 / j for j in range(1, k + 1))
    assert expected_max(ArrivalModel.from_specs("exp:0.5", workers=k)) == pytest.approx(0.5 * h, rel=1e-9)


def test_round_time_with_constants_and_shifts() -> None:
    assert expected_max(ArrivalModel.from_specs("const:1,const:3")) == 3
    m = ArrivalModel.from_specs("exp:1", workers=2, uplink="const:0.5", downlink="const:0.25")
    assert expected_max(m) == pytest.approx(0.75 + 1.5)
    # max(2, E) with E ~ Exp(1): 2 + E[(E − 2)+] = 2 + e^{-2}
    assert expected_max(ArrivalModel.from_specs("const:2,exp:1")) == pytest.approx(2 + math.exp(-2))
    # a C with two random parts has no closed CDF
    assert expected_max(ArrivalModel.from_specs("exp:1", uplink="exp:1")) is None


def test_ring_allreduce_bytes() -> None:
    assert ring_allreduce_bytes(10, 1) == 0 and ring_allreduce_bytes(10, 2) == 40


def test_pmf_groups_identical_workers_and_matches_the_dense_sum() -> None:
    p = predict(ArrivalModel.from_specs("exp:0.5,exp:1,exp:1,exp:4"))
    k = np.arange(40)
    q = np.asarray(p.geometric)
    dense = (q / q.sum() * q * (1 - q) ** k[:, None]).sum(axis=-1)  # the definition, (k, K) at once
    np.testing.assert_allclose(p.pmf(k), dense, rtol=1e-13, atol=0)
    assert p.pmf(np.array([[0, 1], [2, 3]])).shape == (2, 2)


def test_pmf_memory_is_bounded_for_many_workers() -> None:
    """--workers 100000 allocated a (τ values × K) matrix: 74.5 GiB."""
    import tracemalloc

    p = predict(ArrivalModel.from_specs("exp:1", workers=100_000))
    tracemalloc.start()
    try:
        out = p.pmf(np.arange(200_000))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert out[0] == pytest.approx(1e-5, rel=1e-9) and peak < 64e6, peak  # the dense form: 160 GB


def test_a_failed_quadrature_is_one_worded_warning_and_no_prediction() -> None:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = expected_max(ArrivalModel.from_specs("lognormal:1:5", workers=4))
    assert value is None
    assert [str(w.message) for w in caught] == [NO_QUADRATURE]  # no raw IntegrationWarning
    assert all(w.category is RuntimeWarning for w in caught)


def test_rates_far_apart_keep_the_geometric_moments_finite() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = predict(ArrivalModel.from_specs("exp:1e-100,exp:1e100"))
    assert np.isfinite(p.variance) and p.p_zero == pytest.approx(1.0) and p.mean == 1
