"""The exact event simulation of the arrival model (docs/design.md §10): hand-computed traces,
the blocking identity, the laws within their intervals, determinism."""

import numpy as np
import pytest

from naig.arrivals import ArrivalModel, measure, predict, round_times, simulate_arrivals
from naig.arrivals.engine import estimate_bytes
from naig.errors import UsageError


def test_blocking_by_hand_with_ties() -> None:
    """const:1 and const:2: at t = 2, 4, … both arrive; worker 0 goes first."""
    tr = simulate_arrivals(ArrivalModel.from_specs("const:1,const:2"), 9)
    assert tr.worker.tolist() == [0, 0, 1, 0, 0, 1, 0, 0, 1]
    assert tr.time.tolist() == [1, 2, 2, 3, 4, 4, 5, 6, 6]
    assert tr.pulled.tolist() == [0, 1, 0, 2, 4, 3, 5, 7, 6]
    assert tr.staleness.tolist() == [0, 0, 2, 1, 0, 2, 1, 0, 2]
    assert tr.age.tolist() == [1, 1, 2, 1, 1, 2, 1, 1, 2]  # the age of a blocking update is its cycle
    assert tr.pending.tolist() == [8, 9] and tr.version == 9  # worker 0 last pulled after update 7


def test_non_blocking_by_hand() -> None:
    """One worker, compute 1, uplink 0.5, downlink 0.25: the next job starts before the reply comes."""
    m = ArrivalModel.from_specs("const:1", workers=1, uplink="const:0.5", downlink="const:0.25",
                                mode="non-blocking")
    tr = simulate_arrivals(m, 5)
    assert tr.time.tolist() == [1.75, 2.75, 3.75, 4.75, 5.75]
    assert tr.pulled.tolist() == [0, 0, 1, 2, 3]  # the reply to job n arrives during job n + 1
    assert tr.staleness.tolist() == [0, 1, 1, 1, 1] and tr.pending is None


def test_non_blocking_by_hand_two_workers_with_ties() -> None:
    """Job n of either worker starts at 0.25 + n and arrives at 1.75 + n (worker 0 first); the reply
    to rank r carries version r + 1 and lands 0.25 s later, one job behind."""
    m = ArrivalModel.from_specs("const:1", workers=2, uplink="const:0.5", downlink="const:0.25",
                                mode="non-blocking")
    tr = simulate_arrivals(m, 8)
    assert tr.worker.tolist() == [0, 1] * 4 and tr.job.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert tr.pulled.tolist() == [0, 0, 0, 0, 1, 2, 3, 4]
    assert tr.staleness.tolist() == [0, 1, 2, 3, 3, 3, 3, 3]


def test_window_by_hand_mid_window_arrivals_get_the_current_version() -> None:
    tr = simulate_arrivals(ArrivalModel.from_specs("const:1", workers=2), 6, window=2)
    assert tr.pulled.tolist() == [0, 0, 0, 1, 1, 2]  # worker 0 arrives mid-window: version 0, 1, 2
    assert tr.staleness.tolist() == [0, 0, 1, 0, 1, 0] and tr.version == 3


SETUPS = {
    "exp": {"compute": "exp:1", "workers": 6},
    "shifted-exp": {"compute": "shifted-exp:1:0.6", "workers": 6},
    "gamma": {"compute": "gamma:1:3", "workers": 6},
    "const": {"compute": "const:1", "workers": 6},
    "lognormal": {"compute": "lognormal:1:1", "workers": 6},
    "exp+delays": {"compute": "exp:1", "workers": 6, "uplink": "exp:0.5", "downlink": "const:0.2"},
    "shifted-exp+delays": {"compute": "shifted-exp:1:0.6", "workers": 6, "uplink": "gamma:0.3:2",
                           "downlink": "exp:0.1"},
    "gamma+delays": {"compute": "gamma:1:3", "workers": 6, "uplink": "lognormal:0.4:0.5",
                     "downlink": "shifted-exp:0.3:0.1"},
    "const+delays": {"compute": "const:1", "workers": 6, "uplink": "exp:0.5", "downlink": "exp:0.5"},
    "heterogeneous": {"compute": "exp:0.5,gamma:1:2,const:2,shifted-exp:4:1,lognormal:3:0.7,exp:0.25",
                      "uplink": "exp:0.1,const:0,exp:1,const:0.5,exp:0.2,gamma:2:2"},
    "per-sample+bandwidth": {"compute": "exp:0.2", "workers": 6, "per_sample": "exp:0.01", "batch_size": 64,
                             "bytes_up": 4e6, "bytes_down": 4e6, "bandwidth": [1e8]},
}


