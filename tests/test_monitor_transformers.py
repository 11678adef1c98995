"""naig.monitor.transformers: ``MonitorCallback`` in real ``transformers.Trainer`` runs under torchrun
(3 gloo processes, CPU), and alone.

tests/monitor_transformers_ranks.py trains a 2-layer GPT-2 built from a config (nothing downloaded)
for 12 steps per run with the detectors' window 8; rank 2's loss is ×1000 at step 12. Measured
there: rank 2 named alone at step 12 on every rank (energy and norm transient scores), in every
action; ``skip`` and ``raise`` leave step 12's parameters unchanged on every rank; ``log`` ends
bit-identical to the run without the callback; a run resumed from the step-6 checkpoint decides
exactly as the uninterrupted one, a resume from a checkpoint without the callback's state does not
name rank 2. Skipped without the ``transformers`` extra.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch

from naig.errors import UsageError
from naig.monitor import Monitor
from tests.conftest import assert_no_leftovers, flagged_steps, needs, run_python

needs("transformers", "the Hugging Face Trainer integration needs the transformers extra")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("monitor_transformers")
    out = tmp / "out.json"
    env = {**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
           "-m", "tests.monitor_transformers_ranks", str(out)]
    try:
        r = run_python(*cmd, timeout=420, env=env, cwd=tmp)
    finally:
        assert_no_leftovers(str(tmp), wait=15)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


def _views(run: dict) -> dict:
    """``flagged_steps`` of a run whose ``flagged`` is (K ranks, steps, K)."""
    return flagged_steps({"flagged": [list(step) for step in zip(*run["flagged"], strict=True)]})


@pytest.mark.parametrize("kind", ["log", "skip", "raise"])
def test_every_rank_names_the_x1000_rank_at_its_step(ranks: dict, kind: str) -> None:
    run, bad, step, world = ranks["runs"][kind], ranks["bad_rank"], ranks["bad_step"], ranks["world"]
    expected = [1.0 if r == bad else 0.0 for r in range(world)]
    assert _views(run) == {step: [expected] * world}
    assert run["describe"][step - 1].startswith(f"step {step}: rank {bad} on {run['hosts'][bad]} in bucket ")


def test_log_mode_is_bit_identical_to_the_run_without_the_callback(ranks: dict) -> None:
    runs = ranks["runs"]
    assert runs["log"]["params"] == runs["plain"]["params"]
    assert runs["log"]["unchanged"] == [[0.0]] * ranks["world"]  # the ×1000 step was applied


def test_skip_and_raise_leave_the_parameters_unchanged_on_every_rank(ranks: dict) -> None:
    world = ranks["world"]
    for kind in ("skip", "raise"):
        assert ranks["runs"][kind]["unchanged"] == [[1.0]] * world, kind
    assert ranks["runs"]["skip"]["error"] == [[0.0]] * world
    assert ranks["runs"]["raise"]["error"] == [[1.0]] * world
    assert "no update was applied" in ranks["runs"]["raise"]["error_text"]


def test_on_log_hands_the_reporters_the_scalars_and_a_flagged_step_is_logged(ranks: dict) -> None:
    run, step = ranks["runs"]["log"], ranks["bad_step"]
    logged = run["logged"]  # a callback listed before the monitor's: it runs after it
    assert sorted({s for s, _ in logged}) == [5, 10, step]  # logging_steps 5; step 12 flagged (and last)
    rows = {s: m for s, m in logged}
    assert rows[step]["naig_monitor/flagged_ranks"] == 1.0 and rows[step]["naig_monitor/max_rank"] == 2.0
    assert rows[5]["naig_monitor/flagged_ranks"] == 0.0 and rows[5]["naig_monitor/step"] == 5.0
    assert run["detached"]


def test_a_resumed_run_keeps_the_detectors_state(ranks: dict) -> None:
    runs, step, resume = ranks["runs"], ranks["bad_step"], ranks["resume_step"]
    assert runs["resumed"]["describe"] == runs["log"]["describe"][resume:]
    assert _views(runs["resumed"]) == {step - resume: _views(runs["log"])[step]}
    assert runs["resumed"]["params"] == runs["log"]["params"]
    assert not _views(runs["fresh"])  # without the state the history is too short: rank 2 not named


# ----------------------------------------------------------------- one process


# (naig.monitor.transformers, and with it the Trainer, is imported by the tests that run in this process,
# as in test_monitor_lightning.py, not when the module is collected: ~1.7 s of CPU in every xdist worker)
def _tiny_trainer(tmp: Path, callback: object, **args: object):
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=8))
    ids = torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(0))
    data = [{"input_ids": x, "labels": x} for x in ids]
    targs = TrainingArguments(output_dir=str(tmp), use_cpu=True, per_device_train_batch_size=2, max_steps=2,
                              report_to=[], save_strategy="no", disable_tqdm=True, **args)
    return Trainer(model=model, args=targs, train_dataset=data, callbacks=[callback])


def test_one_process_says_so_once_and_trains(tmp_path: Path) -> None:
    from naig.monitor.transformers import ONE_PROCESS, MonitorCallback

    cb = MonitorCallback(Monitor(action="raise"))
    trainer = _tiny_trainer(tmp_path, cb)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    assert [str(w.message) for w in caught if str(w.message) == ONE_PROCESS] == [ONE_PROCESS]
    assert cb.watch is None and trainer.state.global_step == 2


def test_restoring_callbacks_from_arguments_is_refused(tmp_path: Path) -> None:
    from naig.monitor.transformers import MonitorCallback

    trainer = _tiny_trainer(tmp_path, MonitorCallback(), restore_callback_states_from_checkpoint=True)
    with pytest.raises(UsageError, match="restore_callback_states_from_checkpoint") as err:
        trainer.train()
    assert "\n" not in str(err.value)


def test_called_by_hand_it_says_it_needs_a_trainer() -> None:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from naig.monitor.transformers import MonitorCallback

    with pytest.raises(UsageError, match="transformers.Trainer"):
        MonitorCallback().on_train_begin(TrainingArguments(output_dir="x", report_to=[]), TrainerState(),
                                         TrainerControl())


def test_bad_arguments_are_usage_errors() -> None:
    from naig.monitor.transformers import MonitorCallback

    with pytest.raises(UsageError) as err:
        MonitorCallback("log")
    assert err.value.field == "monitor"
    # checked when built, not when training begins (never, on one process) (a review, 2026-12-07)
    for kwargs, field in (({"exact": "yes"}, "exact"), ({"per_bucket": 1}, "per_bucket"),
                          ({"per_rank": None}, "per_rank"),
                          ({"exact": True, "monitor": Monitor(action="exclude")}, "exact")):
        with pytest.raises(UsageError) as err:
            MonitorCallback(**kwargs)
        assert err.value.field == field
