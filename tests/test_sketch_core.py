"""The signed-hash sketch S : R^n → R^14 (docs/design.md §5)."""

import numpy as np
import pytest

from naig.energy import energy
from naig.sketch import (
    TensorHash,
    fnv1a64,
    sketch_reference,
    sketch_state_dict,
    sketch_tensor,
    splitmix64,
    splitmix64_array,
)

STATE = {
    "w": np.arange(10, dtype=np.float32).reshape(2, 5),
    "b": np.array([1.5, -2.0, 0.25], dtype=np.float32),
}
SEED0 = [4.5, 0, -6, 0, 0, 0, 2, 8, -0.25, 0, -7, 0, 0, 10]
SEED7 = [-4, 6, 0, -7, 11, 0.25, 1, 0, 0, -6.5, 0, 5, 0, 8]


def test_hash_test_vectors():
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert fnv1a64("w") == 0xAF63EA4C86020456
    xs = np.array([0, 1, 2**63, 2**64 - 1], dtype=np.uint64)
    assert splitmix64_array(xs).tolist() == [splitmix64(int(x)) for x in xs]


@pytest.mark.parametrize("path", [sketch_reference, sketch_state_dict])
@pytest.mark.parametrize("seed,expected", [(0, SEED0), (7, SEED7)])
def test_spec_vectors(path, seed, expected):
    np.testing.assert_array_equal(path(STATE, seed), np.array(expected, dtype=np.float64))


def test_spec_energy():
    assert float(energy(sketch_state_dict(STATE, 0))) == pytest.approx(
        164.79166666666669, rel=1e-15
    )


def _dense_matrix(name: str, n: int, seed: int) -> np.ndarray:
    h = TensorHash.build(seed, name, 0, n)
    s = np.zeros((14, n))
    s[h.buckets, np.arange(n)] = h.signs
    return s


def test_fast_equals_reference_and_dense_matrix_float64():
    rng = np.random.default_rng(0)
    state = {"layer.weight": rng.normal(size=(7, 11)), "layer.bias": rng.normal(size=7)}
    for seed in (0, 1, 2**64 - 1):
        fast, ref = sketch_state_dict(state, seed), sketch_reference(state, seed)
        dense = sum(_dense_matrix(k, v.size, seed) @ v.reshape(-1) for k, v in state.items())
        np.testing.assert_allclose(fast, ref, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(fast, dense, rtol=1e-13, atol=1e-13)


def test_chunks_compose():
    x = np.random.default_rng(1).normal(size=1000)
    whole = sketch_tensor(x, TensorHash.build(3, "p", 0, 1000))
    parts = sum(
        sketch_tensor(x[a:b], TensorHash.build(3, "p", a, b))
        for a, b in [(0, 123), (123, 777), (777, 1000)]
    )
    np.testing.assert_allclose(parts, whole, rtol=1e-13, atol=1e-13)


def test_linear():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(2, 50))
    sx, sy = sketch_state_dict({"t": x}), sketch_state_dict({"t": y})
    np.testing.assert_allclose(sketch_state_dict({"t": 2 * x - y}), 2 * sx - sy, atol=1e-12)


def test_inner_product_unbiased_over_seeds():
    """E[<Sx,Sy>] = <x,y>: mean over 4000 seeds within 5 standard errors."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=200)
    y = 0.6 * x + 0.8 * rng.normal(size=200)
    vals = []
    for seed in range(4000):
        h = TensorHash.build(seed, "g", 0, 200)
        vals.append(sketch_tensor(x, h) @ sketch_tensor(y, h))
    vals = np.array(vals)
    err = vals.std() / np.sqrt(len(vals))
    assert abs(vals.mean() - x @ y) < 5 * err
    assert abs(vals.mean() - x @ y) < 0.05 * abs(x @ y)


def test_low_precision_inputs_upcast_exactly():
    import torch

    x = torch.tensor([1.5, -0.375, 3.0, 1e-3], dtype=torch.bfloat16)
    h = TensorHash.build(0, "q", 0, 4)
    exact = sketch_tensor(x.to(torch.float64).numpy(), h)
    assert sketch_tensor(x.float().numpy(), h).tolist() == exact.tolist()
