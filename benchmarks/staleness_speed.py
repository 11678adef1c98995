"""Speed of the arrival engine: arrivals simulated per second of wall time (docs/design.md §9, §10).

Runs ``simulate_arrivals`` (the vectorised engine) and, side by side on the same model
and seed, the event-by-event ``ArrivalClock`` (a heap of events, one Python step per
arrival: the textbook discrete-event simulation, and the same process value for value).
Prints arrivals/s of each, the ratio, and the full ``staleness_report`` (simulation plus
every statistic). Target: the engine ≥ 10⁶ arrivals/s.

Usage: python benchmarks/staleness_speed.py [--arrivals 1000000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from naig.arrivals import ArrivalClock, ArrivalModel, simulate_arrivals, staleness_report

__all__ = ["main"]

TARGET = 1e6
SETUPS = {
    "blocking, K=8, exp:1": {"compute": "exp:1", "workers": 8},
    "blocking, K=64, gamma + delays": {"compute": "gamma:1:2", "workers": 64, "uplink": "exp:0.1",
                                       "downlink": "exp:0.1"},
    "non-blocking, K=8, exp + delays": {"compute": "exp:1", "workers": 8, "uplink": "exp:0.5",
                                        "downlink": "exp:0.5", "mode": "non-blocking"},
}


def _rate(fn: Callable[[int], object], n: int, repeats: int) -> float:
    """Median arrivals/s of ``fn(n)`` over ``repeats`` runs."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(n)
        times.append(time.perf_counter() - t0)
    return n / statistics.median(times)


def _clock(model: ArrivalModel, n: int) -> None:
    clock = ArrivalClock(model, seed=0)
    for _ in range(n):
        clock.next_arrival()
        clock.applied()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arrivals", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    staleness_report(ArrivalModel.from_specs("exp:1"), 1000, rounds=10)  # imports scipy once
    print(f"{'setup':34} {'engine/s':>12} {'report/s':>12} {'event loop/s':>13} {'speed-up':>9} target")
    for name, kw in SETUPS.items():
        m = ArrivalModel.from_specs(**kw)
        engine = _rate(lambda n, m=m: simulate_arrivals(m, n, seed=0), args.arrivals, args.repeats)
        report = _rate(lambda n, m=m: staleness_report(m, n, rounds=1000), args.arrivals, args.repeats)
        loop = _rate(lambda n, m=m: _clock(m, n), args.arrivals // 20, 1)
        ok = "ok" if engine >= TARGET else "MISSED"
        print(f"{name:34} {engine:12,.0f} {report:12,.0f} {loop:13,.0f} {engine / loop:8.1f}× {ok} (≥ 1e6)")


if __name__ == "__main__":
    main()
