"""naig.detect.measure: delays, wrong namings, false alarms with intervals, replays, the default's choice."""

from __future__ import annotations

import numpy as np
import pytest

from naig.detect.measure import (
    CANDIDATES,
    METHODS,
    choose,
    detection,
    false_alarms,
    monitor_names,
    replays,
    run_all,
    summarise,
)
from naig.detect.sequential import PoolSpec, Record, SequentialConfig
from naig.errors import UsageError
from naig.monitor.detectors import DEFAULT_WARMUP


def _record(onset: int = 30, bad: int = 2, steps: int = 45) -> Record:
    z = np.zeros((steps, 4))
    return Record(np.zeros((steps, 4, 16)), z, z, bad=bad, onset=onset, kind="scale:2")


def test_delay_wrong_ranks_and_alarms_before_the_onset() -> None:
    named = [()] * 45
    named[20] = (1,)          # step 21: before the onset (a false alarm)
    named[31] = (0, 2)        # step 32: the bad rank, with a wrong one
    named[33] = (2,)
    out = detection(named, _record(), horizon=10)
    assert out == {"delay": 2, "wrong": 1, "before": 1}
    assert detection([()] * 45, _record(), 10)["delay"] is None
    s = summarise([out, {"delay": 0, "wrong": 0, "before": 0}, {"delay": None, "wrong": 3, "before": 0}], 10)
    assert (s["p0"], s["p1"], s["p10"], s["median_delay"], s["wrong"]) == (pytest.approx(1 / 3),
                                                                            pytest.approx(1 / 3),
                                                                            pytest.approx(2 / 3), 1.0, 4 / 3)
    assert s["curve"][0] == pytest.approx(1 / 3) and s["curve"][2] == pytest.approx(2 / 3)


def test_false_alarms_count_steps_after_the_warm_up_with_an_exact_interval() -> None:
    runs = [[()] * 100 for _ in range(3)]
    runs[0][3] = (1,)      # in the warm-up: not counted
    runs[1][50] = (0, 2)   # one step, two ranks: one false alarm
    fa = false_alarms(runs, recorded=100)
    assert fa["flagged"] == 1 and fa["steps"] == 3 * (100 - DEFAULT_WARMUP) and fa["recorded_steps"] == 100
    assert fa["low"] < fa["rate"] < fa["high"] and fa["run_length"] == fa["steps"]


def test_replays_are_distinct_fixed_subsets() -> None:
    payload, gram = np.random.default_rng(0).random((5, 6, 16)), np.tile(np.eye(6), (5, 1, 1))
    runs = replays(payload, gram, 4, 100, seed=1)
    assert len(runs) == 15  # C(6, 4): no more distinct subsets
    sets = {tuple(sorted(np.flatnonzero((r.payload[0][:, None] == payload[0][None]).all(-1)) % 6))
            for r in runs}
    assert len(sets) == 15


def test_the_default_is_the_best_candidate_within_the_false_alarm_bound() -> None:
    base = {"false_alarm": {"rate": 1e-3}, "mean_p": 0.5, "median_delays": [1.0]}
    val = {name: dict(base) for name in CANDIDATES}
    names = list(CANDIDATES)
    val[names[1]] = {**base, "mean_p": 0.9, "false_alarm": {"rate": 5e-3}}  # best, but too many alarms
    val[names[2]] = {**base, "mean_p": 0.7}
    assert choose(val, 1e-3) == names[2]


def test_a_tie_on_detection_goes_to_fewer_false_alarms_everywhere_then_to_the_delay() -> None:
    """Only the tied candidates' false alarms on every validation pool are measured; the fewest win
    even against a shorter delay; an equal count leaves it to the delay."""
    base = {"false_alarm": {"rate": 1e-3}, "mean_p": 0.5, "median_delays": [5.0]}
    names = list(CANDIDATES)
    val = {name: dict(base) for name in names}
    val[names[0]] = {**base, "mean_p": 0.8, "median_delays": [2.0]}  # tied, the shortest delay
    val[names[1]] = {**base, "mean_p": 0.8, "median_delays": [4.0]}  # tied, fewer alarms everywhere
    val[names[2]] = {**base, "mean_p": 0.8, "median_delays": [3.0]}  # tied, as few alarms
    asked: list[str] = []

    def everywhere(name: str) -> float:
        asked.append(name)
        return {names[0]: 5.0, names[1]: 1.0, names[2]: 1.0}[name]

    assert choose(val, 1e-3, everywhere) == names[2]
    assert sorted(asked) == sorted(names[:3])
    assert choose(val, 1e-3) == names[0]  # without the measure: the delay decides


