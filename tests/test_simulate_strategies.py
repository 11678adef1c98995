"""Each combination rule, checked by hand on tiny tensors (naig.simulate.strategies)."""

import math

import numpy as np
import pytest
import torch

from naig.energy import energy
from naig.errors import UsageError
from naig.gibbs import gibbs_weights
from naig.simulate.strategies import STRATEGIES, Batch, Strategy, StrategyOptions, make_strategy
from naig.sketch import sketch_state_dict
from naig.sketch.torch_sketch import TorchSketch

G = torch.tensor([[1.0, 2.0, 0.0], [3.0, -2.0, 4.0], [0.0, 0.0, 2.0]], dtype=torch.float64)
LAGS = torch.tensor([5, 0, 2])
THETA = torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64)
STALE = torch.tensor([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0], [1.0, 0.5, 1.0]], dtype=torch.float64)
SKETCH = TorchSketch.build([("p", 3)], seed=0)


def _combine(name: str, **opts: object) -> tuple[torch.Tensor, torch.Tensor]:
    strategy = make_strategy(name, StrategyOptions(sketch=SKETCH, **opts))  # type: ignore[arg-type]
    update = strategy.combine(Batch(G, LAGS, torch.arange(3), THETA, STALE.clone()))
    assert update.lr_scale == 1.0
    return update.grad, update.weights


def test_registry_holds_the_six_rules() -> None:
    assert set(STRATEGIES) == {"sync", "hogwild", "naig", "staleness", "dc-asgd", "naig-exact"}
    assert all(issubclass(c, Strategy) and c.name == n for n, c in STRATEGIES.items())


def test_unknown_strategy_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="strategies='fast': unknown strategy") as info:
        make_strategy("fast")
    assert info.value.field == "strategies"


@pytest.mark.parametrize("name", ["hogwild", "sync"])
def test_uniform_mean(name: str) -> None:
    g, pi = _combine(name)
    assert torch.allclose(g, torch.tensor([4 / 3, 0.0, 2.0], dtype=torch.float64))
    assert torch.allclose(pi, torch.full((3,), 1 / 3))


def test_sync_ignores_lags_and_hogwild_uses_them() -> None:
    assert STRATEGIES["sync"].uses_lags is False
    assert STRATEGIES["hogwild"].uses_lags is True


def test_staleness_scales_by_one_over_max_one_tau() -> None:
    g, pi = _combine("staleness")
    expected = (G[0] / 5 + G[1] / 1 + G[2] / 2) / 3
    assert torch.allclose(g, expected)
    assert torch.allclose(pi, torch.tensor([1 / 15, 1 / 3, 1 / 6], dtype=torch.float64))


def test_dc_asgd_term() -> None:
    g, pi = _combine("dc-asgd", dc_lambda=0.5)
    corrected = G + 0.5 * G * G * (THETA - STALE)
    assert torch.allclose(g, corrected.mean(0))
    # by hand, worker 0: [1 + .5*1*1, 2 + .5*4*0, 0] = [1.5, 2, 0]
    assert torch.allclose(corrected[0], torch.tensor([1.5, 2.0, 0.0], dtype=torch.float64))
    assert torch.allclose(pi, torch.full((3,), 1 / 3, dtype=torch.float32))


def test_naig_exact_energy_formula_and_weights() -> None:
    g, pi = _combine("naig-exact", beta=0.1)
    d2 = ((G - G[1]) ** 2).sum(1)  # reference: worker 1 has the min lag
    e = (8 / 3) * (4 / 14) * d2
    w = np.exp(-0.1 * e.numpy())
    assert np.allclose(pi.numpy(), w / w.sum())
    assert math.isclose(float(pi.sum()), 1.0)
    assert torch.allclose(g, (pi[:, None] * G).sum(0))


def test_naig_uses_the_spec_sketch_and_metric() -> None:
    g, pi = _combine("naig", beta=0.05)
    sk = np.stack([sketch_state_dict({"p": row.numpy()}) for row in G])
    e = energy(sk - sk[1])
    assert np.allclose(pi.numpy(), gibbs_weights(e, 0.05))
    assert math.isclose(float(pi.sum()), 1.0) and pi.dtype == torch.float64
    assert torch.allclose(g, (pi[:, None] * G).sum(0))


def test_naig_reference_has_largest_weight_and_auto_beta() -> None:
    _, pi = _combine("naig")
    assert int(pi.argmax()) == 1 or math.isclose(float(pi.max()), float(pi[1]))


def test_naig_beta_zero_is_hogwild() -> None:
    g, pi = _combine("naig", beta=0.0)
    assert torch.allclose(pi, torch.full((3,), 1 / 3, dtype=torch.float64))
    assert torch.allclose(g, G.mean(0))


def test_naig_needs_a_sketch() -> None:
    with pytest.raises(ValueError, match="sketch"):
        make_strategy("naig", StrategyOptions())


@pytest.mark.parametrize("name", ["naig", "naig-exact"])
def test_gibbs_strategies_do_not_raise_on_all_non_finite_gradients(name: str) -> None:
    sketch = TorchSketch.build([("flat", 5)], 0)
    strategy = make_strategy(name, StrategyOptions(sketch=sketch))
    grads = torch.full((3, 5), float("nan"))
    batch = Batch(grads, torch.tensor([0, 1, 2]), torch.arange(3), torch.zeros(5), torch.zeros(3, 5))
    g_hat, pi = strategy.combine(batch).grad, strategy.combine(batch).weights
    assert torch.allclose(pi, torch.full((3,), 1 / 3, dtype=torch.float64))
    assert torch.isnan(g_hat).all()  # the caller sees the divergence
