"""Each combination rule, checked by hand on tiny tensors (naig.simulate.strategies)."""

import math

import numpy as np
import pytest
import torch

from naig.energy import energy
from naig.errors import UsageError
from naig.gibbs import gibbs_weights
from naig.simulate.strategies import MODES, STRATEGIES, Batch, Strategy, StrategyOptions, make_strategy
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
    assert update.correction is None or name in ("dc-asgd", "dc-asgd-a", "gap-aware")
    return update.grad, update.weights


RULES = {"sync", "hogwild", "naig", "staleness", "dc-asgd", "naig-exact", "fresh-only", "drop-stale",
         "naig-blind", "staleness-lr", "dc-asgd-a", "gap-aware", "median", "trimmed-mean", "krum",
         "multi-krum", "centered-clip"}


def test_registry_holds_every_rule() -> None:
    assert set(STRATEGIES) == RULES
    assert all(issubclass(c, Strategy) and c.name == n for n, c in STRATEGIES.items())
    assert all(c.modes and c.modes <= set(MODES) for c in STRATEGIES.values())


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
    update = make_strategy("dc-asgd", StrategyOptions(dc_lambda=0.5)).combine(
        Batch(G, LAGS, torch.arange(3), THETA, STALE.clone()))
    # G⊙G⊙Δθ has one non-zero entry, worker 0's first (1·1·(1 − 0) = 1): ‖G̃ − G‖ = 0.5
    assert update.correction == pytest.approx(0.5 / math.sqrt(38.0), rel=1e-12)  # ‖G‖² = 5 + 29 + 4
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


# ---------------------------------------------------------------- helpers of the new rules

NAN = float("nan")
E1 = math.exp(-1.0)


def _batch(grads: torch.Tensor, lags: list[int] | None = None, workers: list[int] | None = None,
           theta: torch.Tensor | None = None, stale: torch.Tensor | None = None) -> Batch:
    b, n = grads.shape
    theta = torch.zeros(n, dtype=grads.dtype) if theta is None else theta
    stale = theta.expand(b, n).clone() if stale is None else stale.clone()
    return Batch(grads, torch.tensor(lags or [0] * b), torch.tensor(workers or list(range(b))), theta, stale)


def _make(name: str, **opts: object):
    return make_strategy(name, StrategyOptions(sketch=SKETCH, **opts))  # type: ignore[arg-type]


def test_options_are_checked_with_their_field() -> None:
    for kwargs, field in [(dict(window=0), "window"), (dict(byzantine=-1), "byzantine"),
                          (dict(clip=0.0), "clip"), (dict(clip="big"), "clip"), (dict(mode="sync"), "mode"),
                          (dict(max_staleness=-1), "max_staleness"), (dict(reference="oracle"), "reference"),
                          (dict(lr=0.0), "lr"), (dict(optimizer="rmsprop"), "optimizer")]:
        with pytest.raises(UsageError) as info:
            StrategyOptions(**kwargs)  # type: ignore[arg-type]
        assert info.value.field == field
    assert StrategyOptions(clip="Auto").clip == "auto" and StrategyOptions(clip="2").clip == 2.0
    assert StrategyOptions(mode="arrivals", window=1).resolved_reference == "ema"
    assert StrategyOptions(mode="arrivals", window=4).resolved_reference == "batch"
    assert StrategyOptions().resolved_reference == "batch"


# ---------------------------------------------------------------- each rule in each mode

REFUSED_MODES = {"fresh-only": "arrivals", "drop-stale": "lockstep"}
SMALLEST = {"median": 3, "krum": 3, "multi-krum": 3, "trimmed-mean": 3, "centered-clip": 2}  # at f = 1


@pytest.mark.parametrize("mode,batch", [("lockstep", 4), ("lockstep", 2), ("arrivals", 1), ("arrivals", 2),
                                        ("arrivals", 4)])
