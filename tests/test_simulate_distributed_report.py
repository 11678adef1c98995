"""Measured staleness vs prediction (naig.simulate.distributed.report) on hand-made arrival logs."""

import numpy as np
import pytest

from naig.arrivals import ArrivalModel, predict
from naig.simulate.distributed.report import cycle_means, staleness_block, warmup


def test_warmup_until_every_worker_delivered_capped_at_a_tenth() -> None:
    who = np.array([0, 0, 1, 2] + [0, 1, 2] * 20)
    assert warmup(who, 3) == 4
    assert warmup(np.array([0, 1, 2, 0, 1, 2]), 3) == 0  # N/10 = 0
    assert warmup(np.array([0] * 50), 3) == 5  # worker 1 never came: N/10


def test_cycle_means_per_worker() -> None:
    who = np.array([0, 1, 0, 1, 0])
    t = np.array([0.0, 1.0, 2.0, 4.0, 4.0])
    assert cycle_means(who, t, 3)[:2] == [2.0, 3.0]
    assert np.isnan(cycle_means(who, t, 3)[2])


def test_block_prediction_is_predict_at_the_measured_cycles() -> None:
    rng = np.random.default_rng(0)
    n, k = 600, 3
    who = np.tile(np.arange(k), n // k)
    times = np.cumsum(rng.uniform(0.5, 1.5, size=n))
    tau = rng.integers(0, 5, size=n)
    block = staleness_block(tau, who, times, workers=k, window=1, applies=True)
    cycles = cycle_means(who, times, k)
    want = predict(ArrivalModel.from_specs(",".join(f"const:{c!r}" for c in cycles)))
    assert block["predicted"]["mean"] == 2.0 and block["cycle_seconds"] == cycles
    assert block["predicted"]["per_worker"] == pytest.approx(list(want.per_worker), rel=1e-12)
    w0 = block["warmup"]
    assert block["mean"] == pytest.approx(tau[w0:].mean()) and block["max"] == int(tau.max())
    low, high = block["ci95"]["mean"]
    assert low < block["mean"] < high
    assert block["within_ci95"]["mean"] == (low <= 2.0 <= high)
    for key in ("mean", "mean_plus_one", "per_worker", "p_zero", "ci95", "rate"):
        assert key in block


def test_no_prediction_when_it_does_not_apply() -> None:
    who = np.array([0, 1] * 30)
    block = staleness_block(np.ones(60, dtype=np.int64), who, np.arange(60.0), 2, 1, applies=False)
    assert block["predicted"] is None and block["within_ci95"] is None
    assert block["mean"] == 1.0
