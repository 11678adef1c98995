"""The online clock replays the engine's process one arrival at a time (docs/design.md §10)."""

import numpy as np
import pytest

from naig.arrivals import ArrivalClock, ArrivalModel, RoundClock, round_times, simulate_arrivals

MODELS = {
    "blocking-exp": {"compute": "exp:1", "workers": 4},
    "blocking-ties": {"compute": "const:1,const:2,const:1,const:0.5"},
    "blocking-delays": {"compute": "gamma:1:2,exp:0.5,lognormal:2:0.8", "uplink": "exp:0.3",
                        "downlink": "shifted-exp:0.2:0.1"},
    "shared-memory": {"compute": "exp:0.5,exp:1,exp:2,exp:4", "mode": "shared-memory"},
    "non-blocking": {"compute": "exp:1", "workers": 5, "uplink": "exp:0.7", "downlink": "exp:0.9",
                     "mode": "non-blocking"},
    "non-blocking-ties": {"compute": "const:1", "workers": 3, "uplink": "const:0.5", "downlink": "const:0.25",
                          "mode": "non-blocking"},
    "per-sample-bandwidth": {"compute": "shifted-exp:0.2:0.1", "workers": 3, "per_sample": "exp:0.001",
                             "batch_size": 32, "uplink": "exp:0.05", "bytes_up": 4e6, "bytes_down": 4e6,
                             "bandwidth": [1e8, 5e7, 2e8], "mode": "non-blocking"},
}


def _drive(model: ArrivalModel, n: int, seed: int, window: int) -> tuple[np.ndarray, ArrivalClock]:
    clock, rows = ArrivalClock(model, seed), []
    for r in range(n):
        a = clock.next_arrival()
        rows.append((a.worker, a.job, a.time, a.pulled, a.staleness, a.age))
        if (r + 1) % window == 0:
            clock.applied()
    return np.array(rows), clock


@pytest.mark.parametrize("window", [1, 3])
@pytest.mark.parametrize("name", MODELS)
def test_clock_and_engine_give_the_same_sequence(name: str, window: int) -> None:
    """Same seed, every window applied: identical workers, times, versions, staleness and ages."""
    model = ArrivalModel.from_specs(**MODELS[name])
    rows, clock = _drive(model, 4_000, 9, window)
    tr = simulate_arrivals(model, 4_000, seed=9, window=window)
    assert np.array_equal(rows, np.stack([tr.worker, tr.job, tr.time, tr.pulled, tr.staleness, tr.age], 1))
    assert clock.version == tr.version and clock.arrivals == 4_000
    if tr.pending is not None:
        assert np.array_equal(clock.held(), tr.pending)


def test_a_dropped_window_leaves_the_version() -> None:
    """The caller decides what is applied: without applied() the version stays and staleness is 0."""
    clock = ArrivalClock(ArrivalModel.from_specs("exp:1", workers=3), seed=0)
    assert [clock.next_arrival().staleness for _ in range(10)] == [0] * 10 and clock.version == 0
    clock.applied()
    later = [clock.next_arrival() for _ in range(10)]
    assert all(a.staleness == 1 - a.pulled for a in later)


def test_round_clock_draws_round_times() -> None:
    model = ArrivalModel.from_specs(**MODELS["per-sample-bandwidth"])
    clock = RoundClock(model, seed=2)
    assert np.array_equal([clock.next_round() for _ in range(600)], round_times(model, 600, seed=2))
