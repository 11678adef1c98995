"""The monitor's recipes on real processes (gloo, 3 ranks): examples/monitor_lightning.py and
examples/monitor_accelerate.py each run a few steps with a rank sending ×1000 gradients at step 24;
examples/monitor_transformers.py 12 steps with a ×1000 loss at step 12.

Each recipe runs with the monitor in ``log`` mode: the bad rank is named (rank and host) at its
step and at no earlier step, and every rank saw the same flagged ranks at every step. The
Accelerate recipe also runs with ``--no-monitor`` and must end bit-identical (the monitor is
invisible when it only watches); for the Lightning and Trainer callbacks that is their own test
(tests/test_monitor_lightning.py, tests/test_monitor_transformers.py, on the callbacks these
recipes register), not run a second time here. Skipped when the optional extra is not installed.
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

from naig.monitor.records import decode
from tests.conftest import assert_no_leftovers, needs, run_python

ROOT = Path(__file__).resolve().parents[1]
WORLD, STEPS, BAD_STEP = 3, 30, 24


def _run(cmd: list[str], tmp: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a recipe (its output folder, inside ``tmp``, is on its command line: the process marker)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"}
    try:
        assert cmd[0] == sys.executable
        r = run_python(*cmd[1:], timeout=timeout, env=env, cwd=tmp)
    finally:
        assert_no_leftovers(str(tmp), wait=15)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def _check(out: Path, bad_rank: int) -> None:
    lines = [decode(json.loads(x)) for x in (out / "monitor.jsonl").read_text().splitlines()]
    header, steps = lines[0], lines[1:]
    assert header["type"] == "header" and header["world"] == WORLD and header["monitor"]["action"] == "log"
    assert header["hosts"] == [socket.gethostname()] * WORLD
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    flagged = {s["step"]: s["flagged"] for s in steps if s["flagged"]}
    assert min(flagged) == BAD_STEP and flagged[BAD_STEP] == [bad_rank], flagged
    assert steps[BAD_STEP - 1]["summary"]["max_rank"] == bad_rank
    assert "bucket" in steps[BAD_STEP - 1]["where"][str(bad_rank)]
    views = [json.loads((out / "ranks" / f"rank{k}.json").read_text()) for k in range(WORLD)]
    assert all(v["flagged"] == views[0]["flagged"] for v in views) and len(views[0]["flagged"]) == STEPS
    assert views[0]["flagged"][BAD_STEP - 1] == [bad_rank]


def _trained(out: Path) -> None:
    """The recipe saved its final parameters, all finite."""
    params = torch.load(out / "params.pt")
    assert params and all(bool(torch.isfinite(v).all()) for v in params.values())


def test_lightning_recipe_names_the_bad_rank(tmp_path) -> None:
    needs("lightning", "the Lightning recipe needs the lightning extra")
    script = str(ROOT / "examples" / "monitor_lightning.py")
    out = tmp_path / "monitored"
    out.mkdir()
    r = _run([sys.executable, script, str(out), "--devices", str(WORLD), "--steps", str(STEPS),
              "--bad-step", str(BAD_STEP), "--bad-rank", "2", "--action", "log"], tmp_path)
    assert f"flagged steps: {{{BAD_STEP}: [2]" in r.stdout
    _check(out, bad_rank=2)
    _trained(out)


def test_accelerate_recipe_under_torchrun_names_the_bad_rank_and_log_mode_is_invisible(tmp_path) -> None:
    needs("accelerate", "the Accelerate recipe needs the accelerate extra")
    script = str(ROOT / "examples" / "monitor_accelerate.py")
    outs = {}
    for name, extra in (("monitored", ["--action", "log"]), ("plain", ["--no-monitor"])):
        out = tmp_path / name
        out.mkdir()
        _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD),
              script, str(out), "--steps", str(STEPS), "--bad-step", str(BAD_STEP), "--bad-rank", "1",
              *extra], tmp_path)
        outs[name] = out
    _check(outs["monitored"], bad_rank=1)
    csv_rows = (outs["monitored"] / "monitor.csv").read_text().splitlines()
    assert len(csv_rows) == 1 + STEPS * WORLD
    assert not (outs["plain"] / "monitor.jsonl").exists()
    pa, pb = (torch.load(outs[name] / "params.pt") for name in ("monitored", "plain"))
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


def test_transformers_recipe_under_torchrun_names_the_bad_rank(tmp_path) -> None:
    needs("transformers", "the Trainer recipe needs the transformers extra")
    script = str(ROOT / "examples" / "monitor_transformers.py")
    out = tmp_path / "monitored"
    out.mkdir()
    r = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
              str(WORLD), script, str(out), "--steps", "12", "--bad-step", "12", "--window", "8",
              "--bad-rank", "1", "--action", "log"], tmp_path)
    assert "3 processes, 12 steps; flagged steps: {12: [1]}" in r.stdout
    lines = (out / "monitor.jsonl").read_text().splitlines()
    steps = [decode(json.loads(x)) for x in lines][1:]
    assert [s["step"] for s in steps] == list(range(1, 13)) and steps[-1]["flagged"] == [1]
    _trained(out)