@pytest.mark.parametrize("name", sorted(RULES))
def test_each_rule_in_each_mode_is_defined_or_refused(name: str, mode: str, batch: int) -> None:
    arrivals = mode == "arrivals"
    opts = dict(mode=mode, window=batch if arrivals else 1, workers=4 if arrivals else batch)
    options = StrategyOptions(sketch=SKETCH, max_staleness=3, **opts)  # type: ignore[arg-type]
    refused = REFUSED_MODES.get(name) == mode or batch < SMALLEST.get(name, 1)
    if not refused:
        make_strategy(name, options)  # defined: constructs
        return
    with pytest.raises(UsageError, match=f"{mode} mode") as info:
        make_strategy(name, options)
    assert info.value.field == "strategies" and info.value.value == name


def test_refusal_messages_name_the_mode_and_the_fix() -> None:
    with pytest.raises(UsageError, match="not defined in arrivals mode.*drop-stale with `max_staleness`=0"):
        _make("fresh-only", mode="arrivals", window=4)
    with pytest.raises(UsageError, match="window B of at least 3 in arrivals mode"):
        _make("median", mode="arrivals", window=2)
    with pytest.raises(UsageError, match="at least 5") as info:
        _make("trimmed-mean", workers=4, byzantine=2)
    assert info.value.field == "strategies"


def test_ema_reference_is_for_window_one_only() -> None:
    with pytest.raises(UsageError, match="window of 1") as info:
        _make("naig", mode="arrivals", window=4, reference="ema")
    assert info.value.field == "reference"
    _make("naig", mode="arrivals", window=1, reference="batch")  # B = 1 plain ASGD: defined


def test_krum_warns_below_2f_plus_3() -> None:
    warnings = STRATEGIES["krum"].check(StrategyOptions(workers=4, byzantine=1))
    assert len(warnings) == 1 and "2f + 3 = 5" in warnings[0] and "1 neighbour" in warnings[0]
    assert STRATEGIES["multi-krum"].check(StrategyOptions(workers=5, byzantine=1)) == ()
    assert STRATEGIES["hogwild"].check(StrategyOptions(workers=4)) == ()


# ---------------------------------------------------------------- fresh-only, drop-stale

def test_fresh_only_takes_the_least_stale_gradient() -> None:
    g, pi = _combine("fresh-only")
    assert torch.equal(g, G[1]) and pi.tolist() == [0.0, 1.0, 0.0]


def test_reference_ties_go_to_the_lowest_worker_index_not_the_first_row() -> None:
    grads = torch.tensor([[1.0], [2.0], [3.0]])
    update = _make("fresh-only").combine(_batch(grads, lags=[2, 0, 0], workers=[5, 3, 1]))
    assert update.grad.tolist() == [3.0] and update.weights.tolist() == [0.0, 0.0, 1.0]


def test_drop_stale_keeps_tau_at_most_the_bound() -> None:
    s = _make("drop-stale", mode="arrivals", window=3, max_staleness=2)
    u = s.combine(Batch(G, LAGS, torch.arange(3), THETA, STALE))
    assert torch.allclose(u.grad, torch.tensor([1.5, -1.0, 3.0], dtype=torch.float64))
    assert u.weights.tolist() == [0.0, 0.5, 0.5] and u.lr_scale == 1.0
    default = _make("drop-stale", mode="arrivals", window=3, workers=4)  # bound K = 4: drops τ = 5
    assert default.combine(Batch(G, LAGS, torch.arange(3), THETA, STALE)).weights.tolist() == [0.0, 0.5, 0.5]


def test_drop_stale_with_nothing_left_takes_no_step() -> None:
    s = _make("drop-stale", mode="arrivals", window=2, max_staleness=0)
    u = s.combine(_batch(torch.tensor([[NAN, 1.0], [2.0, 3.0]]), lags=[1, 4]))
    assert u.lr_scale == 0.0 and u.grad.tolist() == [0.0, 0.0] and u.weights.tolist() == [0.0, 0.0]


