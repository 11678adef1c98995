"""naig.monitor.fsdp: the monitor inside FSDP2 ``fully_shard`` on 3 real gloo processes (CPU), and alone.

FSDP2 runs on CPU with gloo in torch 2.13 (reduce-scatter included). tests/monitor_fsdp_ranks.py
trains a small MLP sharded per Linear for 10 steps per run (detectors' window 8); rank 2 corrupts
its loss at step 10 (NaN, ×1000, or −1 with 1024 examples per rank). Measured there: all three
named alone at step 10 on every rank (×1000 by the individual norm and energy scores, the flip by
the individual cos score, z ≈ 43 > 22); the payloads' sketches equal the float64 sketch of each
rank's unsharded gradient exactly. HSDP (tests/monitor_hsdp_ranks.py: 4 ranks, a 2 × 2 replicate ×
shard mesh): bit-identical in log mode, and a NaN rank named among all 4 ranks on every rank.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.distributed.fsdp import fully_shard  # (also registers torch.ops.fsdp.chunk_cat)

from naig.errors import UsageError
from naig.monitor import Monitor, rank_signals
from naig.monitor.fsdp import fully_shard_monitor, layout_permutation
from naig.sketch import sketch_state_dict
from tests.conftest import flagged_steps, process_group_in_this_process, run_ranks


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    return run_ranks("tests.monitor_fsdp_ranks", tmp_path_factory.mktemp("monitor_fsdp"), timeout=240)


def test_log_mode_is_bit_identical_to_plain_fsdp(ranks: dict) -> None:
    runs = ranks["runs"]
    assert runs["log"]["params"] == runs["plain"]["params"]
    assert not flagged_steps(runs["log"]) and runs["log"]["modules"] == ["0", "2", "4"]
    assert runs["log"]["extra_bytes"] == 136 * 3  # one 16-float payload + records lost per FSDP module


@pytest.mark.parametrize("kind", ["scale", "flip", "skip", "raise"])
def test_every_rank_names_the_bad_rank_at_its_step_and_none_before(ranks: dict, kind: str) -> None:
    run, bad, step, world = ranks["runs"][kind], ranks["bad_rank"], ranks["bad_step"], ranks["world"]
    expected = [1.0 if r == bad else 0.0 for r in range(world)]
    assert flagged_steps(run) == {step: [expected] * world}, run["describe"][-1]
    assert f"rank {bad} on {run['hosts'][bad]} in module " in run["describe"][step - 1]


def test_skip_leaves_parameters_unchanged_and_raise_raises_on_every_rank(ranks: dict) -> None:
    world = ranks["world"]
    assert ranks["runs"]["skip"]["unchanged"] == [[1.0]] * world
    assert ranks["runs"]["skip"]["error"] == [[0.0]] * world
    assert ranks["runs"]["raise"]["error"] == [[1.0]] * world
    assert ranks["runs"]["raise"]["unchanged"] == [[1.0]] * world
    assert ranks["runs"]["log"]["unchanged"] == [[0.0]] * world
    assert "no update was applied" in ranks["runs"]["raise"]["error_text"]


def test_a_module_without_gradient_is_a_data_error_and_the_decisions_stay_in_step(ranks: dict) -> None:
    """Before, the step waited for the next step's first module: every later decision mixed two steps
    and rank 2's NaN at step 6 was not named there (the weights went NaN under ``skip``)."""
    from tests.monitor_fsdp_ranks import BAD_RANK, UNUSED, UNUSED_NAN

    for seen in ranks["runs"]["unused"]["ranks"]:
        errors = seen["errors"]
        assert [i + 1 for i, e in enumerate(errors) if e] == [UNUSED[0]], errors
        said = errors[UNUSED[0] - 1]
        assert "module(s) 2 did not reduce-scatter" in said
        assert "set_reduce_scatter_unused_params(True)" in said
        # one decision per step but the refused one, made in its own step
        assert seen["decided"] == [s - (s >= UNUSED[0]) for s in range(1, len(errors) + 1)], seen["decided"]
        assert [i + 1 for i, n in enumerate(seen["named"]) if n] == [UNUSED_NAN], seen["named"]
        assert seen["named"][UNUSED_NAN - 1] == [BAD_RANK] and seen["finite"]


def test_reentrant_checkpointing_decides_every_step(ranks: dict) -> None:
    """A checkpointed module (reentrant) reduces in a backward pass nested in the step's, which ends
    first: the completeness check waits for the outer pass (the first version raised a false
    DataError there, found by an adversarial review)."""
    for seen in ranks["runs"]["reentrant"]["ranks"]:
        assert seen["errors"] == [None] * 4 and seen["decided"] == [1, 2, 3, 4], seen


@pytest.mark.parametrize("kind", ["log", "skip", "scale", "flip"])
def test_signals_equal_a_single_process_float64_computation(ranks: dict, kind: str) -> None:
    run = ranks["runs"][kind]
    for grads, payload, recorded in zip(run["grads"], run["payloads"], run["signals"], strict=True):
        g = np.array(grads, dtype=np.float64)  # (K, n): each rank's gradient from an unsharded twin
        states = [_split(row, run["shapes"]) for row in g]
        sketches = np.stack([sketch_state_dict(s, 0, impl="numpy") for s in states])
        with np.errstate(invalid="ignore", over="ignore"):
            sq = (g * g).sum(1)
        bad = (~np.isfinite(g)).sum(1)
        p = np.array(payload)
        np.testing.assert_allclose(p[:, :14], sketches, rtol=1e-9, atol=1e-12 * np.nanmax(np.abs(sketches)))
        np.testing.assert_allclose(p[:, 14], sq, rtol=1e-12)
        np.testing.assert_array_equal(p[:, 15], bad)
        mine = rank_signals(sketches, sq, bad).to_dict()
        for key in ("sq_norm", "rel_norm", "energy", "cos", "sq_dist"):
            np.testing.assert_allclose(recorded[key], mine[key], rtol=1e-9, atol=1e-12, err_msg=key)


