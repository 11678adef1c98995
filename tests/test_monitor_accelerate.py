"""naig.monitor.accelerate: ``watch`` in real Accelerate loops under torchrun (3 gloo processes, CPU),
and alone.

tests/monitor_accelerate_ranks.py trains an MLP for 12 optimizer steps per run with the detectors'
window 8; rank 2's loss is ×1000 at step 12. Measured there: rank 2 named alone at step 12 on every
rank (energy and norm transient scores), in every action and with gradient accumulation (2
micro-batches per step: 12 decisions, on the micro-batches that sync); ``skip`` and ``raise`` leave
step 12's parameters unchanged on every rank; ``log`` ends bit-identical to the loop without
``watch`` (with and without accumulation); a loop resumed with ``load_state`` after step 6 decides
exactly as the uninterrupted one, one whose state lacks the monitor's file does not name rank 2.
Skipped without the ``accelerate`` extra.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest

pytest.importorskip("accelerate", reason="the Accelerate integration needs the accelerate extra")

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402

from naig.errors import UsageError  # noqa: E402
from naig.monitor import Monitor  # noqa: E402
from naig.monitor.accelerate import ONE_PROCESS, watch  # noqa: E402
from tests.conftest import assert_no_leftovers, flagged_steps, run_python  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("monitor_accelerate")
    out = tmp / "out.json"
    env = {**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
           "-m", "tests.monitor_accelerate_ranks", str(out)]
    try:
        r = run_python(*cmd, timeout=300, env=env, cwd=tmp)
    finally:
        assert_no_leftovers(str(tmp), wait=15)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


def _views(run: dict) -> dict:
    """``flagged_steps`` of a run whose ``flagged`` is (K ranks, steps, K)."""
    return flagged_steps({"flagged": [list(step) for step in zip(*run["flagged"], strict=True)]})


@pytest.mark.parametrize("kind", ["log", "skip", "raise", "accumulate"])
def test_every_rank_names_the_x1000_rank_at_its_step(ranks: dict, kind: str) -> None:
    run, bad, step, world = ranks["runs"][kind], ranks["bad_rank"], ranks["bad_step"], ranks["world"]
    expected = [1.0 if r == bad else 0.0 for r in range(world)]
    assert _views(run) == {step: [expected] * world}
    assert run["describe"][step - 1].startswith(f"step {step}: rank {bad} on {run['hosts'][bad]} in bucket ")
    assert run["monitor_steps"] == step  # one decision per optimizer step, accumulation or not


@pytest.mark.parametrize("kind, plain", [("log", "plain"), ("accumulate", "accumulate_plain")])
def test_log_mode_is_bit_identical_to_the_loop_without_it(ranks: dict, kind: str, plain: str) -> None:
    assert ranks["runs"][kind]["params"] == ranks["runs"][plain]["params"]
    assert ranks["runs"][kind]["unchanged"] == [[0.0]] * ranks["world"]


def test_skip_and_raise_leave_the_parameters_unchanged_on_every_rank(ranks: dict) -> None:
    world = ranks["world"]
    for kind in ("skip", "raise"):
        assert ranks["runs"][kind]["unchanged"] == [[1.0]] * world, kind
    assert ranks["runs"]["skip"]["error"] == [[0.0]] * world
    assert ranks["runs"]["raise"]["error"] == [[1.0]] * world


def test_a_resumed_loop_keeps_the_detectors_state(ranks: dict) -> None:
    runs, step, resume = ranks["runs"], ranks["bad_step"], ranks["resume_step"]
    assert runs["resumed"]["describe"] == runs["log"]["describe"][resume:]
    assert _views(runs["resumed"]) == {step - resume: _views(runs["log"])[step]}
    assert not _views(runs["fresh"])  # without the monitor's state the history is too short


def test_a_resumed_loop_ends_where_the_resumed_loop_without_the_monitor_does(ranks: dict) -> None:
    """``watch`` (log) changes no parameter on resume either; a resumed loop and the uninterrupted one
    differ in the last bits with or without the monitor (Accelerate's and DDP's resume, not naig's)."""
    runs = ranks["runs"]
    assert runs["resumed"]["params"] == runs["plain_resumed"]["params"]
    plain = zip(runs["plain_resumed"]["params"], runs["plain"]["params"], strict=True)
    assert max(abs(a - b) for a, b in plain) < 1e-6


def test_watch_before_prepare_says_after_prepare_and_a_second_watch_needs_the_first_detached(
        ranks: dict) -> None:
    said = ranks["runs"]["order"]
    assert "is a Sequential, not DistributedDataParallel: pass the model accelerator.prepare returned, " \
           "after prepare" in said["before"]
    assert "not detached: call its detach() first" in said["again"]
    assert said["steps"] == [0, 1]  # the detached hook handed the step to the new one


def test_one_process_says_so_once_and_returns_a_detached_hook() -> None:
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(3, 2)
    model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hook = watch(acc, model, opt, Monitor(action="raise"))
    assert [str(w.message) for w in caught] == [ONE_PROCESS]
    assert hook.detached and hook.decision is None
    (model(torch.ones(2, 3)).sum() * float("nan")).backward()
    opt.step()  # nothing raised: detached


def test_not_an_accelerator_is_a_usage_error() -> None:
    with pytest.raises(UsageError) as err:
        watch("acc", torch.nn.Linear(3, 2), torch.optim.SGD(torch.nn.Linear(3, 2).parameters(), lr=0.1))
    assert err.value.field == "accelerator"