def test_drop_stale_needs_a_bound() -> None:
    with pytest.raises(ValueError, match="max_staleness"):
        _make("drop-stale", mode="arrivals", window=2)


# ---------------------------------------------------------------- naig-blind, naig at window 1

def test_naig_blind_weights_by_hand() -> None:
    g, pi = _combine("naig-blind")
    z = 1 + 2 * E1
    assert torch.allclose(pi, torch.tensor([E1 / z, 1 / z, E1 / z], dtype=torch.float64))
    assert torch.allclose(g, (E1 * G[0] + G[1] + E1 * G[2]) / z)


@pytest.mark.parametrize("name", ["naig", "naig-exact"])
def test_naig_and_naig_blind_agree_when_non_reference_energies_are_equal(name: str) -> None:
    ref = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    d = torch.tensor([0.3, 0.1, -0.7], dtype=torch.float64)
    grads = torch.stack([ref + d, ref, ref - d, ref + d])  # E(d) = E(−d) (sketch linear, E quadratic)
    batch = _batch(grads, lags=[3, 0, 1, 7])
    pi_naig = _make(name).combine(batch).weights
    pi_blind = _make("naig-blind").combine(batch).weights
    assert torch.allclose(pi_naig, pi_blind, rtol=1e-12, atol=0)


def test_naig_exact_window_one_ema_by_hand() -> None:
    s = _make("naig-exact", mode="arrivals", window=1, beta=0.5)
    x = [torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]]), torch.tensor([[2.0, 2.0]])]
    ups = [s.combine(_batch(xi.double(), lags=[3])) for xi in x]
    f = (8 / 3) * (4 / 14)
    r = torch.tensor([1.0, 0.0])  # seeded by the first arrival
    w2 = math.exp(-0.5 * f * 2.0)  # ‖(0,1) − (1,0)‖² = 2
    r = 0.9 * r + 0.1 * torch.tensor([0.0, 1.0])  # (0.9, 0.1)
    w3 = math.exp(-0.5 * f * ((2 - 0.9) ** 2 + (2 - 0.1) ** 2))
    assert [u.lr_scale for u in ups] == pytest.approx([1.0, w2, w3], rel=1e-12)
    assert [float(u.weights[0]) for u in ups] == pytest.approx([1.0, w2, w3], rel=1e-12)
    assert all(torch.equal(u.grad, xi[0].double()) for u, xi in zip(ups, x, strict=True))
    assert torch.allclose(s.ema.point, (0.9 * r + 0.1 * torch.tensor([2.0, 2.0])).double())


def test_naig_window_one_auto_beta_includes_the_current_energy() -> None:
    s = _make("naig-exact", mode="arrivals", window=1)  # auto β
    ref = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    first, second = s.combine(_batch(ref)), s.combine(_batch(ref + torch.tensor([[0.0, 3.0]])))
    assert first.lr_scale == 1.0  # E = 0 against the reference it seeds
    assert second.lr_scale == pytest.approx(E1, rel=1e-12)  # β = 1/E: the only positive energy is E
    blind = _make("naig-blind", mode="arrivals", window=1).combine(_batch(ref))
    assert blind.lr_scale == pytest.approx(E1) and torch.equal(blind.grad, ref[0])


def test_naig_window_one_uses_the_sketch_energy() -> None:
    s = _make("naig", mode="arrivals", window=1, beta=0.05)
    s.combine(_batch(G[1:2], lags=[2]))
    u = s.combine(_batch(G[0:1], lags=[3]))
    sk = np.stack([sketch_state_dict({"p": row.numpy()}) for row in G])
    assert u.lr_scale == pytest.approx(math.exp(-0.05 * float(energy(sk[0] - sk[1]))), rel=1e-12)


