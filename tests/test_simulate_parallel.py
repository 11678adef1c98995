"""Runs side by side (naig.simulate.parallel): identical results, every event heard, refused where it
does not apply."""

import dataclasses
import multiprocessing as mp
import os

import pytest
import torch

from naig.errors import RunError, UsageError
from naig.simulate import SimulateConfig, run_experiment
from naig.simulate.engines.simulated import SimulatedSession
from naig.simulate.parallel import available_cores, resolve_jobs

BASE = dict(steps=6, seeds=2, data_bytes=200_000, lags=(0, 2), eval_every=3, strategies=("naig", "hogwild"))


def _numbers(run) -> dict:
    """Every field of a run but its wall time (NaN-free here, so == compares every number)."""
    return {k: v for k, v in dataclasses.asdict(run).items() if k != "ms_per_step"}


def test_two_processes_give_every_number_of_one_process_and_every_event(tmp_path) -> None:
    events: dict[int, list] = {1: [], 2: []}
    results = {}
    for jobs in (1, 2):
        cfg = SimulateConfig.from_options(**BASE, jobs=jobs, log_dir=str(tmp_path / str(jobs)))
        results[jobs] = run_experiment(cfg, events[jobs].append)
    one, two = results[1], results[2]
    assert [_numbers(r) for r in one.runs] == [_numbers(r) for r in two.runs]
    assert one.untrained_val_loss == two.untrained_val_loss
    key = lambda e: (e.strategy, e.seed, e.lr, e.step, e.val_loss)  # noqa: E731
    assert sorted(map(key, events[1])) == sorted(map(key, events[2])) and len(events[2]) == 4 * 6
    logs = {jobs: sorted(p.name for p in (tmp_path / str(jobs)).iterdir()) for jobs in (1, 2)}
    assert logs[1] == logs[2] and len(logs[2]) == 4
    for name in logs[1]:
        assert (tmp_path / "1" / name).read_text() == (tmp_path / "2" / name).read_text()


def test_a_process_builds_one_context_per_seed_not_one_per_run(tmp_path, monkeypatch) -> None:
    """θ_0's evaluation and the seed's batches are made once per seed in each process, as with one
    process (until 2026-12-07 a child rebuilt them for every run: 3 of the 9 s of CPU of 12 small
    runs on two processes); the saved gradient files are each reported once."""
    calls = tmp_path / "contexts.txt"
    real = SimulatedSession.context

    def context(self, seed, progress):  # (in the forked children, which inherit the patch)
        with calls.open("a") as fh:
            fh.write(f"{os.getpid()} {seed}\n")
        return real(self, seed, progress)

    monkeypatch.setattr(SimulatedSession, "context", context)
    cfg = SimulateConfig.from_options(**{**BASE, "strategies": ("naig", "hogwild", "sync")}, jobs=2,
                                      save_grads=str(tmp_path / "grads"), save_at=(3,))
    result = run_experiment(cfg)
    made = [tuple(map(int, line.split())) for line in calls.read_text().splitlines()]
    assert len(result.runs) == 6 and len(set(made)) == len(made) <= 2 * 2, made  # (process, seed) once
    saved = result.saved_files
    assert len(set(saved)) == len(saved) == 6 * 3, saved  # (a reference and two workers per run)


def test_auto_is_one_process_per_core_at_most_one_per_run() -> None:
    cfg = SimulateConfig.from_options(**BASE)
    assert cfg.jobs == 0
    assert resolve_jobs(cfg, 4, "cpu") == min(available_cores(), 4)
    assert resolve_jobs(cfg, 1, "cpu") == 1
    assert resolve_jobs(SimulateConfig.from_options(**BASE, jobs=3), 2, "cpu") == 2
    assert resolve_jobs(cfg, 4, "cuda") == 1


@pytest.mark.parametrize("bad", [-1, 1025, True, 2.0, "2"])
def test_bad_jobs_are_refused_naming_the_option(bad) -> None:
    with pytest.raises(UsageError, match="jobs"):
        SimulateConfig.from_options(**BASE, jobs=bad)


def test_jobs_beyond_one_is_refused_where_runs_cannot_go_side_by_side() -> None:
    with pytest.raises(UsageError, match="distributed engine runs its own processes"):
        SimulateConfig.from_options(engine="distributed", nproc=3, steps=2, seeds=1, jobs=2)
    assert SimulateConfig.from_options(engine="distributed", nproc=3, steps=2, seeds=1, jobs=0).jobs == 0
    cfg = SimulateConfig.from_options(**BASE, jobs=2)
    with pytest.raises(UsageError, match="CUDA"):
        resolve_jobs(cfg, 4, "cuda")


def test_cli_refuses_bad_jobs_in_one_line_in_every_mode() -> None:
    from tests.conftest import assert_one_line_error, run_naig

    assert_one_line_error(run_naig("simulate", "--jobs", "-1"), 2, "--jobs")
    assert_one_line_error(run_naig("simulate", "--engine", "distributed", "--nproc", "3", "--jobs", "2"), 2,
                          "--jobs")


def test_a_process_that_has_used_cuda_runs_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """After CUDA autograd in this process a forked child fails ('autograd's threading in combination with
    fork', seen on an H200 when a CUDA test ran first): auto falls back to one process, jobs = 2 is
    refused."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert resolve_jobs(SimulateConfig.from_options(**BASE), 4, "cpu") == 1
    with pytest.raises(UsageError, match="used CUDA") as err:
        resolve_jobs(SimulateConfig.from_options(**BASE, jobs=2), 4, "cpu")
    assert err.value.field == "jobs"


def _failing(monkeypatch: pytest.MonkeyPatch, fail) -> None:
    """Make hogwild seed 1's run call ``fail()`` (in the forked child, which inherits the patch)."""
    real = SimulatedSession.run

    def run(self, rule, seed, lr, ctx):
        if (rule, seed) == ("hogwild", 1):
            fail()
        return real(self, rule, seed, lr, ctx)

    monkeypatch.setattr(SimulatedSession, "run", run)


def test_a_run_that_raises_in_a_child_raises_in_the_parent_and_no_child_is_left(monkeypatch) -> None:
    def fail():
        raise ValueError("hogwild seed 1 broke")

    _failing(monkeypatch, fail)
    before = set(mp.active_children())  # (this test process's own: the warm python server)
    with pytest.raises(ValueError, match="hogwild seed 1 broke"):
        run_experiment(SimulateConfig.from_options(**BASE, jobs=2))
    assert set(mp.active_children()) <= before


@pytest.mark.parametrize(("fail", "how"), [(lambda: os._exit(3), "exited with code 3"),
                                           (lambda: os.kill(os.getpid(), 9), "was killed by signal 9")])
def test_a_child_that_dies_names_its_run_and_no_child_is_left(monkeypatch, fail, how: str) -> None:
    _failing(monkeypatch, fail)
    before = set(mp.active_children())
    with pytest.raises(RunError, match=rf"running hogwild seed 1 lr 0\.001 {how} before its result; set "
                                       "`jobs` to 1"):
        run_experiment(SimulateConfig.from_options(**BASE, jobs=2))
    assert set(mp.active_children()) <= before
