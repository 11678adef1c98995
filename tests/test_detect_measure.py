"""naig.detect.measure: delays, wrong namings, false alarms with intervals, replays, the default's choice."""

from __future__ import annotations

import numpy as np
import pytest

from naig.detect.measure import CANDIDATES, choose, detection, false_alarms, monitor_names, replays, summarise
from naig.detect.sequential import Record
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


def test_the_monitor_path_names_a_non_finite_rank_in_its_warm_up() -> None:
    rec = _record(steps=3)
    rec.payload[..., 14] = 1.0
    rec.payload[1, 3, 15] = 1.0
    assert monitor_names(rec, exact=False, false_alarm=1e-3) == [(), (3,), ()]
