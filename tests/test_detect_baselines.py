"""naig.detect.baselines: the NaN check, Megatron's spike check, the norm z-score and CUSUM, calibrated."""

from __future__ import annotations

import math

import numpy as np

from naig.detect import baselines


def _payload(t: int, k: int, seed: int, sd: float = 0.05) -> np.ndarray:
    """(T, K, 16) clean payloads: log-norms normal around a decaying trend, spread ``sd``."""
    rng = np.random.default_rng(seed)
    p = np.zeros((t, k, 16))
    x = -np.arange(t)[:, None] / 100 + sd * rng.standard_normal((t, k))
    p[..., 14] = np.exp(2 * x)
    return p


def test_nan_check_and_megatron() -> None:
    p = _payload(20, 4, 0)
    p[5, 1, 15] = 1.0  # a non-finite count
    p[7, 2, 3] = np.inf  # a non-finite sketch
    p[9, 3, 14] *= 200.0  # ‖g‖ × √200 ≈ 14 > 10 × its running max
    p[11, 0, 14] *= 50.0  # × 7: below the spike rule
    assert [s for s, r in enumerate(baselines.nan_check(p)) if r] == [5, 7]
    named = baselines.megatron(p)
    assert named[5] == (1,) and named[7] == (2,) and named[9] == (3,) and not named[11]


def test_the_z_and_cusum_thresholds_hold_their_rate_on_fresh_clean_runs() -> None:
    """Calibrated at α = 0.01 on 40 runs × 200 steps; on 40 fresh runs within 4 binomial sd (and > 0)."""
    alpha = 0.01
    cal = np.stack([_payload(200, 4, s) for s in range(40)])
    fresh = [_payload(200, 4, 1000 + s) for s in range(40)]
    t, h = baselines.calibrate_z(cal, alpha), baselines.calibrate_cusum(cal, alpha)
    for names in ([baselines.norm_z(p, t) for p in fresh], [baselines.norm_cusum(p, h) for p in fresh]):
        steps = [bool(s) for run in names for s in run[baselines.WARMUP:]]
        rate = float(np.mean(steps))
        assert 0 < rate and abs(rate - alpha) < 4 * math.sqrt(alpha / len(steps)), rate


def test_the_norm_cusum_finds_a_small_persistent_shift_the_z_score_misses() -> None:
    cal = np.stack([_payload(200, 4, s) for s in range(20)])
    t, h = baselines.calibrate_z(cal, 1e-3), baselines.calibrate_cusum(cal, 1e-3)
    p = _payload(80, 4, 99)
    p[50:, 2, 14] *= math.exp(2 * 0.1)  # log-norm + 0.1: two spreads
    cusum = [s for s, r in enumerate(baselines.norm_cusum(p, h)) if 2 in r]
    assert cusum and 50 <= cusum[0] <= 60
    assert not [s for s, r in enumerate(baselines.norm_cusum(p, h)) if r and s < 50]
    assert sum(1 for r in baselines.norm_z(p, t)[50:60] if 2 in r) < 5
