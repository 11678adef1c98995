"""The simulator's numbers do not move when its code changes shape: every rule defined in each
setting (fixed lags, arrivals, local updates) is run small and compared, float for float, with
tests/data/simulate_results.json, which scripts/save_simulate_results.py wrote before the change.

A change that is meant to change the numbers regenerates the file (the failure names the command)
and says so in its commit. With another torch version the comparison is skipped, with the reason.

Structure, integers and strings must match exactly; floats to a relative ``RTOL``. Bit-identity does
not carry across CPUs even on one torch build (CPU, one thread): the file, written on the development
machine, reproduced on a 2-core AMD EPYC (AVX512) to 2e-7 in every loss and 7.5e-5 at worst in a
diagnostic (the median rule's mean πₖ), 2026-12-03. A rule that changes moves its numbers by far more.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RTOL = 1e-3


def _differences(fresh: object, saved: object, path: str = "") -> list[str]:
    """Where ``fresh`` departs from ``saved`` (JSON values): structure, non-floats exactly, floats to RTOL."""
    if isinstance(saved, dict):
        if not isinstance(fresh, dict) or fresh.keys() != saved.keys():
            keys = sorted(fresh) if isinstance(fresh, dict) else fresh
            return [f"{path}: keys {keys!r} != {sorted(saved)}"]
        return [d for k in saved for d in _differences(fresh[k], saved[k], f"{path}.{k}")]
    if isinstance(saved, list):
        if not isinstance(fresh, list) or len(fresh) != len(saved):
            return [f"{path}: {fresh!r} != {saved!r}"]
        pairs = enumerate(zip(fresh, saved, strict=True))
        return [d for i, (a, b) in pairs for d in _differences(a, b, f"{path}[{i}]")]
    if isinstance(saved, float) and isinstance(fresh, float):
        both_nan = math.isnan(fresh) and math.isnan(saved)
        same = both_nan or math.isclose(fresh, saved, rel_tol=RTOL, abs_tol=1e-12)
        return [] if same else [f"{path}: {fresh!r} != {saved!r}"]
    return [] if fresh == saved and type(fresh) is type(saved) else [f"{path}: {fresh!r} != {saved!r}"]


def test_the_comparison_finds_a_changed_number() -> None:
    saved = {"a": [1.0, 2.0], "n": 3, "s": "x"}
    assert _differences({"a": [1.0, 2.0 * (1 + RTOL / 10)], "n": 3, "s": "x"}, saved) == []
    assert _differences({"a": [1.0, 2.0 * (1 + 3 * RTOL)], "n": 3, "s": "x"}, saved) == [
        f".a[1]: {2.0 * (1 + 3 * RTOL)!r} != 2.0"]
    assert _differences({"a": [1.0, 2.0], "n": 4, "s": "x"}, saved) == [".n: 4 != 3"]
    assert _differences({"a": [1.0], "n": 3, "s": "x"}, saved) != []
    assert _differences({"a": [1.0, 2.0], "n": 3}, saved) != []


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
                    f"within one build; run `{script.COMMAND}` to compare on this one")
    assert {k: len(v) for k, v in saved.items() if k != "torch"} == {"lags": 16, "arrivals": 11, "local": 6}
    for setting in ("lags", "arrivals", "local"):  # the saved runs trained: a file of NaNs would pass too
        for rule, run in saved[setting].items():
            assert run["final_val_loss"] < run["curve"][0][1], (setting, rule)
    fresh = json.loads(json.dumps(script.results()))
    for setting in ("lags", "arrivals", "local"):
        for rule in saved[setting]:
            diff = _differences(fresh[setting][rule], saved[setting][rule])
            assert not diff, (f"{setting} {rule}: the numbers changed ({'; '.join(diff[:3])}); if that is "
                              f"meant, run `{script.COMMAND}` and say so in the commit")
    assert not _differences(fresh, saved), "a setting or a rule was added or removed: regenerate the file"
