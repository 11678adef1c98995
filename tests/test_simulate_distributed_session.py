"""The distributed engine's configuration and entry points (its session; CLI options)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from naig.errors import UsageError
from naig.simulate import SimulateConfig
from naig.simulate.distributed.session import config_from_json, config_to_json, open_distributed
from naig_cli.main import app

RUNNER = CliRunner()


def test_config_roundtrip_and_workers() -> None:
    c = SimulateConfig.from_options(engine="distributed", nproc=5, window=2, slowdown=(1, 1, 2, 4),
                                    sketch_first=True,
                       strategies=("naig",), faults=("1:kill@3",), timeout=10, lr=(1e-3, 3e-3))
    assert c.workers == 4 and c.asynchronous and c.resolved_reference == "batch"
    assert config_from_json(config_to_json(c)) == c
    assert SimulateConfig.from_options(engine="distributed", nproc=3).resolved_reference == "ema"  # B = 1


@pytest.mark.parametrize(("fields", "field"), [
    (dict(engine="threads"), "engine"),
    (dict(nproc=4), "nproc"),  # without the distributed engine
    (dict(sketch_first=True), "sketch_first"),
    (dict(engine="distributed"), "nproc"),
    (dict(engine="distributed", nproc=1), "nproc"),
    (dict(engine="distributed", nproc=3, window=3), "window"),
    (dict(engine="distributed", nproc=3, slowdown=(1.0,)), "slowdown"),
    (dict(engine="distributed", nproc=3, slowdown=(1.0, 0.5)), "slowdown"),
    (dict(engine="distributed", nproc=3, timeout=31), "timeout"),
    (dict(engine="distributed", nproc=3, sketch_first=True, strategies=("naig", "hogwild")), "sketch_first"),
    (dict(engine="distributed", nproc=3, arrivals="exp:1,exp:1"), "arrivals"),
    (dict(engine="distributed", nproc=3, lags=(0, 3)), "lags"),
    (dict(engine="distributed", nproc=3, mode="non-blocking"), "mode"),
    (dict(engine="distributed", nproc=3, faults=("2:kill",)), "faults"),
    (dict(faults=("1:kill",)), "faults"),  # a process fault without worker processes
    (dict(arrivals="exp:1,exp:1", faults=("0:hang@3",)), "faults"),
    (dict(engine="distributed", nproc=3, strategies=("diloco",)), "strategies"),
])
def test_bad_fields_name_themselves(fields: dict, field: str) -> None:
    with pytest.raises(UsageError) as err:
        SimulateConfig.from_options(**fields)
    assert err.value.field == field


def test_open_distributed_refuses_the_simulated_engine() -> None:
    with pytest.raises(UsageError, match="needs engine distributed"):
        open_distributed(SimulateConfig.from_options())


def test_launcher_world_size_must_match(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "5")
    with pytest.raises(UsageError) as err:
        open_distributed(SimulateConfig.from_options(engine="distributed", nproc=3))
    assert err.value.field == "nproc"


@pytest.mark.parametrize(("args", "needle"), [
    (["--engine", "distributed"], "--nproc"),
    (["--nproc", "3"], "--nproc 3: needs --engine distributed"),
    (["--engine", "distributed", "--nproc", "3", "--set", "distributed.slowdown=1,2,3"],
     "--set distributed.slowdown=1,2,3"),
    (["--engine", "distributed", "--nproc", "3", "--set", "distributed.slowdown=1,x"],
     "--set distributed.slowdown=1,x"),
    (["--engine", "distributed", "--nproc", "3", "--set", "distributed.timeout=60"],
     "--set distributed.timeout=60"),
    (["--engine", "distributed", "--nproc", "3", "--faults", "5:kill"], "--faults '5:kill@0'"),
    (["--faults", "1:kill"], "kill is not applied by the simulated engines; needs worker processes"),
    (["--engine", "distributed", "--nproc", "3", "--set", "distributed.sketch_first"],
     "--set distributed.sketch_first"),
    (["--engine", "distributed", "--nproc", "3", "--arrivals", "exp:1,exp:1"], "--arrivals"),
])
def test_cli_usage_errors(args: list[str], needle: str) -> None:
    out = RUNNER.invoke(app, ["simulate", *args])
    assert out.exit_code == 2, out.output
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines


def test_cli_help_lists_the_engine() -> None:
    out = RUNNER.invoke(app, ["simulate", "--help"], env={"COLUMNS": "200"})
    for flag in ("--engine", "--nproc", "--set", "distributed.timeout", "kill and hang"):
        assert flag in out.stdout


def test_the_distributed_engine_loads_no_other_engine_and_no_scipy() -> None:
    """Importing the real-process engine (what every worker process does) loads neither the simulated
    engines nor scipy; a fresh interpreter reads sys.modules."""
    import subprocess
    import sys

    others = ('naig.simulate.lags.engine', 'naig.simulate.arrivals.engine', 'naig.simulate.arrivals.local')
    code = ("import sys, naig.simulate.distributed; "
            f"print(sorted(m for m in sys.modules if m == 'scipy' or m.startswith({others!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_launcher_variables_without_a_master_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """RANK and WORLD_SIZE set (as by a launcher) without MASTER_ADDR/MASTER_PORT: one line, exit 2."""
    from tests.conftest import assert_one_line_error, run_naig

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    r = run_naig("simulate", "--engine", "distributed", "--nproc", "3", "--steps", "2", "--seeds", "1",
                 "--data-bytes", "60000", timeout=120)
    assert_one_line_error(r, 2, "MASTER_ADDR", "torchrun")


def test_a_busy_master_port_is_one_line() -> None:
    """Under a launcher's variables with MASTER_PORT taken: one line naming the port, exit 1."""
    import os
    import socket

    from tests.conftest import assert_one_line_error, run_naig

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            r = run_naig("simulate", "--engine", "distributed", "--nproc", "3", "--steps", "2", "--seeds",
                         "1", "--data-bytes", "60000", timeout=120)
        finally:
            for k, v in old.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert_one_line_error(r, 1, "could not join the process group", "MASTER_PORT")


def test_the_worker_entry_point_refuses_a_wrong_command_line_as_a_usage_error() -> None:
    r = subprocess.run([sys.executable, "-m", "naig.simulate.distributed"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "usage: python -m naig.simulate.distributed CONFIG.json" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