@pytest.fixture(scope="module")
def hsdp(tmp_path_factory) -> dict:
    return run_ranks("tests.monitor_hsdp_ranks", tmp_path_factory.mktemp("monitor_hsdp"), timeout=240)


def test_hsdp_log_is_bit_identical_and_compares_the_ranks_of_both_replicas(hsdp: dict) -> None:
    """A 2 × 2 (replicate × shard) mesh: the monitor's all-gather spans all 4 ranks."""
    runs, world, bad = hsdp["runs"], hsdp["world"], hsdp["bad_rank"]
    assert runs["log"]["params"] == runs["plain"]["params"]
    expected = [1.0 if r == bad else 0.0 for r in range(world)]
    flagged = {i + 1: v for i, v in enumerate(runs["log"]["flagged"]) if any(any(x) for x in v)}
    assert flagged == {hsdp["steps"]: [expected] * world}, runs["log"]["describe"]
    for grads, payload in zip(runs["log"]["grads"][:-1], runs["log"]["payloads"][:-1], strict=True):
        g = np.array(grads, dtype=np.float64)
        shapes = runs["log"]["shapes"]
        sketches = np.stack([sketch_state_dict(_split(row, shapes), 0, impl="numpy") for row in g])
        np.testing.assert_allclose(np.array(payload)[:, :14], sketches, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(np.array(payload)[:, 14], (g * g).sum(1), rtol=1e-12)


def _split(flat: np.ndarray, shapes: dict) -> dict[str, np.ndarray]:
    out, i = {}, 0
    for name, shape in shapes.items():
        n = math.prod(shape)
        out[name] = flat[i:i + n].reshape(shape)
        i += n
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_layout_permutation_is_fsdps_chunk_cat(world: int) -> None:
    sizes = ((5, 3), (7,), (2, 2, 2), (1,))
    flat = torch.arange(sum(math.prod(s) for s in sizes), dtype=torch.float32) + 1
    grads, i = [], 0
    for s in sizes:
        grads.append(flat[i:i + math.prod(s)].reshape(s))
        i += math.prod(s)
    perm = layout_permutation(sizes, world)
    out = torch.full((world, perm.size // world), -7.0)
    torch.ops.fsdp.chunk_cat(grads, dim=0, num_chunks=world, out=out)
    want = np.where(perm >= 0, flat.numpy()[np.maximum(perm, 0)], 0.0)
    np.testing.assert_array_equal(out.reshape(-1).numpy(), want)  # padding is written as 0


def test_refusals() -> None:
    with pytest.raises(UsageError, match="fully_shard first") as err:
        fully_shard_monitor(nn.Linear(3, 2))
    assert err.value.field == "module"
    with pytest.raises(UsageError, match="skip or raise") as err:
        fully_shard_monitor(nn.Linear(3, 2), Monitor(action="exclude"))
    assert err.value.field == "action"
    with pytest.raises(UsageError) as err:
        fully_shard_monitor(nn.Linear(3, 2), per_bucket=1)
    assert err.value.field == "per_bucket"
    with pytest.raises(UsageError) as err:
        fully_shard_monitor("model")
    assert err.value.field == "module"


def test_a_module_sharded_over_one_rank_is_refused() -> None:
    """With one rank FSDP copies instead of reduce-scattering: nothing would be seen, so it is refused."""
    with process_group_in_this_process():
        model = nn.Sequential(nn.Linear(3, 2))
        fully_shard(model)
        with pytest.raises(UsageError, match="not sharded") as err:
            fully_shard_monitor(model)
        assert err.value.field == "module"


def test_reducing_every_micro_batch_is_said_once_and_set_requires_gradient_sync_decides_once_a_step(
        ranks: dict) -> None:
    """Each of 2 micro-batches reduced: 2 decisions a step, and rank 0 says once that each micro-batch is
    a monitor step (until 2026-12-08 FSDP2's gradients, written after the decision, hid it with 2
    micro-batches); the first under set_requires_gradient_sync(False): one decision a step, nothing said."""
    every, quiet = ranks["runs"]["accumulate"], ranks["runs"]["accumulate_no_sync"]
    assert every["decisions"] == list(range(1, 9))
    assert len(every["warnings"]) == 1 and "set_requires_gradient_sync(False)" in every["warnings"][0]
    assert "(its steps 1 and 2)" in every["warnings"][0]
    assert quiet["decisions"] == [0, 1, 1, 2, 2, 3, 3, 4] and quiet["warnings"] == []
    # a step without optimizer.step() (a GradScaler's non-finite step), zero_grad() before the next: not
    # an accumulation, nothing said (the gradients FSDP wrote before the last module's decision in the same
    # backward pass are not a waiting micro-batch's: the check looks at the step's first module)
    assert ranks["runs"]["skipped_step"]["decisions"] == [1, 2, 3, 4]
    assert ranks["runs"]["skipped_step"]["warnings"] == []
