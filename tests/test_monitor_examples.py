"""The monitor's recipes run: examples/monitor_ddp.py (spawning its ranks) and examples/monitor_fsdp2.py
(under torchrun), a few steps each, and name the rank that sent a NaN gradient.

Each example runs from a copy in the test's temporary folder, and in that folder, so every process
it starts carries the folder in its command line or as its working directory, and the test can
check that none is left (``leftover_processes``).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from naig.distributed.launch import process_group
from naig.errors import UsageError
from tests.conftest import assert_no_leftovers, needs, run_python

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["--steps", "6", "--window", "3", "--fault-step", "5", "--data-bytes", "100000", "--batch-size", "4"]


def _run(tmp: Path, script: str, launcher: list[str], args: list[str], status: int = 0) -> str:
    copy = tmp / script
    shutil.copy(ROOT / "examples" / script, copy)
    env = {**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"}
    try:
        assert launcher[0] == sys.executable
        r = run_python(*launcher[1:], copy, *args, timeout=240, cwd=tmp, env=env)
    finally:
        assert_no_leftovers(str(tmp))
    assert r.returncode == status, r.stdout[-2000:] + r.stderr[-3000:]
    return r.stdout if status == 0 else r.stdout + r.stderr


def _check(out: str, world: int, bad: int, where: str) -> None:
    assert f"{world} ranks, 6 steps, action skip: 1 flagged step(s)" in out, out
    lines = [ln for ln in out.splitlines() if ln.startswith("step 5: ")]
    assert len(lines) == 1, out
    assert re.match(rf"step 5: rank {bad} on \S+ in {where} .*: non-finite gradient$", lines[0]), out
    assert re.search(rf"^bad rank: {bad} \(\S+\) at step 5$", out, flags=re.M), out
    loss = float(out.split("mean train loss ")[1].split()[0])
    assert math.isfinite(loss)  # the NaN step was skipped on every rank: nothing poisoned


def test_monitor_ddp_names_the_nan_rank_and_skips_its_step(tmp_path: Path) -> None:
    out = _run(tmp_path, "monitor_ddp.py", [sys.executable],
               ["--nproc", "3", "--fault-rank", "1", "--fault", "nan", *SHORT])
    _check(out, 3, 1, "bucket 0")


def test_monitor_ddp_composed_with_bf16_compression_still_names_the_nan_rank(tmp_path: Path) -> None:
    out = _run(tmp_path, "monitor_ddp.py", [sys.executable],
               ["--nproc", "3", "--fault-rank", "1", "--fault", "nan", "--comm-hook", "bf16", *SHORT])
    _check(out, 3, 1, "bucket 0")


def test_monitor_ddp_with_action_raise_stops_before_the_update_and_exits_1(tmp_path: Path) -> None:
    """Until 2026-12-08 the script printed "stopped: ..." and exited 0 after training had stopped."""
    out = _run(tmp_path, "monitor_ddp.py", [sys.executable],
               ["--nproc", "3", "--fault-rank", "1", "--fault", "nan", "--action", "raise", *SHORT], status=1)
    assert "3 ranks, 5 steps, action raise: 1 flagged step(s)" in out, out
    last = out.strip().splitlines()[-1]
    assert re.match(r"error: step 5: rank 1 on \S+ in bucket 0 .*no update was applied \(action raise\)$",
                    last), out
    assert "Traceback" not in out


def test_monitor_fsdp2_under_torchrun_names_the_nan_rank(tmp_path: Path) -> None:
    out = _run(tmp_path, "monitor_fsdp2.py",
               [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"],
               ["--fault-rank", "1", "--fault", "nan", *SHORT])
    _check(out, 2, 1, "module")


@pytest.mark.parametrize("args, needle", [
    (["--nproc", "2", "--fault-rank", "9"], "--fault-rank 9: must be in 0..1"),
    (["--nproc", "2", "--fault-rank", "1", "--fault-step", "100"], "--fault-step 100: must be in 1..16"),
    (["--steps", "0"], "--steps 0: must be >= 1"), (["--nproc", "0"], "--nproc 0: must be >= 1"),
    (["--fault-rank", "1", "--fault", "flip"], "--fault='flip': unknown fault kind; use one of "),
    (["--fault-rank", "1", "--fault", "scale:x"], "--fault='scale:x': the argument of scale is not a number"),
    # a fault without a faulty rank: until 2026-12-06 the run went on with no fault, "0 flagged step(s)"
    (["--nproc", "2", "--fault", "scale:1000", "--fault-step", "12"], "--fault needs --fault-rank R"),
    (["--fault-step", "3"], "--fault-step needs --fault-rank R"),
])
@pytest.mark.parametrize("script", ["monitor_ddp.py", "monitor_fsdp2.py"])
def test_example_arguments_out_of_range_are_one_line(script: str, args: list[str], needle: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    r = run_python(ROOT / "examples" / script, *args, timeout=120, env={**env, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2 and r.stderr.startswith(f"error: {needle}"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_the_fsdp2_example_takes_the_kinds_a_loss_factor_gives() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    script = str(ROOT / "examples" / "monitor_fsdp2.py")
    for fault, needle in (("nan:1", "--fault nan:1: through the loss every entry turns nan; use nan"),
                          ("coordflip:0.5", "--fault='coordflip:0.5': is not a kind taken here; use one of "
                           "nan, inf, "
                           "scale, signflip")):
        r = run_python(script, "--fault-rank", "1", "--fault", fault, timeout=120,
                       env={**env, "OMP_NUM_THREADS": "1"})
        assert r.returncode == 2 and r.stderr.startswith(f"error: {needle}"), r.stderr


def test_lightning_example_errors_are_one_line(tmp_path: Path) -> None:
    needs("lightning", "the Lightning example needs the lightning extra")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    script = str(ROOT / "examples" / "monitor_lightning.py")
    r = run_python(script, tmp_path, "--bad-rank", "9", timeout=120, env=env)
    last = r.stderr.strip().splitlines()[-1]
    assert (r.returncode, last) == (2, "error: --bad-rank 9: must be in 0..2 (a rank of --devices 3)")
    assert "Traceback" not in r.stderr
    (tmp_path / "monitor.jsonl").write_text("{}\n")
    r = run_python(script, tmp_path, timeout=120, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last == f"error: {tmp_path / 'monitor.jsonl'} exists: pass another folder, or remove it", r.stderr


def test_a_process_group_of_no_process_is_refused(monkeypatch) -> None:
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(UsageError) as err, process_group(0, [sys.executable, "-c", "pass"]):
        pass
    assert err.value.field == "nproc"
