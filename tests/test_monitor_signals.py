"""naig.monitor.signals against a direct single-process float64 computation on K gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from naig.distributed.ddp import energies_to_mean
from naig.energy import energy
from naig.errors import UsageError
from naig.metric import fano_fisher_metric
from naig.monitor.signals import (
    MonitorSketch,
    NoiseScaleAverage,
    noise_scale,
    pack,
    payload_size,
    rank_signals,
    unpack,
)
from naig.sketch import sketch_state_dict

SHAPES = {"layer.weight": (6, 5), "layer.bias": (5,), "head.weight": (3, 5)}
N = sum(math.prod(s) for s in SHAPES.values())


def _grads(k: int, seed: int, noise: float = 1.0) -> np.ndarray:
    """(K, n) float64: a shared direction plus independent noise per rank."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal(N) + noise * rng.standard_normal((k, N))


def _state(flat: np.ndarray) -> dict[str, np.ndarray]:
    out, i = {}, 0
    for name, shape in SHAPES.items():
        out[name] = flat[i:i + math.prod(shape)].reshape(shape)
        i += math.prod(shape)
    return out


def _sketches(g: np.ndarray, seed: int = 0, blocks: int = 1) -> np.ndarray:
    """S g_k by the project's numpy sketch body (an independent path from the torch one)."""
    return np.stack([np.concatenate([sketch_state_dict(_state(row), seed + r, impl="numpy")
                                     for r in range(blocks)]) for row in g])