def test_naig_window_one_skips_a_nan_arrival_and_keeps_its_reference() -> None:
    s = _make("naig-exact", mode="arrivals", window=1, beta=1.0)
    assert s.combine(_batch(torch.tensor([[NAN, 0.0]]))).lr_scale == 0.0  # nothing to seed with
    s.combine(_batch(torch.tensor([[1.0, 0.0]])))
    u = s.combine(_batch(torch.tensor([[1.0, NAN]])))
    assert u.lr_scale == 0.0 and u.grad.tolist() == [0.0, 0.0] and u.weights.tolist() == [0.0]
    assert s.ema.point.tolist() == [1.0, 0.0] and len(s.ema.history) == 0


# ---------------------------------------------------------------- staleness-lr, dc-asgd-a, gap-aware

def test_staleness_lr_scales_the_learning_rate_not_the_gradient() -> None:
    u = _make("staleness-lr").combine(Batch(G, LAGS, torch.arange(3), THETA, STALE))
    assert torch.allclose(u.grad, G.mean(0))
    assert u.lr_scale == pytest.approx((1 / 5 + 1 + 1 / 2) / 3, rel=1e-12)


def test_dc_asgd_a_by_hand_with_per_worker_mean_squares() -> None:
    s = _make("dc-asgd-a")
    theta = torch.tensor([1.0, 1.0], dtype=torch.float64)
    g0 = torch.tensor([[2.0, -1.0]], dtype=torch.float64)
    u1 = s.combine(_batch(g0, lags=[1], workers=[3], theta=theta, stale=torch.tensor([[0.0, 1.0]])))
    ms = 0.05 * 4.0  # ms_3 = 0.05 g² on the first coordinate (Δθ = 0 on the second)
    expected = 2.0 + 2.0 / math.sqrt(ms + 1e-7) * 4.0 * 1.0
    assert u1.grad.tolist() == pytest.approx([expected, -1.0], rel=1e-12)
    assert u1.correction == pytest.approx(abs(expected - 2.0) / math.sqrt(5.0), rel=1e-12)
    g1 = torch.tensor([[1.0, 3.0]], dtype=torch.float64)
    u2 = s.combine(_batch(g1, lags=[2], workers=[3], theta=theta, stale=torch.tensor([[1.5, 0.0]])))
    ms0, ms1 = 0.95 * ms + 0.05 * 1.0, 0.95 * 0.05 * 1.0 + 0.05 * 9.0
    expected2 = [1.0 + 2.0 / math.sqrt(ms0 + 1e-7) * 1.0 * -0.5,
                 3.0 + 2.0 / math.sqrt(ms1 + 1e-7) * 9.0 * 1.0]
    assert u2.grad.tolist() == pytest.approx(expected2, rel=1e-12)
    u3 = s.combine(_batch(g1, lags=[2], workers=[0], theta=theta, stale=torch.tensor([[1.5, 0.0]])))
    fresh_ms = [0.05 * 1.0, 0.05 * 9.0]  # another worker: its own mean square starts at 0
    assert u3.grad[0] == pytest.approx(1.0 + 2.0 / math.sqrt(fresh_ms[0] + 1e-7) * -0.5, rel=1e-12)


def test_gap_aware_sgd_by_hand() -> None:
    lr = 0.1
    s = _make("gap-aware", optimizer="sgd", lr=lr)
    u = s.combine(Batch(G, LAGS, torch.arange(3), THETA, STALE))
    g = G.numpy()
    v = 0.001 * (0.999**2 * g[0] ** 2 + 0.999 * g[1] ** 2 + g[2] ** 2) / (1 - 0.999**3)
    c = 1 + np.abs(THETA.numpy() - STALE.numpy()) / (lr * (np.sqrt(v) + 1e-8))
    assert np.allclose(u.grad.numpy(), (g / c).mean(0), rtol=1e-12, atol=0)
    assert u.correction == pytest.approx(np.linalg.norm(g / c - g) / np.linalg.norm(g), rel=1e-12)
    assert u.weights.tolist() == pytest.approx([1 / 3] * 3)


