"""naig.monitor.ddp: the monitor wrapping torch's own DDP communication hooks, and ``detach()``.

tests/monitor_compose_ranks.py trains a small MLP on 3 gloo ranks for 6 steps per run; rank 2's
first parameter gets a NaN at step 6. The monitor reads each bucket before the inner hook
(``bf16_compress_hook``, ``powerSGD_hook``) reduces it: in ``log`` mode the run is bit-identical to
the inner hook alone, and the NaN rank is still named on every rank. ``detach()`` after step 3:
the monitor counts no more steps and acts on nothing (the NaN reaches the parameters).
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from naig.errors import UsageError
from naig.monitor import Monitor, MonitorHook
from tests.conftest import flagged_steps, process_group_in_this_process, run_ranks


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    return run_ranks("tests.monitor_compose_ranks", tmp_path_factory.mktemp("monitor_compose"), timeout=240)


@pytest.mark.parametrize("inner", ["bf16", "powersgd"])
def test_log_mode_is_bit_identical_to_the_inner_hook_alone(ranks: dict, inner: str) -> None:
    runs = ranks["runs"]
    assert runs[f"{inner}_log"]["params"] == runs[inner]["params"]
    assert runs[inner]["params"] != runs["plain"]["params"]  # the inner hook did compress
    assert not flagged_steps(runs[f"{inner}_log"]) and runs[f"{inner}_log"]["monitor_steps"] == 6


@pytest.mark.parametrize("kind", ["bf16_skip", "powersgd_raise"])
def test_a_nan_rank_is_named_on_every_rank_through_the_inner_hook(ranks: dict, kind: str) -> None:
    run, bad, step, world = ranks["runs"][kind], ranks["bad_rank"], ranks["bad_step"], ranks["world"]
    expected = [1.0 if r == bad else 0.0 for r in range(world)]
    assert flagged_steps(run) == {step: [expected] * world}
    assert run["describe"][step - 1].startswith(f"step {step}: rank {bad} on {run['hosts'][bad]} in bucket ")
    assert "non-finite gradient" in run["describe"][step - 1]
    assert run["unchanged"] == [[1.0]] * world and run["finite"] == [[1.0]] * world
    assert run["error"] == [[float(kind.endswith("raise"))]] * world


@pytest.mark.parametrize("kind, plain", [("detach", "plain"), ("fsdp_detach", "fsdp_plain")])
def test_detach_stops_reading_and_acting(ranks: dict, kind: str, plain: str) -> None:
    run, world = ranks["runs"][kind], ranks["world"]
    assert run["monitor_steps"] == ranks["detach_step"] and len(run["flagged"]) == ranks["detach_step"]
    assert run["error"] == [[0.0]] * world  # action raise, but detached: the NaN step went through
    assert run["finite"] == [[0.0]] * world
    assert run["params_before_bad"] == ranks["runs"][plain]["params_before_bad"]


# ----------------------------------------------------------------- one process (gloo, world 1)


@pytest.mark.parametrize("kwargs, needle", [
    ({"comm_hook": "bf16"}, "must be a DDP communication hook"),
    ({"comm_hook": default_hooks.allreduce_hook, "exact": True}, "exact statistics"),
    ({"comm_hook": default_hooks.allreduce_hook, "monitor": Monitor(action="exclude")}, "exclude reweights"),
])
def test_a_hook_it_cannot_wrap_is_refused(kwargs: dict, needle: str) -> None:
    with pytest.raises(UsageError, match=needle) as err:
        MonitorHook(torch.nn.Linear(3, 2), **kwargs)
    assert err.value.field == "comm_hook"


def test_a_second_comm_hook_is_a_usage_error_naming_comm_hook() -> None:
    with process_group_in_this_process():
        ddp = DistributedDataParallel(torch.nn.Linear(3, 2))
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        with pytest.raises(UsageError, match="comm_hook=") as err:
            MonitorHook(ddp).register(ddp)
        assert err.value.field == "ddp"


def test_detach_removes_the_optimizer_hook_and_passes_buckets_through() -> None:
    with process_group_in_this_process():
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        ddp = DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        hook = MonitorHook(model, Monitor(action="raise")).register(ddp)
        hook.attach(opt)
        ddp(torch.ones(2, 3)).sum().backward()
        opt.step()
        hook.detach()
        hook.detach()  # idempotent
        opt.zero_grad()
        (ddp(torch.ones(2, 3)).sum() * float("nan")).backward()  # would raise if still attached
        opt.step()
        assert hook.step == 1 and hook.decision is None and hook.detached
        assert torch.isnan(model.weight).all()
        with pytest.raises(UsageError, match="detached"):
            hook.attach(opt)