def test_the_monitor_path_names_a_non_finite_rank_in_its_warm_up() -> None:
    rec = _record(steps=3)
    rec.payload[..., 14] = 1.0
    rec.payload[1, 3, 15] = 1.0
    assert monitor_names(rec, exact=False, false_alarm=1e-3) == [(), (3,), ()]


def _pool(rng: np.random.Generator, steps: int, m: int) -> tuple[np.ndarray, np.ndarray, None]:
    payload = np.zeros((steps, m, 16))
    payload[..., :14] = rng.standard_normal((steps, 1, 14)) + 0.3 * rng.standard_normal((steps, m, 14))
    payload[..., 14] = 1.0 + 0.05 * rng.random((steps, m))
    return payload, np.tile(np.eye(m), (steps, 1, 1)), None


def test_run_all_reports_the_defaults_false_alarms_on_every_validation_pool() -> None:
    """A validation pool at another batch size than the faults' is measured (every K, the chosen
    default, the configured alpha) and is not one of the test rows; its flags are counted after the
    warm-up over its replays. The run's own K and alpha are measured beside the grid's, with every
    method at them (until 2026-12-08 a K or alpha outside the grid had no row, and no baseline did)."""
    rng = np.random.default_rng(0)
    pools_spec = (PoolSpec(8, "calibration", 0, 30), PoolSpec(8, "validation", 1, 30),
                  PoolSpec(64, "validation", 5, 40), PoolSpec(8, "test", 2, 30))
    cfg = SequentialConfig(faults=("scale:2",), validation=1, test=1, pools=pools_spec, replays=3,
                           fa_ranks=(3,), fa_rates=(1e-4,), false_alarm=1e-3, pool_ranks=5)
    assert cfg.fa_ranks == (3, 4) and cfg.fa_rates == (1e-3, 1e-4)
    pools = {(p.batch, p.role, p.seed): _pool(rng, p.steps, 5) for p in pools_spec}
    rec = Record(*(_pool(rng, 45, 4)[0], np.zeros((45, 4)), np.zeros((45, 4))), bad=1, onset=41,
                 kind="scale:2")
    doc = run_all(cfg, {"validation": [rec], "test": [rec]}, pools)
    rows = {(r["batch"], r["ranks"]): r for r in doc["validation_false_alarms"]}
    assert set(rows) == {(8, 3), (8, 4), (64, 3), (64, 4)}
    assert rows[(64, 4)]["recorded_steps"] == 40 and rows[(64, 4)]["runs"] == 3
    assert rows[(64, 4)]["steps"] == 3 * (40 - DEFAULT_WARMUP) and rows[(64, 3)]["alpha"] == 1e-3
    assert {r["batch"] for r in doc["false_alarms"]} == {8}  # test pools only
    test_rows = {(r["ranks"], r["alpha"], r["method"]) for r in doc["false_alarms"]}
    assert {m for k, a, m in test_rows if (k, a) == (4, 1e-3)} == set(METHODS)
    assert {(k, a) for k, a, m in test_rows if m == "monitor"} == {(3, 1e-3), (3, 1e-4), (4, 1e-3), (4, 1e-4)}
    tied = [n for n, v in doc["validation"].items() if "false_alarms_everywhere" in v]
    if tied:  # the tie-break measured the chosen default among them: the same rows
        assert doc["default"] in tied
        assert doc["validation"][doc["default"]]["false_alarms_everywhere"] == doc["validation_false_alarms"]


def test_a_run_on_more_ranks_than_the_clean_pools_is_refused() -> None:
    """Its false alarms could not be replayed from the pools (of ``pool_ranks`` ranks): refused in one
    line naming --ranks, before anything is recorded."""
    with pytest.raises(UsageError) as err:
        SequentialConfig(ranks=11)
    assert err.value.field == "ranks" and "at most 10: the false alarms" in str(err.value)
    assert SequentialConfig(ranks=10).fa_ranks == (3, 4, 8, 10)
    assert SequentialConfig().fa_ranks == (3, 4, 8) and SequentialConfig().fa_rates == (1e-3, 1e-4)
