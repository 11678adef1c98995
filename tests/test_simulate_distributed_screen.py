"""Sketch-first weights (naig.simulate.distributed.screen) against naig's definitions, by hand."""

import math

import numpy as np
import pytest
import torch

from naig.gibbs import gibbs_weights
from naig.metric import fano_fisher_metric
from naig.simulate.distributed.screen import SketchScreen

PSI = fano_fisher_metric((1, 2, 4))


def _e(d: np.ndarray) -> float:
    return float(d @ PSI @ d)


def test_single_follows_the_ema_reference_and_auto_beta() -> None:
    rng = np.random.default_rng(0)
    s = rng.normal(size=(4, 14))
    rule = SketchScreen("auto")
    ref, hist, got, want = None, [], [], []
    for x in s:
        got.append(rule.single(torch.from_numpy(x).float()))
        x32 = torch.from_numpy(x).float().double().numpy()  # the wire carries float32
        ref = x32.copy() if ref is None else ref
        e = _e(x32 - ref)
        hist += [e] if e > 0 else []
        beta = 1.0 / float(np.median(hist)) if hist else 1.0
        want.append(math.exp(-beta * e))
        ref = 0.9 * ref + 0.1 * x32
    assert got == pytest.approx(want, rel=1e-12)
    assert got[0] == 1.0  # the first arrival is its own reference


def test_unfetched_arrivals_still_move_the_reference() -> None:
    """Sketch-first saves the fetch, not the bookkeeping: w < 0.01 still updates r and the history."""
    rule = SketchScreen(beta=1.0)
    rule.single(torch.zeros(14))
    far = torch.zeros(14)
    far[4] = 5.0
    w = rule.single(far)
    assert 0 < w < 0.01 and not SketchScreen.fetch(w, 1)
    assert rule.ema.point[4].item() == pytest.approx(0.5)  # 0.9·0 + 0.1·5


def test_non_finite_sketch_weighs_zero_and_changes_nothing() -> None:
    rule = SketchScreen("auto")
    rule.single(torch.ones(14))
    before = rule.ema.point.clone()
    assert rule.single(torch.full((14,), math.nan)) == 0.0
    assert torch.equal(rule.ema.point, before) and len(rule.ema.history) == 0


def test_window_is_gibbs_against_the_freshest() -> None:
    rng = np.random.default_rng(1)
    s = rng.normal(size=(3, 14))
    pi = SketchScreen(beta=0.3).window(torch.from_numpy(s), staleness=[2, 1, 1], workers=[0, 4, 2])
    ref = s[2]  # τ = 1 ties between workers 4 and 2: the lower worker index wins
    want = gibbs_weights(np.array([_e(x - ref) for x in s]), 0.3)
    assert pi == pytest.approx(want, rel=1e-12)
    nan = s.copy()
    nan[0] = np.nan
    pi = SketchScreen(beta=0.3).window(torch.from_numpy(nan), staleness=[2, 1, 1], workers=[0, 4, 2])
    assert pi[0] == 0.0 and pi.sum() == pytest.approx(1.0)


def test_fetch_threshold() -> None:
    assert SketchScreen.fetch(0.01, 1) and not SketchScreen.fetch(0.0099, 1)
    assert SketchScreen.fetch(0.0025, 4) and not SketchScreen.fetch(0.0024, 4)