@pytest.mark.parametrize("name", SETUPS)
def test_blocking_identity_is_exact(name: str) -> None:
    """Σ_n τ_n + Σ_in-flight (updates since pull) = (K − 1)·N, to the last update."""
    m = ArrivalModel.from_specs(**SETUPS[name])
    for n in (1, 7, 5_000):
        tr = simulate_arrivals(m, n, seed=3)
        assert tr.staleness.sum() + (n - tr.pending).sum() == (m.workers - 1) * n


@pytest.mark.parametrize("name", SETUPS)
def test_blocking_mean_staleness_is_k_minus_1(name: str) -> None:
    m = ArrivalModel.from_specs(**SETUPS[name])
    got = measure(simulate_arrivals(m, 100_000, seed=0))
    assert predict(m).mean == m.workers - 1
    assert got.mean.contains(m.workers - 1), got.mean
    assert got.mean.shifted(1).contains(m.workers), "τ + 1 convention: K"


@pytest.mark.parametrize("name", ["exp", "gamma+delays", "heterogeneous"])
def test_update_rate_is_sum_of_inverse_mean_cycles(name: str) -> None:
    m = ArrivalModel.from_specs(**SETUPS[name])
    got = measure(simulate_arrivals(m, 100_000, seed=0))
    rate = float((1 / m.mean_cycle()).sum())
    assert predict(m).rate == pytest.approx(rate)
    assert got.rate.contains(rate), got.rate


def test_shared_memory_mean_staleness() -> None:
    m = ArrivalModel.from_specs("gamma:1:2", workers=5, mode="shared-memory")
    got = measure(simulate_arrivals(m, 100_000, seed=0))
    assert got.mean.contains(4) and got.mean.shifted(1).contains(5)


def test_windows_divide_the_blocking_mean_by_b() -> None:
    """Each server update ages the K − 1 other jobs in flight by one version: E[τ] = (K − 1)/B."""
    m = ArrivalModel.from_specs(**SETUPS["heterogeneous"])
    for b in (2, 3, 6):
        tr = simulate_arrivals(m, 60_000, seed=1, window=b)
        assert measure(tr).mean.contains((m.workers - 1) / b)
        assert predict(m, window=b).mean == (m.workers - 1) / b and predict(m, window=b).per_worker is None


def test_non_blocking_rate_uses_compute_time_only() -> None:
    m = ArrivalModel.from_specs("exp:0.5,exp:1,gamma:2:2", uplink="exp:1", downlink="exp:2",
                                mode="non-blocking")
    got = measure(simulate_arrivals(m, 100_000, seed=0))
    assert predict(m).rate == pytest.approx(2 + 1 + 0.5)
    assert got.rate.contains(3.5), got.rate
    assert predict(m).mean is None and predict(m).per_worker is None


def test_non_blocking_staleness_grows_with_delays() -> None:
    """In non-blocking mode τ moves with (U + D)/E[X] (blocking: K − 1 whatever the delays)."""
    means = [measure(simulate_arrivals(ArrivalModel.from_specs("exp:1", workers=4, uplink=f"const:{d}",
                                                               mode="non-blocking"), 20_000)).mean.value
             for d in (0, 1, 3)]
    assert means[0] < means[1] < means[2] and means[0] > 2.5


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    m = ArrivalModel.from_specs(**SETUPS["gamma+delays"])
    a, b = simulate_arrivals(m, 5_000, seed=11), simulate_arrivals(m, 5_000, seed=11)
    assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("worker", "time", "pulled", "age"))
    assert not np.array_equal(a.time, simulate_arrivals(m, 5_000, seed=12).time)


def test_prefix_does_not_depend_on_n() -> None:
    """The first n arrivals of a longer run are the run of n arrivals (draws per worker stream)."""
    m = ArrivalModel.from_specs(**SETUPS["heterogeneous"])
    short, long = simulate_arrivals(m, 3_000, seed=4), simulate_arrivals(m, 50_000, seed=4)
    assert np.array_equal(short.time, long.time[:3_000]) and np.array_equal(short.pulled, long.pulled[:3_000])


