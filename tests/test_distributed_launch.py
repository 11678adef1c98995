"""Starting and reaping processes (naig.distributed.launch), with real child processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from naig.distributed.launch import LocalCluster, backend_for, init, under_launcher
from naig.errors import UsageError
from tests.conftest import process_alive

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def test_shutdown_ends_children_that_never_exit(tmp_path: Path) -> None:
    with LocalCluster(SLEEPER, 3, 5.0, tmp_path) as cluster:
        pids = [p.pid for p in cluster.children.values()]
        assert cluster.alive() == [1, 2]
        assert cluster.children[1].args == SLEEPER
        codes = cluster.shutdown(grace=0.2)
    assert codes == {1: -signal.SIGTERM, 2: -signal.SIGTERM}
    assert not any(process_alive(pid) for pid in pids)


def test_children_get_the_launcher_environment_and_logs(tmp_path: Path) -> None:
    code = ("import os; print(os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['MASTER_PORT']); "
            "raise SystemExit(3)")
    with LocalCluster([sys.executable, "-c", code], 2, 5.0, tmp_path) as cluster:
        port = cluster.store.port
        codes = cluster.shutdown(grace=30)
    assert codes == {1: 3}
    assert cluster.log_tail(1) == f"1 2 {port}" and cluster.exit_code(1) == 3


def test_children_import_the_naig_of_their_parent(tmp_path: Path) -> None:
    """The folder holding this naig package leads the children's PYTHONPATH, so a child runs the
    parent's naig (until 2026-12-07 it named the folder above that, which an installed naig hid)."""
    import naig

    code = "import os, naig; print(os.environ['PYTHONPATH'].split(os.pathsep)[0], naig.__file__)"
    with LocalCluster([sys.executable, "-c", code], 2, 5.0, tmp_path) as cluster:
        codes = cluster.shutdown(grace=30)
    first, imported = cluster.log_tail(1).split()
    assert codes == {1: 0}
    assert first == str(Path(naig.__file__).resolve().parents[1]) and imported == naig.__file__


def test_stop_terminates_named_ranks_only(tmp_path: Path) -> None:
    with LocalCluster(SLEEPER, 3, 5.0, tmp_path) as cluster:
        cluster.stop([2])
        assert cluster.exit_code(2) == -signal.SIGTERM and cluster.alive() == [1]
        cluster.shutdown(grace=0.0)


def test_a_child_exits_when_its_parent_is_killed(tmp_path: Path) -> None:
    """No orphans even when rank 0 dies without cleaning up (SIGKILL): the parent watch."""
    child = ("from naig.distributed.launch import watch_parent; import time; watch_parent(0.1); "
             "time.sleep(600)")
    parent = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from naig.distributed.launch import LocalCluster
        cluster = LocalCluster([sys.executable, "-c", {child!r}], 2, 5.0, Path({str(tmp_path)!r}))
        cluster.__enter__()
        print(cluster.children[1].pid, flush=True)
        time.sleep(600)
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True, env=env)
    try:
        grandchild = int(proc.stdout.readline())
        time.sleep(0.5)
        assert process_alive(grandchild)
        proc.kill()  # maybe while the child still imports: it must notice all the same
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while process_alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not process_alive(grandchild)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_backend_and_launcher_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    assert backend_for(torch.device("cpu")) == "gloo" and backend_for(torch.device("cuda")) == "nccl"
    monkeypatch.delenv("RANK", raising=False)
    assert not under_launcher()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert under_launcher()


def test_init_under_a_launcher_without_its_address_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UsageError) as err:
        init(0, 2, "gloo", 1.0)
    assert err.value.field == "nproc" and "MASTER_ADDR and MASTER_PORT" in str(err.value)
