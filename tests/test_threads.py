"""torch's CPU threads, chosen on purpose (naig.threads) and applied by every training command."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from threadpoolctl import threadpool_info, threadpool_limits
from typer.testing import CliRunner

from naig.errors import UsageError
from naig.simulate import SimulateConfig, run_experiment
from naig.threads import DEFAULT_THREADS, MAX_THREADS, check_threads, one_blas_thread, torch_threads
from naig_cli.main import app
from tests.conftest import assert_one_line_error, needs, run_naig, run_python

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(steps=2, seeds=1, data_bytes=200_000, lags=(0, 1), eval_every=0, strategies=("hogwild",))


def test_torch_threads_sets_and_restores() -> None:
    before = torch.get_num_threads()
    other = 2 if before == 1 else 1
    with torch_threads(other):
        assert torch.get_num_threads() == other
    assert torch.get_num_threads() == before


def test_torch_threads_restores_after_an_error() -> None:
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError), torch_threads(1 if before != 1 else 2):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == before


def _blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_one_blas_thread_sets_numpys_blas_to_one_thread_and_restores_it_after_an_error() -> None:
    if not _blas_threads():
        pytest.skip("threadpoolctl finds no BLAS in this numpy (e.g. Accelerate): nothing to limit")
    with threadpool_limits(2, user_api="blas"):
        assert set(_blas_threads()) == {2}
        torch_threads_before = torch.get_num_threads()
        with pytest.raises(RuntimeError, match="inside"), one_blas_thread():
            assert set(_blas_threads()) == {1}
            raise RuntimeError("inside")
        assert set(_blas_threads()) == {2} and torch.get_num_threads() == torch_threads_before


TWO_THREADS = """
import threading, time, numpy as np
from threadpoolctl import threadpool_info
from naig.threads import one_blas_thread

def count():
    return sorted({lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"})

before, seen = count(), {}
a_in, b_trying, a_out = threading.Event(), threading.Event(), threading.Event()
def a():
    with one_blas_thread():
        a_in.set()
        b_trying.wait(10)
        time.sleep(0.3)  # B is at the door meanwhile
        a_out.set()
def b():
    a_in.wait(10)
    b_trying.set()
    with one_blas_thread():
        seen["entered after A left"] = a_out.is_set()
        seen["inside"] = count()
threads = [threading.Thread(target=f) for f in (a, b)]
for t in threads: t.start()
for t in threads: t.join(60)
print(before, seen["entered after A left"], seen["inside"], count())
"""


def test_one_blas_thread_in_two_threads_takes_turns_and_leaves_the_count_as_it_was() -> None:
    """B asks to enter while A is inside: B enters once A has left (entered and left out of order,
    two threadpoolctl limits left the count at 1 for good), runs on one thread, and the count is
    the process's own after. In a fresh process: threadpoolctl lets the first thread that sets a
    count own it, which this test process's own limit (conftest) would be."""
    r = subprocess.run([sys.executable, "-c", TWO_THREADS], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OPENBLAS_NUM_THREADS": "2"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["[2]", "True", "[1]", "[2]"], r.stdout


@pytest.mark.parametrize("bad", [0, -1, MAX_THREADS + 1, 1.5, True, "2", None])
def test_bad_thread_counts_are_refused(bad: object) -> None:
    with pytest.raises(UsageError, match="threads"):
        check_threads(bad)


def test_simulate_defaults_to_one_thread_and_records_it() -> None:
    cfg = SimulateConfig.from_options(**TINY)
    assert cfg.threads == DEFAULT_THREADS == 1
    torch.set_num_threads(2)
    try:
        result = run_experiment(cfg)
        assert result.environment["threads"] == 1  # read inside the run
        assert torch.get_num_threads() == 2  # restored after it
    finally:
        torch.set_num_threads(1)


def test_simulate_applies_threads_and_keeps_them_in_the_config() -> None:
    cfg = SimulateConfig.from_options(**TINY, threads=2)
    result = run_experiment(cfg)
    assert result.environment["threads"] == 2
    assert SimulateConfig.from_dict(cfg.to_dict()).threads == 2


def test_distributed_workers_run_with_the_threads_asked_for() -> None:
    """Each worker process sets them itself; the server all-gathers what each one measured."""
    out = CliRunner().invoke(app, ["simulate", "--engine", "distributed", "--nproc", "3", "--steps", "2",
                                   "--seeds", "1", "--strategies", "hogwild", "--eval-every", "0",
                                   "--data-bytes", "200000", "--threads", "2", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["distributed"]["threads_per_process"] == [2, 2, 2]
    assert doc["config"]["threads"] == 2


def test_cli_refuses_bad_threads_in_one_line() -> None:
    for cmd in (["simulate"], ["detect"]):
        assert_one_line_error(run_naig(*cmd, "--threads", "0"), 2, "--threads")


EXAMPLES = {  # script: (the extra it needs, its positional arguments)
    "ddp_gpt.py": (None, []), "router_loop.py": (None, []), "monitor_ddp.py": (None, []),
    "monitor_fsdp2.py": (None, []), "monitor_accelerate.py": ("accelerate", ["out"]),
    "monitor_lightning.py": ("lightning", ["out"]), "monitor_transformers.py": ("transformers", ["out"])}


@pytest.mark.parametrize("script", sorted(EXAMPLES))
def test_every_training_example_takes_threads_and_refuses_a_bad_count(script: str, tmp_path) -> None:
    """Each example that trains takes ``--threads`` and refuses 0 in one line, exit 2, before any work."""
    extra, positional = EXAMPLES[script]
    if extra:
        needs(extra, f"{script} needs the {extra} extra")
    r = run_python(ROOT / "examples" / script, *positional, "--threads", "0",
                   env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout[-500:], r.stderr[-500:])
    assert "--threads" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "out").exists()
