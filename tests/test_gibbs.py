"""Gibbs weights, beta, K_eff, frozen workers and the MGE combine (docs/design.md §7)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from naig.errors import DataError, UsageError
from naig.gibbs import (
    combine,
    effective_workers,
    frozen_mask,
    gibbs_weights,
    normalized_entropy,
    parse_beta,
    reference_index,
    resolve_beta,
)

energies = arrays(np.float64, st.integers(1, 16), elements=st.floats(0, 1e300))
betas = st.floats(0, 1e12)


@settings(max_examples=400, deadline=None)
@given(energies, betas)
def test_weights_sum_to_one_and_are_finite(e, beta):
    pi = gibbs_weights(e, beta)
    assert np.isfinite(pi).all() and (pi >= 0).all()
    assert math.isclose(pi.sum(), 1.0, rel_tol=1e-12)
    assert pi[np.argmin(e)] == pi.max()  # the lowest energy gets the largest weight


def test_extreme_energies_and_beta():
    pi = gibbs_weights(np.array([1e300, 0.0, 5e299]), 1e12)
    np.testing.assert_array_equal(pi, [0.0, 1.0, 0.0])
    pi = gibbs_weights(np.array([1e300, 1e300]), 1e12)
    np.testing.assert_allclose(pi, [0.5, 0.5])


def test_matches_plain_softmax_where_that_is_safe():
    e, beta = np.array([0.3, 1.2, 2.0, 0.1]), 1.7
    z = np.exp(-beta * e)
    np.testing.assert_allclose(gibbs_weights(e, beta), z / z.sum(), rtol=1e-14)


def test_beta_zero_is_uniform_and_non_finite_gets_zero():
    np.testing.assert_allclose(gibbs_weights(np.array([1.0, 9.0, 4.0]), 0.0), [1 / 3] * 3)
    pi = gibbs_weights(np.array([1.0, np.nan, np.inf, 1.0]), 2.0)
    np.testing.assert_allclose(pi, [0.5, 0, 0, 0.5])


def test_all_non_finite_is_an_error():
    with pytest.raises(DataError, match="non-finite"):
        gibbs_weights(np.array([np.nan, np.inf]), 1.0)


def test_auto_beta_is_inverse_median_of_finite_positive():
    assert resolve_beta("auto", np.array([0.0, 2.0, 4.0, 8.0, np.nan])) == 1 / 4.0
    assert resolve_beta("auto", np.array([0.0, np.inf])) == 1.0
    assert resolve_beta(3.5, np.array([1.0])) == 3.5


@pytest.mark.parametrize("bad", ["-1", "nan", "inf", "abc", -0.5, float("nan")])
def test_bad_beta_rejected(bad):
    with pytest.raises(UsageError, match="beta=") as info:
        parse_beta(bad)
    assert info.value.field == "beta" and info.value.value is bad


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "0.5", None])
def test_resolve_beta_refuses_unparsed_or_bad_values(bad):
    with pytest.raises(UsageError, match="beta="):
        resolve_beta(bad, np.array([1.0]))


def test_reference_index_is_the_first_least_stale():
    assert reference_index([3, 1, 7, 1]) == 1 and reference_index(np.array([0])) == 0
    assert reference_index(torch.tensor([5, 2, 2])) == 1


def test_k_eff_frozen_entropy():
    assert effective_workers(np.array([0.25] * 4)) == pytest.approx(4.0)
    assert effective_workers(np.array([1.0, 0, 0, 0])) == pytest.approx(1.0)
    np.testing.assert_array_equal(frozen_mask(np.array([0.991, 0.0024, 0.0026, 0.004])),
                                  [False, True, False, False])
    assert normalized_entropy(np.array([0.25] * 4)) == pytest.approx(1.0)
    assert normalized_entropy(np.array([1.0, 0, 0, 0])) == pytest.approx(0.0)


def test_combine_numpy_and_torch_agree():
    rng = np.random.default_rng(0)
    g = rng.normal(size=(3, 4, 5))
    pi = np.array([0.2, 0.5, 0.3])
    expected = 0.2 * g[0] + 0.5 * g[1] + 0.3 * g[2]
    np.testing.assert_allclose(combine(pi, g), expected, rtol=1e-14)
    out = combine(torch.from_numpy(pi), torch.from_numpy(g))
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-14)


def test_weights_accept_auto_and_subnormal_median_gives_finite_beta():
    e = np.array([0.0, 5e-324, 1e-320, 3.0])
    beta = resolve_beta("auto", e)
    assert math.isfinite(beta) and beta > 1e300
    pi = gibbs_weights(e, "auto")
    assert math.isclose(pi.sum(), 1.0) and pi[0] == pi.max()


def test_a_bool_is_not_a_beta_or_a_clip_radius() -> None:
    """float(True) is 1.0: `rules.beta = true` in a config ran with β = 1 (and clip with radius 1)."""
    from naig.errors import UsageError
    from naig.gibbs import parse_beta
    from naig.simulate.strategies.base import parse_clip

    for parse, field in ((parse_beta, "beta"), (parse_clip, "clip")):
        for value in (True, False):
            with pytest.raises(UsageError, match="not a number") as err:
                parse(value)
            assert err.value.field == field
        assert parse("auto") == "auto" and parse(1) == 1.0
