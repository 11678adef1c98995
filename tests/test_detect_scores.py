"""naig.detect.scores: every detector equals a direct float64 computation on fixed gradients."""

import math

import numpy as np
import pytest
import torch

from naig.detect.scores import BLOCKS, DETECTORS, Scorer, StepStats
from naig.metric import DEFAULT_LINE, fano_fisher_metric
from naig.monitor.signals import MonitorSketch

K, SIZES = 6, [("w", 300), ("b", 200)]


def _grads(seed: int = 0) -> torch.Tensor:
    g = torch.randn(K, 500, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    shared = torch.randn(500, generator=torch.Generator().manual_seed(99), dtype=torch.float64)
    g += 0.5 * shared  # a part the ranks share
    g[2] *= 3.0  # one rank stands out
    return g.to(torch.float32)


def _z(x: np.ndarray) -> np.ndarray:
    """Robust z of each x_k against the others: (x − median) / (1.4826 · MAD), floor 1e-6."""
    out = np.empty(len(x))
    for k in range(len(x)):
        r = np.delete(x, k)
        med = np.median(r)
        out[k] = (x[k] - med) / max(1.482602218505602 * np.median(np.abs(r - med)), 1e-6)
    return out


def _reference(g32: torch.Tensor, sketch: MonitorSketch) -> dict[str, np.ndarray]:
    g = g32.double().numpy()
    dense = np.stack([sketch(torch.eye(500, dtype=torch.float64)[i]).numpy() for i in range(500)], axis=1)
    mean = g.mean(0)
    norms = np.linalg.norm(g, axis=1)
    cos = g @ mean / (norms * np.linalg.norm(mean))
    psi = fano_fisher_metric(DEFAULT_LINE)
    ref = {"norm": np.abs(_z(np.log(norms))), "cos": _z(np.arccos(cos)),
           "dist": _z(np.log(((g - mean) ** 2).sum(1)))}
    for r, name in ((1, "14"), (BLOCKS, "56")):
        d = (g - mean) @ dense[:14 * r].T  # (K, 14r) sketched drift
        ref[f"sketch-{name}"] = _z(np.log((d ** 2).sum(1) / r))
        blocks = d.reshape(K, r, 14)
        e = np.einsum("kri,ij,krj->kr", blocks, psi, blocks).mean(1)
        ref[f"energy-{name}"] = _z(np.cbrt(e))
    return ref


def test_scores_equal_a_float64_reference() -> None:
    sketch = MonitorSketch.build(SIZES, seed=3, blocks=BLOCKS)
    g = _grads()
    scorer = Scorer(K, window=3)
    got = scorer.scores(StepStats.of(g, sketch))
    ref = _reference(g, sketch)
    for name, want in ref.items():
        np.testing.assert_allclose(got[DETECTORS.index(name)], want, rtol=1e-9, atol=1e-9, err_msg=name)
    assert (got[DETECTORS.index("nan")] == 0).all()
    assert np.isneginf(got[DETECTORS.index("norm-ind")]).all()  # no history yet: never flagged
    # the monitor's combined rule: in its warm-up (no pooled history yet) only non-finite ranks score
    assert np.isneginf(got[DETECTORS.index("monitor")]).all()
    assert int(np.argmax(got[DETECTORS.index("norm")])) == 2


def test_individual_norm_score_against_own_history() -> None:
    sketch = MonitorSketch.build(SIZES, seed=0, blocks=BLOCKS)
    scorer = Scorer(K, window=3)
    hist = []
    for s in range(3):
        g = _grads(s)
        ln = np.log(np.linalg.norm(g.double().numpy(), axis=1))
        hist.append([ln[k] - np.median(np.delete(ln, k)) for k in range(K)])
        scorer.scores(StepStats.of(g, sketch), commit=True)
    g = _grads(5)
    g[4] *= 10
    got = scorer.scores(StepStats.of(g, sketch))[DETECTORS.index("norm-ind")]
    ln = np.log(np.linalg.norm(g.double().numpy(), axis=1))
    h = np.array(hist)
    for k in range(K):
        y = ln[k] - np.median(np.delete(ln, k))
        med = np.median(h[:, k])
        want = abs(y - med) / max(1.482602218505602 * np.median(np.abs(h[:, k] - med)), 1e-6)
        assert got[k] == pytest.approx(want, rel=1e-9)
    assert int(np.argmax(got)) == 4


def test_with_row_equals_recomputing_every_statistic() -> None:
    sketch = MonitorSketch.build(SIZES, seed=1, blocks=BLOCKS)
    g = _grads()
    bad = g[1] * -7.0
    changed = g.clone()
    changed[1] = bad
    a, b = StepStats.of(g, sketch).with_row(1, bad, sketch), StepStats.of(changed, sketch)
    np.testing.assert_allclose(a.sketches, b.sketches, rtol=1e-12)
    np.testing.assert_allclose(a.gram, b.gram, rtol=1e-12)
    np.testing.assert_allclose(a.sq_norms, np.diag(b.gram), rtol=1e-12)
    scorer = Scorer(K, window=3)
    np.testing.assert_allclose(scorer.scores(a), scorer.scores(b), rtol=1e-9)


def test_a_nonfinite_rank_is_inf_everywhere_and_the_others_stay_finite() -> None:
    sketch = MonitorSketch.build(SIZES, seed=1, blocks=BLOCKS)
    g = _grads()
    g[3, 7] = math.nan
    s = Scorer(K, window=3).scores(StepStats.of(g, sketch))
    assert s[0, 3] == 1 and (np.delete(s[0], 3) == 0).all()
    assert np.isposinf(s[1:, 3]).all()
    others = np.delete(s[1:], 3, axis=1)
    rows = [i for i, d in enumerate(DETECTORS[1:]) if d not in ("norm-ind", "monitor")]  # no history yet
    assert np.isfinite(others[rows]).all()
