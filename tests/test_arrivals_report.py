"""Measured against predicted: the laws within their 95% intervals, and the JSON document
(docs/design.md §10)."""

import json

import numpy as np
import pytest

from naig.arrivals import (
    SCHEMA_VERSION,
    ArrivalModel,
    chi_square_gof,
    measure,
    predict,
    simulate_arrivals,
    staleness_report,
    warmup_length,
)


@pytest.mark.parametrize("mode", ["blocking", "shared-memory"])
def test_per_worker_formula_within_intervals(mode: str) -> None:
    m = ArrivalModel.from_specs("exp:0.5,exp:1,exp:2,exp:4", mode=mode)
    got, want = measure(simulate_arrivals(m, 200_000, seed=0)), predict(m).per_worker
    for e, v in zip(got.per_worker, want, strict=True):
        assert e.contains(v), (e, v)


def test_per_worker_formula_for_other_laws_and_delays() -> None:
    m = ArrivalModel.from_specs("gamma:0.5:3,const:1,shifted-exp:2:1,lognormal:4:0.5", uplink="exp:0.2",
                                downlink="const:0.1")
    got, want = measure(simulate_arrivals(m, 200_000, seed=0)), predict(m).per_worker
    for e, v in zip(got.per_worker, want, strict=True):
        assert e.contains(v), (e, v)


@pytest.mark.parametrize("k", [2, 8])
def test_iid_exponential_staleness_is_geometric(k: int) -> None:
    m = ArrivalModel.from_specs("exp:1", workers=k)
    tr = simulate_arrivals(m, 100_000, seed=0)
    gof = chi_square_gof(tr.staleness[warmup_length(tr):], predict(m).pmf)
    assert gof.p_value > 0.01 and gof.dof >= k, gof
    got = measure(tr)
    assert got.p_zero.contains(1 / k) and got.variance.contains(k * (k - 1))


def test_gamma_staleness_is_not_geometric() -> None:
    """The test has power: gamma compute (shape 4) gives a visibly different staleness law."""
    m = ArrivalModel.from_specs("gamma:1:4", workers=8)
    tr = simulate_arrivals(m, 100_000, seed=0)
    geometric = predict(ArrivalModel.from_specs("exp:1", workers=8)).pmf
    assert chi_square_gof(tr.staleness, geometric).p_value < 1e-6


def test_littles_law_in_blocking_mode() -> None:
    m = ArrivalModel.from_specs("gamma:1:2", workers=6, uplink="exp:0.5")
    r = staleness_report(m, 50_000, rounds=500)
    assert r.within()["little"] and r.within()["age"]
    assert r.little == pytest.approx(5, abs=0.01)


def test_one_worker_is_never_stale() -> None:
    r = staleness_report(ArrivalModel.from_specs("exp:1", workers=1), 1_000, rounds=100)
    assert r.measured.mean.value == 0 and r.measured.p_zero.value == 1 and r.predicted.p_zero == 1


def test_json_document() -> None:
    m = ArrivalModel.from_specs("exp:0.5,exp:1,exp:2,exp:4")
    doc = json.loads(json.dumps(staleness_report(m, 20_000, seed=1, params=1000, rounds=500).to_dict()))
    assert doc["schema_version"] == SCHEMA_VERSION == 2
    s = doc["staleness"]
    for block in (s["measured"], s["predicted"]):
        assert {"mean", "mean_plus_one", "per_worker", "p_zero", "ci95", "rate"} <= set(block)
        assert len(block["per_worker"]) == 4 and block["mean_plus_one"] == pytest.approx(block["mean"] + 1)
    ci = s["measured"]["ci95"]
    assert ci["mean"][0] < s["measured"]["mean"] < ci["mean"][1] and len(ci["per_worker"]) == 4
    assert s["predicted"]["ci95"] is None and s["predicted"]["p_zero"] is not None
    assert sum(s["histogram"]["counts"]) == 20_000 - s["measured"]["warmup"]
    assert doc["bandwidth"]["gradient_bytes"] == 4000 and doc["bandwidth"]["sketch_bytes"] == 56
    assert doc["bandwidth"]["predicted"]["up_gradient"] == pytest.approx(3.75 * 4000)
    assert doc["config"]["compute"] == ["exp:0.5", "exp:1", "exp:2", "exp:4"] and doc["config"]["seed"] == 1
    assert doc["round_time"]["predicted"] == pytest.approx(doc["round_time"]["measured"], rel=0.1)


def test_predictions_that_do_not_apply_are_null() -> None:
    m = ArrivalModel.from_specs("exp:1", workers=4, uplink="exp:1", mode="non-blocking")
    doc = staleness_report(m, 5_000, rounds=200).to_dict()
    pred, within = doc["staleness"]["predicted"], doc["staleness"]["within_ci95"]
    assert pred["mean"] is None and pred["per_worker"] is None and pred["p_zero"] is None
    assert within["mean"] is None and within["per_worker"] is None and pred["rate"] == pytest.approx(4.0)
    assert doc["staleness"]["histogram"]["predicted"] is None and doc["round_time"]["predicted"] is None


def test_same_seed_same_document() -> None:
    m = ArrivalModel.from_specs("gamma:1:2,exp:1,const:1", uplink="exp:0.1")
    a, b = (json.dumps(staleness_report(m, 10_000, seed=5, rounds=300).to_dict()) for _ in range(2))
    assert a == b
    assert a != json.dumps(staleness_report(m, 10_000, seed=6, rounds=300).to_dict())


def test_warmup_is_the_start_up() -> None:
    tr = simulate_arrivals(ArrivalModel.from_specs("const:1", workers=6), 100)
    assert warmup_length(tr) == 6 and measure(tr).mean.interval == [5.0, 5.0]
    assert np.all(measure(tr, warmup=0).histogram[:5] == 1)
