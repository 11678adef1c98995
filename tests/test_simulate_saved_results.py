"""The simulator's numbers do not move when its code changes shape: every rule defined in each
setting (fixed lags, arrivals, local updates) is run small and compared, float for float, with
tests/data/simulate_results.json, which scripts/save_simulate_results.py wrote before the change.

A change that is meant to change the numbers regenerates the file (the failure names the command)
and says so in its commit. The file is bit-identical only on the torch build it was made with (CPU,
one thread): with another torch version the comparison is skipped, with the reason.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("save_simulate_results",
                                                  ROOT / "scripts" / "save_simulate_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_rule_in_every_setting_gives_the_saved_numbers() -> None:
    script = _script()
    saved = json.loads(script.OUT.read_text())
    if saved["torch"] != torch.__version__.split("+")[0]:
        pytest.skip(f"saved with torch {saved['torch']}, this is {torch.__version__}: bit-identity holds "
                    f"on one build; run `{script.COMMAND}` to compare on this one")
    assert {k: len(v) for k, v in saved.items() if k != "torch"} == {"lags": 16, "arrivals": 11, "local": 6}
    for setting in ("lags", "arrivals", "local"):  # the saved runs trained: a file of NaNs would pass too
        for rule, run in saved[setting].items():
            assert run["final_val_loss"] < run["curve"][0][1], (setting, rule)
    fresh = json.loads(json.dumps(script.results()))
    for setting in ("lags", "arrivals", "local"):
        for rule in saved[setting]:
            assert fresh[setting][rule] == saved[setting][rule], (
                f"{setting} {rule}: the numbers changed; if that is meant, run `{script.COMMAND}` and say "
                "so in the commit")
    assert fresh == saved
