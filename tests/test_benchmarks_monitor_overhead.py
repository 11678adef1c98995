"""benchmarks/monitor_overhead.py refuses what it would not apply, before starting any process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import run_python

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "monitor_overhead.py"


@pytest.mark.parametrize(("args", "says"), [
    (["--variants", "log,lgo"], "--variants: unknown 'lgo'"),
    (["--repeats", "0"], "--repeats: must be at least 1"),
    (["--steps", "-3"], "--steps: must be at least 1"),
    (["--batch", "0"], "--batch: must be at least 1"),
    (["--window", "0"], "--window: must be at least 1"),
    (["--warmup", "-1"], "--warmup: must be at least 0"),
    (["--window", "2"], "--window: must be an int >= 3"),
    (["--preset", "bogus"], "--preset: "),
])
def test_an_option_it_would_not_apply_is_refused_in_one_line(args: list[str], says: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = run_python(SCRIPT, *args, cwd=ROOT, timeout=60, env=env)
    assert r.returncode == 2
    last = r.stderr.strip().splitlines()[-1]
    assert says in last and "Traceback" not in r.stderr
