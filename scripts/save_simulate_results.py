"""Save the simulator's results for every rule in every setting, to check that a change of the
code's shape changes no number (tests/test_simulate_saved_results.py compares a fresh run with
this file, float for float).

    python scripts/save_simulate_results.py          # writes tests/data/simulate_results.json

Run it only when a change is *meant* to change the numbers, and say so in the commit. The runs are
small (gpt-nano, 4 server steps, 4 validation batches per evaluation, one seed, on this machine's CPU
torch build, one thread) so the check costs seconds; the file records the torch version it was made with.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from naig.errors import UsageError
from naig.monitor.records import encode
from naig.simulate import SimulateConfig, run_experiment
from naig.simulate.results import RunResult
from naig.simulate.strategies import STRATEGIES

__all__ = ["CASES", "COMMAND", "OUT", "main", "results", "run_record"]

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "simulate_results.json"
COMMAND = "python scripts/save_simulate_results.py"
COMMON = dict(steps=4, seeds=1, eval_every=2, eval_batches=4, data_bytes=200_000, threads=1)
LOCAL = ("diloco", "diloco-naig", "gasloc", "gossip-adam", "local-sgd", "allreduce")
CASES: dict[str, dict] = {  # setting: its options (every rule defined in the setting runs)
    "lags": dict(lags=(0, 1, 2, 3)),
    "arrivals": dict(arrivals="exp:1,exp:1,exp:2,exp:4"),
    "local": dict(arrivals="exp:1,exp:1,exp:2,exp:4", local_steps=2, strategies=LOCAL),
}


def _defined(options: dict) -> tuple[str, ...]:
    """The rules of ``STRATEGIES`` that the setting of ``options`` defines (others are refused)."""
    names = []
    for name in sorted(STRATEGIES):
        try:
            SimulateConfig.from_options(**COMMON, **options, strategies=(name,))
        except UsageError:
            continue
        names.append(name)
    return tuple(names)


def results() -> dict:
    """{setting: {rule: {untrained, final_val_loss, train losses per step}}} for ``CASES``."""
    out: dict = {"torch": torch.__version__.split("+")[0]}
    for name, options in CASES.items():
        options = options if "strategies" in options else {**options, "strategies": _defined(options)}
        result = run_experiment(SimulateConfig.from_options(**COMMON, **options))
        out[name] = {run.strategy: run_record(run) for run in result.runs}
    return out


WALL_CLOCK = ("ms_per_step",)  # measured, not computed: left out


def run_record(run: RunResult) -> dict:
    """Every field of one run but the wall-clock ones, as JSON (NaN as the string "NaN")."""
    return encode({k: v for k, v in asdict(run).items() if k not in WALL_CLOCK})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", type=Path, default=OUT)
    args = p.parse_args(argv)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