def test_gap_aware_adam_counts_the_gap_in_applied_steps() -> None:
    s = _make("gap-aware", optimizer="adam")
    grads = torch.tensor([[2.0, 4.0], [1.0, 1.0]], dtype=torch.float64)
    stale0 = torch.tensor([[0.0, 0.5], [0.0, 0.0]], dtype=torch.float64)
    u0 = s.combine(_batch(grads, lags=[1, 0], theta=torch.zeros(2, dtype=torch.float64), stale=stale0))
    # no step observed yet: a non-zero gap is infinitely many steps (that coordinate → 0), zero gap: C = 1
    assert u0.grad.tolist() == pytest.approx([(2.0 + 1.0) / 2, (0.0 + 1.0) / 2])
    theta1 = torch.tensor([0.2, -0.1], dtype=torch.float64)  # the optimizer moved θ by Δθ = (0.2, −0.1)
    stale1 = torch.tensor([[0.0, 0.4], [0.2, -0.1]], dtype=torch.float64)
    u1 = s.combine(_batch(grads, lags=[1, 0], theta=theta1, stale=stale1))
    c = [1 + 0.2 / 0.2, 1 + 0.5 / 0.1]  # bias-corrected EMA of |Δθ| after one step is |Δθ|
    assert u1.grad.tolist() == pytest.approx([(2.0 / c[0] + 1.0) / 2, (4.0 / c[1] + 1.0) / 2], rel=1e-12)


def test_a_fresh_gradient_is_not_corrected() -> None:
    for name in ("dc-asgd", "dc-asgd-a", "gap-aware"):
        batch = _batch(G, lags=[0, 0, 0], theta=THETA, stale=THETA.expand(3, 3))
        u = _make(name, optimizer="sgd").combine(batch)
        assert u.correction == 0.0 and torch.allclose(u.grad, G.mean(0))


# ---------------------------------------------------------------- robust aggregation

def test_median_by_hand() -> None:
    g, pi = _combine("median")
    # columns: (1, 3, 0) → 1 from row 0; (2, −2, 0) → 0 from row 2; (0, 4, 2) → 2 from row 2
    assert g.tolist() == [1.0, 0.0, 2.0] and pi.tolist() == pytest.approx([1 / 3, 0.0, 2 / 3])


def test_median_of_an_even_batch_averages_the_middle_pair_and_ignores_a_nan_row() -> None:
    grads = torch.tensor([[1.0, 10.0], [NAN, NAN], [3.0, -2.0], [-100.0, 0.0]])
    u = _make("median").combine(_batch(grads))
    assert u.grad.tolist() == [2.0, 5.0]  # (1, 3, −100, NaN) → (1 + 3)/2; (10, −2, 0, NaN) → (0 + 10)/2
    assert u.weights.tolist() == pytest.approx([0.5, 0.0, 0.25, 0.25])


def test_trimmed_mean_by_hand() -> None:
    grads = torch.tensor([[1.0, 5.0], [2.0, NAN], [3.0, 0.0], [4.0, 1.0], [100.0, 2.0]])
    u = _make("trimmed-mean", byzantine=1).combine(_batch(grads))
    assert u.grad.tolist() == pytest.approx([3.0, 8.0 / 3.0], rel=1e-7)  # (2, 3, 4); (1, 2, 5)
    assert u.weights.tolist() == pytest.approx([1 / 6, 1 / 6, 1 / 6, 2 / 6, 1 / 6])
    small = _make("trimmed-mean", byzantine=1).combine(_batch(grads[:2, :1]))  # 2 rows at run time: no trim
    assert small.grad.tolist() == [1.5]