def _direct(g: np.ndarray) -> dict:
    """Exact float64 quantities of K gradients against their mean."""
    mean = g.mean(axis=0)
    norms = np.linalg.norm(g, axis=1)
    return {"sq": (g * g).sum(1), "dots": g @ mean, "dists": ((g - mean) ** 2).sum(1),
            "cos": g @ mean / (norms * np.linalg.norm(mean)), "mean_sq": float(mean @ mean),
            "rel": norms / np.median(norms)}


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_exact_statistics_give_the_direct_values(k: int) -> None:
    g = _grads(k, seed=k)
    d = _direct(g)
    s = _sketches(g)
    sig = rank_signals(s, d["sq"], np.zeros(k), dots=d["dots"], sq_dists=d["dists"], batch=4)
    np.testing.assert_allclose(sig.cos, np.clip(d["cos"], -1, 1), rtol=1e-12)
    np.testing.assert_allclose(sig.sq_dist, d["dists"], rtol=1e-12)
    np.testing.assert_allclose(sig.rel_norm, d["rel"], rtol=1e-12)
    assert sig.mean_sq_norm == pytest.approx(d["mean_sq"], rel=1e-12)
    assert {n: sig.kind(n) for n in ("cos", "sq_dist", "mean_sq_norm", "noise", "energy")} == {
        "cos": "exact", "sq_dist": "exact", "mean_sq_norm": "exact", "noise": "exact", "energy": "sketch"}
    psi = fano_fisher_metric()
    np.testing.assert_allclose(sig.energy, energy(s - s.mean(0), psi), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(sig.energy, energies_to_mean(torch.from_numpy(s), torch.from_numpy(psi)),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_sketch_estimates_are_the_stated_formulas(k: int) -> None:
    g = _grads(k, seed=10 + k)
    d = _direct(g)
    s = _sketches(g, blocks=2)
    sig = rank_signals(s, d["sq"], np.zeros(k))
    drift = s - s.mean(0)
    np.testing.assert_allclose(sig.sq_dist, (drift ** 2).sum(1) / 2, rtol=1e-12, atol=1e-12)
    mean_sq = d["sq"].mean() - ((drift ** 2).sum(1) / 2).mean()
    assert sig.mean_sq_norm == pytest.approx(mean_sq, rel=1e-12)
    sbar = s.mean(0)
    np.testing.assert_allclose(sig.cos, np.clip(s @ sbar / (np.linalg.norm(s, axis=1) * np.linalg.norm(sbar)),
                                                -1, 1), rtol=1e-12)
    blocks = drift.reshape(k, 2, 14)
    np.testing.assert_allclose(sig.energy, energy(blocks, fano_fisher_metric()).mean(1),
                               rtol=1e-12, atol=1e-12)
    assert sig.kind("cos") == sig.kind("sq_dist") == sig.kind("noise") == "sketch"
    assert sig.kind("sq_norm") == sig.kind("rel_norm") == "exact"


@pytest.mark.parametrize("blocks", [1, 4])
def test_sketched_distance_is_unbiased_with_the_stated_spread(blocks: int) -> None:
    """Over 300 sketch seeds the estimate of ‖g_k − ḡ‖² has mean 1 and relative std √(2/m) (m = 14R).

    Measured: m = 14 → std 0.35, m = 56 → 0.18, m = 112 → 0.13 (stated: 0.378, 0.189, 0.134).
    """
    g = _grads(3, seed=3)
    true = _direct(g)["dists"]
    flat = torch.from_numpy(g)
    layout = [(n, math.prod(s)) for n, s in SHAPES.items()]
    ratios = []
    for seed in range(300):
        sk = MonitorSketch.build(layout, seed=1000 * seed, blocks=blocks)
        s = torch.stack([sk(row) for row in flat]).numpy()
        ratios.append(rank_signals(s, _direct(g)["sq"], np.zeros(3)).sq_dist / true)
    r = np.array(ratios)
    stated = math.sqrt(2 / (14 * blocks))
    assert abs(r.mean() - 1) < 4 * stated / math.sqrt(r.size)  # unbiased (4 standard errors)
    assert r.std() == pytest.approx(stated, rel=0.15)


def test_a_nan_rank_is_flagged_and_the_others_use_the_finite_mean() -> None:
    g = _grads(4, seed=5)
    s, sq = _sketches(g), (g * g).sum(1)
    s[2, 3], sq[2] = np.nan, np.nan
    d = _direct(g)
    sig = rank_signals(s, sq, np.array([0, 0, 7, 0]), dots=d["dots"], sq_dists=d["dists"])
    assert sig.usable.tolist() == [True, True, False, True]
    assert math.isnan(sig.cos[2]) and math.isnan(sig.energy[2]) and math.isnan(sig.rel_norm[2])
    assert sig.kind("cos") == "sketch"  # the exact statistics need every rank finite
    ok = [0, 1, 3]
    drift = s[ok] - s[ok].mean(0)
    np.testing.assert_allclose(sig.sq_dist[ok], (drift ** 2).sum(1), rtol=1e-12)
    np.testing.assert_allclose(sig.rel_norm[ok], np.sqrt(sq[ok]) / np.median(np.sqrt(sq[ok])), rtol=1e-12)
    dead = rank_signals(np.full((2, 14), np.nan), np.full(2, np.inf), np.array([1, 1]))
    assert not dead.usable.any() and np.isnan(dead.cos).all() and math.isnan(dead.noise.b_simple)


def test_one_and_two_ranks() -> None:
    g = _grads(1, seed=1)
    sig = rank_signals(_sketches(g), (g * g).sum(1), np.zeros(1))
    assert sig.cos[0] == pytest.approx(1.0) and sig.sq_dist[0] == 0 and sig.energy[0] == 0
    assert sig.rel_norm[0] == 1.0 and math.isnan(sig.noise.b_simple)
    g = _grads(2, seed=2)
    sig = rank_signals(_sketches(g), (g * g).sum(1), np.zeros(2))
    assert sig.energy[0] == pytest.approx(sig.energy[1], rel=1e-12)  # d_0 = −d_1 against the mean
    assert sig.sq_dist[0] == pytest.approx(sig.sq_dist[1], rel=1e-12)


def test_noise_scale_is_mccandlish_appendix_a() -> None:
    g = _grads(4, seed=9)
    d = _direct(g)
    ns = noise_scale(d["sq"], d["mean_sq"], batch=8)
    small, big, b_small, b_big = d["sq"].mean(), d["mean_sq"], 8, 32
    g2 = (b_big * big - b_small * small) / (b_big - b_small)
    trace = (small - big) / (1 / b_small - 1 / b_big)
    assert (ns.sq_grad, ns.trace, ns.b_simple) == pytest.approx((g2, trace, trace / g2), rel=1e-12)


def test_noise_scale_estimates_the_true_values_on_average() -> None:
    """Per-example gradients G + N(0, σ²I) in n dims: tr Σ = nσ², |G|² known; b = 4, K = 4."""
    rng = np.random.default_rng(0)
    n, k, b, sigma = 200, 4, 4, 0.5
    big = rng.standard_normal(n) * 0.1
    avg, g2s, traces = NoiseScaleAverage(decay=0.99), [], []
    for _ in range(3000):
        g = big + sigma * rng.standard_normal((k, n)) / math.sqrt(b)
        d = _direct(g)
        sig = rank_signals(np.zeros((k, 14)), d["sq"], np.zeros(k), dots=d["dots"], sq_dists=d["dists"],
                           batch=b)
        g2s.append(sig.noise.sq_grad)
        traces.append(sig.noise.trace)
        avg.update(sig.noise)
    assert np.mean(traces) == pytest.approx(n * sigma ** 2, abs=4 * np.std(traces) / np.sqrt(3000))
    assert np.mean(g2s) == pytest.approx(big @ big, abs=4 * np.std(g2s) / np.sqrt(3000))
    truth = n * sigma ** 2 / (big @ big)
    assert avg.b_simple == pytest.approx(truth, rel=0.5)  # an EMA of ~200 noisy steps (measured 27.07, 27.05)


def test_pack_and_unpack() -> None:
    x = torch.tensor([3.0, -4.0, float("nan"), float("inf"), 1.0], dtype=torch.float32)
    sk = MonitorSketch.build([("w", 5)], seed=0, blocks=2)
    p = pack(x, sk)
    assert p.dtype == torch.float64 and p.shape == (payload_size(2),) == (30,)
    s, sq, bad = unpack(p.reshape(1, -1))
    assert bad.tolist() == [2] and math.isnan(sq[0]) and s.shape == (1, 28)
    clean = torch.tensor([3.0, -4.0], dtype=torch.bfloat16)
    p = pack(clean, MonitorSketch.build([("w", 2)]))
    assert p[-2].item() == 25.0 and p[-1].item() == 0.0
    np.testing.assert_array_equal(p[:14].numpy(), sketch_state_dict({"w": clean.float().numpy()}))


@settings(max_examples=40, deadline=None)
@given(k=st.integers(2, 6), seed=st.integers(0, 10_000), c=st.floats(1e-3, 1e3), perm_seed=st.integers(0, 99))
def test_common_scale_and_rank_order_do_not_change_the_signals(k: int, seed: int, c: float,
                                                               perm_seed: int) -> None:
    g = _grads(k, seed)
    s, sq = _sketches(g), (g * g).sum(1)
    base = rank_signals(s, sq, np.zeros(k), batch=2)
    scaled = rank_signals(c * s, c * c * sq, np.zeros(k), batch=2)
    np.testing.assert_allclose(scaled.cos, base.cos, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(scaled.rel_norm, base.rel_norm, rtol=1e-9)
    np.testing.assert_allclose(scaled.sq_dist, c * c * base.sq_dist, rtol=1e-9)
    if np.isfinite(base.noise.b_simple):
        assert scaled.noise.b_simple == pytest.approx(base.noise.b_simple, rel=1e-6)
    perm = np.random.default_rng(perm_seed).permutation(k)
    moved = rank_signals(s[perm], sq[perm], np.zeros(k), batch=2)
    np.testing.assert_allclose(moved.energy, base.energy[perm], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(moved.cos, base.cos[perm], rtol=1e-9)


@pytest.mark.parametrize("kwargs, field", [
    ({"sketches": np.zeros((2, 13))}, "sketches"),
    ({"sketches": np.zeros(14)}, "sketches"),
    ({"sq_norms": np.zeros(3)}, "sq_norms"),
    ({"nonfinite": np.zeros(1)}, "nonfinite"),
    ({"dots": np.zeros(2)}, "dots"),
    ({"dots": np.zeros(3), "sq_dists": np.zeros(3)}, "dots"),
    ({"batch": 0}, "batch"),
    ({"batch": float("nan")}, "batch"),
    ({"line": (1, 2, 3)}, "line"),
    ({"reference": np.ones(2)}, "reference"),
])
def test_bad_arguments_are_usage_errors_naming_them(kwargs: dict, field: str) -> None:
    args = {"sketches": np.zeros((2, 14)), "sq_norms": np.ones(2), "nonfinite": np.zeros(2), **kwargs}
    with pytest.raises(UsageError) as err:
        rank_signals(args.pop("sketches"), args.pop("sq_norms"), args.pop("nonfinite"), **args)
    assert err.value.field == field


def test_bad_blocks_and_decay() -> None:
    with pytest.raises(UsageError, match="blocks"):
        MonitorSketch.build([("w", 3)], blocks=0)
    with pytest.raises(UsageError, match="seed"):
        MonitorSketch.build([("w", 3)], seed=2 ** 64 - 1, blocks=2)
    with pytest.raises(UsageError, match="decay"):
        NoiseScaleAverage(decay=1.0)