def test_round_times_are_max_cycles() -> None:
    m = ArrivalModel.from_specs("const:1,exp:1", uplink="const:0.5")
    r = round_times(m, 20_000, seed=0)
    assert r.min() >= 1.5 and np.array_equal(r[:100], round_times(m, 100, seed=0))
    assert r.mean() == pytest.approx(predict(m).round_time, rel=0.02)


@pytest.mark.parametrize(("kwargs", "field"), [({"arrivals": 0}, "updates"), ({"window": 0}, "window"),
                                               ({"seed": -1}, "seed"), ({"arrivals": 2.5}, "updates")])
def test_bad_arguments_name_their_field(kwargs: dict, field: str) -> None:
    args = {"arrivals": 10} | kwargs
    with pytest.raises(UsageError) as info:
        simulate_arrivals(ArrivalModel.from_specs("exp:1"), **args)
    assert info.value.field == field


def test_heavy_tails_draw_jobs_bounded_by_the_arrivals() -> None:
    """The issue's lognormal:1:5 (21.4 GB before): a blocking worker never needs more than
    N + 1 jobs, so memory stays linear in N."""
    import tracemalloc

    m = ArrivalModel.from_specs("lognormal:1:5", workers=4)
    assert estimate_bytes(m, 20_000) < 4 * 20_016 * 200
    tracemalloc.start()
    try:
        tr = simulate_arrivals(m, 20_000, seed=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert tr.arrivals == 20_000 and peak < 30e6, peak  # measured: about 6 MB


def test_heavy_tails_non_blocking_terminate() -> None:
    m = ArrivalModel.from_specs("lognormal:1:5", workers=4, uplink="lognormal:1:5", mode="non-blocking")
    assert simulate_arrivals(m, 5_000, seed=1).arrivals == 5_000


def test_a_run_past_the_memory_is_refused_before_any_draw(monkeypatch) -> None:
    import naig.arrivals.engine as engine

    m = ArrivalModel.from_specs("exp:1", workers=4)
    monkeypatch.setattr(engine, "available_bytes", lambda: 2**30)  # 1 GiB
    monkeypatch.setattr(engine, "_worker_jobs", lambda *a: pytest.fail("drew jobs"))
    with pytest.raises(UsageError) as info:
        simulate_arrivals(m, 10**9)
    assert info.value.field == "updates" and "GiB of memory" in info.value.message
    need = float(info.value.message.split("about ")[1].split(" GiB")[0])
    assert need == pytest.approx(estimate_bytes(m, 10**9) / 2**30, rel=1e-2) and need > 100
    many = ArrivalModel.from_specs("exp:1", workers=10**6)  # the workers' jobs dominate
    monkeypatch.setattr(engine, "available_bytes", lambda: 2**20)
    with pytest.raises(UsageError) as info:
        simulate_arrivals(many, 1000)
    assert info.value.field == "workers"


def test_available_bytes_sees_rlimit_as() -> None:
    import subprocess
    import sys

    code = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (2**31, 2**31)); "
            "from naig.arrivals.engine import available_bytes; print(available_bytes())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert 0 < int(out.stdout) < 2**31


@pytest.mark.parametrize("mode", ["blocking", "non-blocking", "shared-memory"])
def test_one_worker_everywhere(mode: str) -> None:
    """K = 1 (one spec, no `workers`): every arrival is fresh, and every part agrees."""
    from naig.arrivals import ArrivalClock, RoundClock, predict, staleness_report

    m = ArrivalModel.from_specs("exp:2", mode=mode)
    assert m.workers == 1
    tr = simulate_arrivals(m, 500, seed=0)
    assert (tr.staleness == 0).all() and (tr.worker == 0).all()
    clock = ArrivalClock(m, seed=0)
    got = []
    for _ in range(500):
        got.append(clock.next_arrival().time)
        clock.applied()
    np.testing.assert_array_equal(got, tr.time)
    assert RoundClock(m, seed=0).next_round() == round_times(m, 1, seed=0)[0]
    p = predict(m)
    assert p.rate == pytest.approx(0.5, rel=1e-12)
    if mode != "non-blocking":
        assert p.mean == 0 and p.per_worker == (0.0,) and p.pmf(np.arange(3)).tolist() == [1.0, 0.0, 0.0]
    assert p.round_time == pytest.approx(2.0, rel=1e-6)
    doc = staleness_report(m, 2000, rounds=200).to_dict()
    assert doc["staleness"]["measured"]["mean"] == 0 and len(doc["staleness"]["measured"]["per_worker"]) == 1