def test_krum_and_multi_krum_by_hand() -> None:
    grads = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [9.0, 9.0]])
    # f = 1, B = 4: 1 neighbour. Squared distances 01:1 02:4 03:162 12:5 13:145 23:130
    k = _make("krum").combine(_batch(grads))
    assert k.grad.tolist() == [0.0, 0.0] and k.weights.tolist() == [1.0, 0.0, 0.0, 0.0]  # tie 0/1 → row 0
    m = _make("multi-krum").combine(_batch(grads))  # m = B − f = 3 best: rows 0, 1, 2
    assert m.grad.tolist() == pytest.approx([1 / 3, 2 / 3])
    assert m.weights.tolist() == pytest.approx([1 / 3] * 3 + [0])
    f0 = _make("krum", byzantine=0).combine(_batch(grads))  # 2 neighbours: 0 → 5, 1 → 6, 2 → 9
    assert f0.grad.tolist() == [0.0, 0.0]


def test_krum_never_picks_a_nan_gradient() -> None:
    grads = torch.tensor([[NAN, 0.0], [1.0, 0.0], [1.5, 0.0], [3.0, 0.0], [2.0, 0.0]])
    k = _make("krum").combine(_batch(grads))  # 2 neighbours: 1 → .25+1, 2 → .25+.25, 4 → .25+1
    assert k.grad.tolist() == [1.5, 0.0]
    m = _make("multi-krum").combine(_batch(grads))  # 4 best of 5: the NaN row is last
    assert m.weights[0] == 0.0 and m.grad.tolist() == pytest.approx([7.5 / 4, 0.0])


def test_centered_clip_by_hand() -> None:
    s = _make("centered-clip")
    grads = torch.tensor([[3.0, 4.0], [0.0, 1.0], [30.0, 40.0]], dtype=torch.float64)
    u1 = s.combine(_batch(grads))  # v = 0; norms 5, 1, 50; c = 5; factors 1, 1, 0.1
    assert u1.grad.tolist() == pytest.approx([2.0, 3.0])
    assert u1.weights.tolist() == pytest.approx([1 / 3, 1 / 3, 1 / 30])
    u2 = s.combine(_batch(torch.tensor([[2.0, 7.0], [5.0, 3.0], [NAN, 0.0]], dtype=torch.float64)))
    # v = (2, 3); deviations (0, 4), (3, 0), NaN → norms 4, 3, ∞; c = 4; factors 1, 1, 0
    assert u2.grad.tolist() == pytest.approx([2.0 + 1.0, 3.0 + 4 / 3])
    fixed = _make("centered-clip", clip=1.0).combine(_batch(grads))  # every deviation clipped to norm 1
    assert fixed.grad.tolist() == pytest.approx([(0.6 + 0.0 + 0.6) / 3, (0.8 + 1.0 + 0.8) / 3])


# ---------------------------------------------------------------- zero weights and NaN gradients

CONTENT_AWARE = ["naig", "naig-exact", "fresh-only", "median", "trimmed-mean", "krum", "multi-krum",
                 "centered-clip"]
CONTENT_BLIND = ["hogwild", "sync", "staleness", "staleness-lr", "naig-blind", "dc-asgd", "dc-asgd-a",
                 "gap-aware"]


def _nan_batch() -> Batch:
    grads = G.clone()
    grads = torch.cat([grads, torch.tensor([[0.5, 1.0, 1.0], [1.0, 1.0, 1.5]], dtype=torch.float64)])
    grads[0] = NAN  # worker 0 (τ = 5, not the reference) sends a NaN gradient
    stale = torch.cat([STALE, STALE[1:]])
    return Batch(grads, torch.tensor([5, 0, 2, 1, 1]), torch.arange(5), THETA, stale)


@pytest.mark.parametrize("name", CONTENT_AWARE)
def test_a_rejected_nan_gradient_does_not_poison_the_update(name: str) -> None:
    u = _make(name, beta=1.0).combine(_nan_batch())
    assert bool(torch.isfinite(u.grad).all()) and float(u.weights[0]) == 0.0


@pytest.mark.parametrize("name", CONTENT_BLIND)
def test_content_blind_rules_apply_a_nan_gradient(name: str) -> None:
    u = _make(name, optimizer="sgd").combine(_nan_batch())
    assert not bool(torch.isfinite(u.grad).all())
