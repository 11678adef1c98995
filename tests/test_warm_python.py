"""tests/warm_python.py as the runs of ``run_python`` use it: the interpreters a run starts (a
``LocalCluster``'s ranks, torchrun's) are the warm server's runs, and they behave as fresh ones would
where naig and its tests look: exit statuses (−N after signal N), ``-u``, the parent watch.

(How a shim runs a script, ``-c`` code and ``naig`` in a shell: tests/test_docs.py.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from naig.launch import ENV_PARENT
from tests import warm_python
from tests.conftest import ROOT, assert_no_leftovers, process_alive, run_python, warm_bin


@pytest.fixture(scope="module")
def warm_env() -> dict[str, str]:
    return {**os.environ, **warm_python.run_env(warm_bin())}


def test_the_parent_variable_is_naigs() -> None:
    assert warm_python.PARENT_VAR == ENV_PARENT


@pytest.mark.parametrize(("code", "status"), [
    ("import sys; sys.exit(3)", 3),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL),
    ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -signal.SIGTERM),
    ("raise KeyboardInterrupt", -signal.SIGINT),
])
def test_a_shim_ends_as_its_run_did(warm_env: dict[str, str], code: str, status: int) -> None:
    python = warm_env[warm_python.EXEC_VAR]
    r = subprocess.run([python, "-c", code], env=warm_env, capture_output=True, text=True, timeout=120)
    assert r.returncode == status, r.stderr


@pytest.mark.parametrize("ignored", [False, True])
def test_the_run_ignores_sigint_where_its_shim_was_started_ignoring_it(warm_env: dict[str, str],
                                                                       ignored: bool) -> None:
    """As an interpreter does: started with SIGINT ignored (a background job of a script) it keeps it
    ignored, else Ctrl-C is a KeyboardInterrupt."""
    python = warm_env[warm_python.EXEC_VAR]
    code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"
    disposition = signal.SIG_IGN if ignored else signal.SIG_DFL
    r = subprocess.run([python, "-c", code], env=warm_env, capture_output=True, text=True, timeout=120,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, disposition))
    assert r.returncode == 0 and r.stdout.split() == [str(ignored)], r.stdout + r.stderr


def test_the_shim_takes_torchruns_u_and_the_run_is_forked_warm(warm_env: dict[str, str]) -> None:
    python = warm_env[warm_python.EXEC_VAR]
    code = "import sys, os; print('torch' in sys.modules, os.environ.get('PYTHONUNBUFFERED'), sys.argv[1:])"
    r = subprocess.run([python, "-u", "-c", code, "a"], env=warm_env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["True", "1", "['a']"], r.stdout + r.stderr
    fresh = subprocess.run([python, "-c", code], env={k: v for k, v in warm_env.items()
                                                      if k != warm_python.SOCKET_VAR},
                           capture_output=True, text=True, timeout=120)
    assert fresh.stdout.split()[0] == "False", fresh.stdout + fresh.stderr  # no server: the interpreter


def test_a_run_s_local_cluster_ranks_are_forked_warm(tmp_path: Path, warm_env: dict[str, str]) -> None:
    """``run_python`` gives its run the shim as ``sys.executable``: a ``LocalCluster`` started there
    forks its ranks from the server (torch already imported), with the launcher's environment."""
    child = "import os, sys; print('torch' in sys.modules, os.environ['RANK'], os.environ['OMP_NUM_THREADS'])"
    parent = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from naig.launch import LocalCluster
        with LocalCluster([sys.executable, "-c", {child!r}], 3, 30.0, Path({str(tmp_path)!r}),
                          threads=1) as cluster:
            codes = cluster.shutdown(grace=60)
        print(codes, sys.executable.endswith("/bin/python"))
    """)
    r = run_python("-c", parent, cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["{1:", "0,", "2:", "0}", "True"], r.stdout + r.stderr
    for rank in (1, 2):
        assert (tmp_path / f"rank{rank}.log").read_text().split() == ["True", str(rank), "1"]


def test_a_rank_exits_when_its_cluster_s_process_is_killed(tmp_path: Path, warm_env: dict[str, str]) -> None:
    """No orphan through the shim: SIGKILL the process that started the cluster, and both the rank's
    shim (its own watch of its parent) and the run it asked for (killed by the handler once the shim
    is gone) end; the run's pid is written to a file. (naig's own watch: tests/test_distributed_launch.py.)"""
    pid_file = tmp_path / "run.pid"
    child = (f"import os, time; from naig.launch import watch_parent; watch_parent(0.1); "
             f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)")
    parent = textwrap.dedent(f"""
        import os, time
        from pathlib import Path
        from naig.launch import LocalCluster
        cluster = LocalCluster([os.environ["PYTHON_EXEC"], "-c", {child!r}], 2, 5.0, Path({str(tmp_path)!r}))
        cluster.__enter__()
        print(cluster.children[1].pid, flush=True)
        time.sleep(600)
    """)
    env = {**warm_env, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([warm_env[warm_python.EXEC_VAR], "-c", parent], stdout=subprocess.PIPE,
                            text=True, env=env, cwd=tmp_path, start_new_session=True)
    try:
        shim = int(proc.stdout.readline())
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the rank never started"
            time.sleep(0.05)
        run = int(pid_file.read_text())
        assert run != shim and process_alive(shim) and process_alive(run)
        proc.kill()  # the parent's shim; its run (the cluster's process) goes with it
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while (process_alive(shim) or process_alive(run)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not process_alive(shim) and not process_alive(run)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert_no_leftovers(str(tmp_path), what="a rank of the killed cluster")

