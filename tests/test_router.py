"""naig.Router on state dicts and flat tensors (naig.router)."""

import math

import numpy as np
import pytest
import torch

import naig
from naig.energy import energy
from naig.errors import DataError, UsageError
from naig.gibbs import gibbs_weights, resolve_beta
from naig.router import Router
from naig.sketch import sketch_state_dict


def _grads(k: int = 4, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [{"w": torch.randn(6, 5, generator=gen), "b": torch.randn(5, generator=gen)}
            for _ in range(k)]


def test_exported_lazily_from_naig() -> None:
    assert naig.Router is Router and "Router" in naig.__all__


def test_weights_match_the_numpy_pipeline() -> None:
    grads = _grads()
    pi = Router(lags=(0, 10, 20, 35)).weights(grads)
    sk = np.stack([sketch_state_dict({n: t.numpy() for n, t in g.items()}) for g in grads])
    e = energy(sk - sk[0])
    assert isinstance(pi, np.ndarray) and pi.dtype == np.float64 and pi.shape == (4,)
    assert np.allclose(pi, gibbs_weights(e, resolve_beta("auto", e)), atol=1e-12)
    assert math.isclose(float(pi.sum()), 1.0)


def test_reference_defaults_to_min_lag_worker() -> None:
    grads = _grads()
    router = Router(lags=(3, 1, 7, 1))
    assert float(router.energies(grads)[1]) == 0.0
    np.testing.assert_array_equal(router.weights(grads), router.weights(grads, reference=grads[1]))


def test_per_call_staleness_chooses_the_reference() -> None:
    grads = _grads()
    router = Router(lags=(0, 1, 2, 3))
    e = router.energies(grads, staleness=(4, 4, 0, 9))  # worker 2 is the freshest now
    assert e[2] == 0.0 and e[0] > 0
    np.testing.assert_array_equal(e, router.energies(grads, reference=grads[2]))
    free = Router(lags=None)
    np.testing.assert_array_equal(free.weights(grads, staleness=(4, 4, 0, 9)),
                                  router.weights(grads, staleness=(4, 4, 0, 9)))
    with pytest.raises(UsageError, match="staleness"):
        free.weights(grads)
    with pytest.raises(UsageError, match="staleness=.*4 gradients but 2 values"):
        router.weights(grads, staleness=(0, 1))


def test_combine_accepts_numpy_and_list_weights() -> None:
    grads = _grads(2)
    a = Router(lags=(0, 1)).combine(grads, np.array([0.25, 0.75]))
    b = Router(lags=(0, 1)).combine(grads, [0.25, 0.75])
    assert torch.equal(a["w"], b["w"]) and a["w"].dtype == torch.float32
    with pytest.raises(UsageError, match="expected 2 weights"):
        Router(lags=(0, 1)).combine(grads, [1.0])


def test_mismatched_state_dicts_are_refused_naming_the_tensor() -> None:
    grads = _grads(2)
    other = {"w": grads[1]["w"], "c": grads[1]["b"]}
    with pytest.raises(UsageError, match=r"gradient 1 has other names.*missing \['b'\], extra \['c'\]"):
        Router(lags=(0, 1)).weights([grads[0], other])
    reshaped = {"w": grads[1]["w"].reshape(5, 6), "b": grads[1]["b"]}
    with pytest.raises(UsageError, match="'w' has shape"):
        Router(lags=(0, 1)).combine([grads[0], reshaped], [0.5, 0.5])


def test_flat_tensors_and_combine() -> None:
    flats = [torch.cat([g["w"].reshape(-1), g["b"]]) for g in _grads()]
    router = Router(lags=(0, 1, 2, 3), beta=0.5)
    pi = router.weights(flats)
    out = router.combine(flats, pi)
    assert out.shape == flats[0].shape and out.dtype == torch.float32
    assert torch.allclose(out, sum(float(p) * f for p, f in zip(pi, flats, strict=True)))


def test_combine_state_dicts() -> None:
    grads = _grads(2)
    out = Router(lags=(0, 1)).combine(grads, torch.tensor([0.25, 0.75], dtype=torch.float64))
    assert set(out) == {"w", "b"}
    assert torch.allclose(out["b"], 0.25 * grads[0]["b"] + 0.75 * grads[1]["b"])


def test_beta_zero_is_uniform() -> None:
    pi = Router(lags=(0, 1, 2), beta=0).weights(_grads(3))
    np.testing.assert_allclose(pi, np.full(3, 1 / 3), rtol=0, atol=1e-15)


def test_bad_arguments() -> None:
    with pytest.raises(UsageError, match="beta"):
        Router(beta=-1)
    with pytest.raises(UsageError, match="lags"):
        Router(lags=(0, -2))
    with pytest.raises(UsageError, match="Fano line"):
        Router(line=(1, 2, 3))
    with pytest.raises(UsageError, match="lags=.*3 gradients but 4 values"):
        Router().weights(_grads(3))


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"beta": -1}, "beta=-1"), ({"beta": "hot"}, "beta='hot'"), ({"beta": float("nan")}, "beta=nan"),
    ({"line": (1, 2, 3)}, "line=(1, 2, 3)"), ({"lags": (0, -2)}, "lags=(0, -2)"),
    ({"seed": -1}, "seed=-1"), ({"seed": 2**64}, f"seed={2**64}"), ({"seed": 1.5}, "seed=1.5"),
])
def test_library_errors_name_the_argument_not_a_cli_option(kwargs: dict, name: str) -> None:
    with pytest.raises(UsageError) as info:
        Router(**kwargs)
    assert name in str(info.value) and "--" not in str(info.value), str(info.value)


def test_seed_bounds_are_inclusive() -> None:
    assert Router(seed=0).seed == 0 and Router(seed=2**64 - 1).seed == 2**64 - 1




def test_all_non_finite_is_a_data_error() -> None:
    bad = [{"w": torch.full((3,), float("nan"))} for _ in range(2)]
    with pytest.raises(DataError):
        Router(lags=(0, 1)).weights(bad, reference={"w": torch.zeros(3)})
