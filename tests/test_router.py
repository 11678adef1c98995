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


def _with_nan_worker(k: int = 3) -> list[dict[str, torch.Tensor]]:
    grads = _grads(k)
    grads[1] = {n: torch.full_like(t, float("nan")) for n, t in grads[1].items()}
    return grads


def test_a_nan_worker_gets_zero_weight_and_does_not_poison_the_combine() -> None:
    grads = _with_nan_worker()
    router = Router(lags=(0, 1, 2))
    pi = router.weights(grads)
    assert pi[1] == 0.0 and math.isclose(float(pi.sum()), 1.0, abs_tol=1e-12)
    out = router.combine(grads, pi)
    for name in out:
        want = float(pi[0]) * grads[0][name] + float(pi[2]) * grads[2][name]
        assert torch.isfinite(out[name]).all(), name
        torch.testing.assert_close(out[name], want, rtol=1e-6, atol=1e-7)
    flats = [torch.cat([g["w"].reshape(-1), g["b"]]) for g in grads]
    assert torch.isfinite(router.combine(flats, router.weights(flats))).all()  # flat tensors alike


def test_gibbs_combine_leaves_zero_weight_rows_out_numpy_and_torch() -> None:
    g = np.array([[1.0, 2.0], [np.nan, np.inf], [3.0, -1.0]])
    pi = np.array([0.25, 0.0, 0.75])
    want = 0.25 * g[0] + 0.75 * g[2]
    np.testing.assert_allclose(naig.combine(pi, g), want, rtol=1e-15)
    torch.testing.assert_close(naig.combine(torch.from_numpy(pi), torch.from_numpy(g)),
                               torch.from_numpy(want), rtol=1e-15, atol=0)
    assert naig.combine(np.zeros(3), g).tolist() == [0.0, 0.0]  # every weight 0: zeros, not NaN


def _model_grads(k: int = 3) -> tuple[torch.nn.Module, list[dict]]:
    """Gradients as the README loop takes them, with an unused parameter (grad None)."""
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"used": torch.nn.Linear(4, 2), "unused": torch.nn.Linear(4, 2)})
    grads = []
    for _ in range(k):
        model.zero_grad(set_to_none=True)
        model["used"](torch.randn(8, 4)).square().mean().backward()
        grads.append({n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()})
    return model, grads


def test_unused_parameters_none_grads_are_zero_gradients() -> None:
    _, grads = _model_grads()
    assert grads[0]["unused.weight"] is None
    router = Router(lags=(0, 1, 2))
    used = [{n: t for n, t in g.items() if t is not None} for g in grads]
    zeros = [{n: torch.zeros(2, 4) if n == "unused.weight" else torch.zeros(2) if t is None else t
              for n, t in g.items()} for g in grads]
    e = router.energies(grads)
    np.testing.assert_array_equal(e, router.energies(used))  # None adds nothing to the sketch
    np.testing.assert_array_equal(e, router.energies(zeros))  # ... exactly as zeros do
    pi = router.weights(grads)
    out = router.combine(grads, pi)
    assert out["unused.weight"] is None and out["unused.bias"] is None  # None everywhere stays None
    torch.testing.assert_close(out["used.weight"], router.combine(used, pi)["used.weight"], rtol=0, atol=0)
    mixed = [grads[0], {**grads[1], "unused.bias": torch.ones(2)}, grads[2]]  # None in some only
    torch.testing.assert_close(router.combine(mixed, pi)["unused.bias"],
                               float(pi[1]) * torch.ones(2), rtol=1e-6, atol=0)


def test_reference_with_other_tensors_is_refused_naming_them() -> None:
    grads = _grads(2)
    router = Router(lags=(0, 1))
    with pytest.raises(UsageError, match=r"reference: .*missing \['b'\], extra \['c'\]"):
        router.energies(grads, reference={"w": grads[0]["w"], "c": grads[0]["b"]})
    with pytest.raises(UsageError, match=r"reference: .*'w' has shape \(5, 6\), expected \(6, 5\)"):
        router.weights(grads, reference={"w": grads[0]["w"].T, "b": grads[0]["b"]})
    with pytest.raises(UsageError, match="reference: mixes a state dict and a tensor"):
        router.energies(grads, reference=torch.zeros(35))


@pytest.mark.parametrize("pi", [[0.5, float("nan")], [1.5, -0.5], [float("inf"), 0.0]])
def test_combine_refuses_nan_inf_and_negative_weights(pi: list[float]) -> None:
    with pytest.raises(UsageError, match=r"^pi: weights must be finite and >= 0"):
        Router(lags=(0, 1)).combine(_grads(2), pi)
    with pytest.raises(UsageError, match=r"^pi: weights must be finite and >= 0"):
        Router(lags=(0, 1)).combine(_grads(2), torch.tensor(pi))


@pytest.mark.parametrize(("call", "field"), [
    (lambda r, g: r.weights(g[0]), "grads"),  # one state dict, not a list
    (lambda r, g: r.weights("abc"), "grads"),
    (lambda r, g: r.weights([np.ones(3), np.ones(3)]), "grads"),  # numpy, not torch
    (lambda r, g: r.weights([{"w": [1.0, 2.0]}, {"w": [1.0, 2.0]}]), "grads"),
    (lambda r, g: r.weights([1.0, 2.0]), "grads"),
    (lambda r, g: r.sketch(3.0), "grads"),
    (lambda r, g: r.energies(g, reference="g0"), "reference"),
    (lambda r, g: r.energies(g, staleness=5), "staleness"),
    (lambda r, g: r.energies(g, staleness=("a", "b")), "staleness"),
    (lambda r, g: r.energies(g, staleness=(0.5, 1.5)), "staleness"),
    (lambda r, g: r.combine(g, "heavy"), "pi"),
    (lambda r, g: r.combine(g, None), "pi"),
    (lambda r, g: r.combine(g, [[0.5, 0.5]]), "pi"),
    (lambda r, g: Router(lags=3), "lags"),
    (lambda r, g: Router(lags=(0, 1.5)), "lags"),
    (lambda r, g: Router(line=5), "line"),
    (lambda r, g: Router(beta=[1]), "beta"),
    (lambda r, g: Router(seed="0"), "seed"),
])
def test_wrong_types_are_usage_errors_naming_the_argument(call, field: str) -> None:
    with pytest.raises(UsageError) as info:
        call(Router(lags=(0, 1)), _grads(2))
    assert info.value.field == field and str(info.value).startswith(field), str(info.value)
    assert "\n" not in str(info.value)


def test_staleness_as_numpy_or_torch_ints_is_accepted() -> None:
    grads = _grads(3)
    router = Router(lags=None)
    want = router.energies(grads, staleness=(2, 0, 1))
    np.testing.assert_array_equal(router.energies(grads, staleness=np.array([2, 0, 1])), want)
    np.testing.assert_array_equal(router.energies(grads, staleness=torch.tensor([2, 0, 1])), want)


def test_all_non_finite_is_a_data_error() -> None:
    bad = [{"w": torch.full((3,), float("nan"))} for _ in range(2)]
    with pytest.raises(DataError):
        Router(lags=(0, 1)).weights(bad, reference={"w": torch.zeros(3)})
