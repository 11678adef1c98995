"""naig.monitor.replicas: the check that every rank holds the same weights (the DDP run is in
tests/test_monitor_ddp.py: a rank perturbed by 1% named from the next check, on every rank)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

from naig.errors import DataError, UsageError
from naig.monitor import Monitor, MonitorSketch
from naig.monitor.fsdp import fully_shard_monitor
from naig.monitor.replicas import (
    NOT_DUE,
    NOT_GIVEN,
    TOLERANCE,
    WEIGHTS_EVERY,
    ReplicaCheck,
    action_ranks,
    check_every,
    gradient_flagged,
    replica_departure,
)
from naig.monitor.signals import pack
from tests.conftest import process_group_in_this_process

N = 5000


def _rows(weights: list[torch.Tensor], blocks: int = 1) -> np.ndarray:
    sketch = MonitorSketch.build([("w", N)], seed=3, blocks=blocks)
    return torch.stack([pack(w, sketch) for w in weights]).numpy()


def _weights(k: int, seed: int = 0) -> list[torch.Tensor]:
    w = torch.randn(N, generator=torch.Generator().manual_seed(seed))
    return [w.clone() for _ in range(k)]


def test_identical_replicas_depart_by_exactly_zero():
    assert replica_departure(_rows(_weights(4))).tolist() == [0.0] * 4


@pytest.mark.parametrize("seed", range(5))
def test_a_one_percent_perturbation_is_named_and_float32_rounding_is_not(seed):
    ws = _weights(5, seed)  # three of five agree: the median is theirs, coordinate by coordinate
    gen = torch.Generator().manual_seed(100 + seed)
    ws[2] = ws[2] * (1 + 0.01 * torch.randn(N, generator=gen))  # the protocol's perturb: θ + 0.01 θ⊙z
    ws[1] = torch.nextafter(ws[1], torch.full_like(ws[1], math.inf))  # every entry one float32 ulp up
    u = replica_departure(_rows(ws))
    assert u[0] == u[3] == u[4] == 0.0
    assert 0 < u[1] < TOLERANCE / 10  # ~6e-8 relative: rounding, not a departure
    assert 3e-3 < u[2] < 3e-2  # ‖0.01 θ⊙z‖/‖θ‖ ≈ 0.01, to within the 14-float sketch's spread


def test_two_ranks_that_differ_both_depart_and_a_non_finite_rank_is_infinite():
    ws = _weights(2)
    ws[1] = ws[1] * 1.01
    u = replica_departure(_rows(ws))
    assert u[0] == pytest.approx(u[1]) and u[0] > TOLERANCE
    ws = _weights(3)
    ws[0][7] = float("nan")
    u = replica_departure(_rows(ws))
    assert u[0] == math.inf and u[1:].tolist() == [0.0, 0.0]
    assert replica_departure(_rows([ws[0]])).tolist() == [math.inf]


def test_more_blocks_measure_the_same_departure():
    ws = _weights(3)
    ws[2] = ws[2] * 1.001  # u = 1e-3 exactly in the norm term
    for blocks in (1, 4):
        u = replica_departure(_rows(ws, blocks))
        assert u[2] == pytest.approx(1e-3, rel=0.5) and u[0] == u[1] == 0.0


def test_bad_rows_and_bad_cadences_are_refused():
    with pytest.raises(UsageError, match="14\\*R \\+ 2") as err:
        replica_departure(np.zeros((3, 15)))
    assert err.value.field == "weights"
    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(UsageError) as err:
            check_every(bad)
        assert err.value.field == "weights_every"
    with pytest.raises(UsageError) as err:
        Monitor(weights_every=-2)
    assert err.value.field == "weights_every"


def test_checks_run_at_steps_one_and_every_n_after_and_a_named_rank_stays_named_until_it_agrees():
    check = ReplicaCheck(every=4)
    assert [s for s in range(12) if check.due(s)] == [0, 4, 8]  # steps done before steps 1, 5, 9
    assert ReplicaCheck().every == WEIGHTS_EVERY and not ReplicaCheck(every=0).due(0)
    good, ws = _rows(_weights(3)), _weights(3)
    ws[1] = ws[1] * 1.01
    bad = _rows(ws)
    assert check.update(1, good) == []
    first = check.update(5, bad)
    assert [(f.rank, f.signal, f.score, f.since) for f in first] == [(1, "weights", "mismatch", 5)]
    assert [(f.rank, f.since) for f in check.update(6, None)] == [(1, 5)]  # between checks: still named
    assert [(f.rank, f.since) for f in check.update(9, bad)] == [(1, 5)]  # since the first check naming it
    saved = check.state_dict()
    resumed = ReplicaCheck(every=4)
    resumed.load_state_dict(saved)
    assert [(f.rank, f.since, f.z) for f in resumed.update(10, None)] == \
        [(f.rank, f.since, f.z) for f in check.update(10, None)]
    assert check.update(13, good) == [] and check.update(14, None) == []  # back in agreement
    with pytest.raises(UsageError) as err:
        resumed.load_state_dict({"named": [[1]]})
    assert err.value.field == "state"


def _payload(k: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    rows = np.zeros((k, 16))
    rows[:, :14] = rng.normal(size=(k, 14))
    rows[:, 14] = (rows[:, :14] ** 2).sum(1)
    return rows


def test_decide_merges_the_replica_flags_into_the_decision_and_its_line():
    mon = Monitor(weights_every=2)
    ws = _weights(3)
    ws[0] = ws[0] * 1.02
    weights = _rows(ws)
    with pytest.warns(UserWarning):
        d1 = mon.decide(_payload(3), weights=weights)  # step 1: a check
    assert d1.ranks == (0,) and [f.signal for f in d1.flags] == ["weights"]
    assert "rank 0" in d1.describe() and "weights differ from the other ranks'" in d1.describe()
    assert mon.decide(_payload(3)).ranks == (0,)  # step 2: between checks, still named
    state = mon.state_dict()
    resumed = Monitor(weights_every=2)
    resumed.load_state_dict(state)
    assert resumed.decide(_payload(3)).ranks == mon.decide(_payload(3)).ranks == (0,)


def test_weights_given_on_some_ranks_only_is_a_data_error_and_on_none_no_check():
    rows = _rows(_weights(3))
    missing = rows.copy()
    missing[1] = math.nan
    missing[1, -1] = -1.0  # Monitor.weights_row(None): "not given"
    mon = Monitor()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused before the detector exists: no warm-up warning either
        with pytest.raises(DataError, match=r"ranks \[1\] gave no weights"):
            mon.decide(_payload(3), weights=missing)
    assert mon.detector is None
    none = np.tile(missing[1], (3, 1))
    with pytest.warns(UserWarning):
        assert Monitor().decide(_payload(3), weights=none).flags == ()


def test_observe_checks_the_weights_it_is_given_and_asks_for_them_when_told_to():
    model = nn.Linear(4, 3)
    mon = Monitor(weights_every=1)
    grads = {n: torch.ones_like(p) for n, p in model.named_parameters()}
    with pytest.raises(UsageError, match="weights=dict") as err:
        mon.observe(grads)
    assert err.value.field == "weights"
    with pytest.warns(UserWarning):
        # one rank: nothing to compare
        assert mon.observe(grads, weights=dict(model.named_parameters())).flags == ()
    row = mon.weights_row(dict(model.named_parameters()), torch.device("cpu"))
    assert row.dtype == torch.float64 and row.shape == (16,)
    assert row[-2].item() == pytest.approx(sum(float((p.double() ** 2).sum()) for p in model.parameters()))
    with pytest.raises(UsageError, match="not a float tensor") as err:
        mon.weights_row({"step": torch.tensor([3])}, torch.device("cpu"))
    assert err.value.field == "weights"


def test_fsdp2_refuses_an_explicit_replica_check():
    with process_group_in_this_process():
        model = nn.Sequential(nn.Linear(3, 2))
        fully_shard(model)
        with pytest.raises(UsageError, match="shards the weights") as err:
            fully_shard_monitor(model, Monitor(weights_every=8))
        assert err.value.field == "weights_every"


def test_weights_on_two_devices_add_up_to_the_whole_layouts_row():
    """A model spread over devices is packed device by device (here CPU and meta is not possible, so
    two halves of one layout on the CPU stand in: the per-part rows add up to the whole row)."""
    mon = Monitor()
    model = nn.Sequential(nn.Linear(6, 5), nn.Linear(5, 2))
    params = dict(model.named_parameters())
    whole = mon.weights_row(params, torch.device("cpu"))
    names = list(params)
    halves = [{n: params[n] for n in names[:2]}, {n: params[n] for n in names[2:]}]
    parts = sum(mon.weights_row(h, torch.device("cpu")) for h in halves)
    torch.testing.assert_close(parts, whole, rtol=1e-12, atol=1e-12)


def test_integer_parameters_are_left_out_and_a_sharded_dtensor_turns_the_check_off_with_a_warning():
    from torch.distributed.tensor import DeviceMesh, Shard, distribute_tensor

    from naig.monitor.integration import replicated_weights

    model = nn.Linear(4, 4)
    model.register_parameter("count", nn.Parameter(torch.tensor([3]), requires_grad=False))
    assert set(replicated_weights(model, Monitor())) == {"weight", "bias"}
    assert replicated_weights(model, Monitor(weights_every=0)) == {}
    with process_group_in_this_process():
        mesh = DeviceMesh("cpu", [0])
        model.weight = nn.Parameter(distribute_tensor(model.weight.detach(), mesh, [Shard(0)]))
        with pytest.warns(UserWarning, match="replica check is off .*'weight' is a sharded DTensor"):
            assert replicated_weights(model, Monitor()) == {}
        with pytest.raises(UsageError, match="sharded DTensor") as err:
            replicated_weights(model, Monitor(weights_every=8))
        assert err.value.field == "weights_every"


def _flag_rows(k: int, off: tuple[int, ...]) -> np.ndarray:
    ws = _weights(k)
    for r in off:
        ws[r] = ws[r] * 1.01
    return _rows(ws)


def test_ranks_at_another_step_are_a_data_error_not_a_crash():
    """Every step carries the row (NaN, count NOT_DUE between checks), so ranks whose step counts
    disagree gather the same width; the check then names them."""
    rows = _flag_rows(3, ())
    rows[2] = math.nan
    rows[2, -1] = NOT_DUE
    mon = Monitor()
    with pytest.raises(DataError, match=r"ranks \[2\] are not at a replica-check"):
        mon.decide(_payload(3), weights=rows)
    assert mon.detector is None  # refused before anything changed
    idle = np.tile(rows[2], (3, 1))
    with pytest.warns(UserWarning):
        assert Monitor().decide(_payload(3), weights=idle).flags == ()


def test_turning_the_check_off_or_a_check_without_weights_clears_the_names():
    mon = Monitor()
    with pytest.warns(UserWarning):
        assert mon.decide(_payload(3), weights=_flag_rows(3, (2,))).ranks == (2,)
    off = Monitor(weights_every=0)
    off.load_state_dict(mon.state_dict())
    assert off.decide(_payload(3)).ranks == ()
    missing = np.full((3, 16), math.nan)
    missing[:, -1] = NOT_GIVEN
    assert mon.decide(_payload(3), weights=missing).ranks == ()  # a check step nobody vouched for


def test_a_state_that_fails_to_load_changes_nothing():
    mon = Monitor()
    with pytest.warns(UserWarning):
        mon.decide(_payload(3), weights=_flag_rows(3, (2,)))
    state = mon.state_dict()
    fresh = Monitor()
    with pytest.raises(UsageError):
        fresh.load_state_dict({**state, "detector": {"settings": {}}})
    assert fresh.replicas.named == {} and fresh.detector is None


@pytest.mark.parametrize("named", [[[2, 1, 0.5], [2, 1, 0.5]], [[1.5, 1, 0.5]], [[2, 0.5, 0.5]],
                                   [["2", 1, 0.5]]],
                         ids=["duplicate", "fractional-rank", "fractional-step", "string-rank"])
def test_a_replica_state_naming_a_rank_twice_or_by_a_fraction_is_refused(named: list):
    """A rank named twice loaded as its last entry, 1.5 as rank 1 and "2" as rank 2: refused, and the
    refused load changes nothing."""
    mon = Monitor()
    with pytest.warns(UserWarning):
        mon.decide(_payload(3), weights=_flag_rows(3, (2,)))
    state = mon.state_dict()
    assert state["replicas"]["named"][0][0] == 2
    fresh = Monitor()
    with pytest.raises(UsageError, match="each rank of the run once, a whole step"):
        fresh.load_state_dict({**state, "replicas": {"named": named}})
    assert fresh.replicas.named == {} and fresh.detector is None
    fresh.load_state_dict({**state, "replicas": {"named": [[2.0, 1.0, 0.5]]}})  # whole floats: as ints
    assert fresh.replicas.named == {2: (1, 0.5)}


def test_skip_does_not_act_on_weights_and_exclude_keeps_a_majority():
    from naig.monitor import Decision, Flag

    def decision(world: int, flags: list[tuple[int, str]]) -> Decision:
        return Decision(9, world, "exclude", tuple(Flag(r, s, "mismatch" if s == "weights" else "transient",
                                                        1.0, 1.0, 9) for r, s in flags))

    one = decision(4, [(1, "weights")])
    assert action_ranks(one) == (1,) and not gradient_flagged(one)
    assert action_ranks(decision(2, [(0, "weights"), (1, "weights")])) == ()  # K = 2: who is wrong is unknown
    assert action_ranks(decision(4, [(0, "weights"), (1, "weights")])) == ()  # no majority
    both = decision(4, [(0, "weights"), (1, "weights"), (3, "norm")])
    assert action_ranks(both) == (3,) and gradient_flagged(both)


def test_non_finite_weights_say_so():
    ws = _weights(3)
    ws[1][0] = float("inf")
    mon = Monitor()
    with pytest.warns(UserWarning):
        line = mon.decide(_payload(3), weights=_rows(ws)).describe()
    assert "rank 1" in line and "weights not finite" in line


def test_the_parameters_ddp_ignores_are_left_out():
    from torch.nn.parallel import DistributedDataParallel

    from naig.monitor import MonitorHook

    with process_group_in_this_process():
        model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2))
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ["1.weight"])
        ddp = DistributedDataParallel(model)
        hook = MonitorHook(model)
        assert set(hook.weights) == {"0.weight", "0.bias", "1.bias"}
        hook.register(ddp)
        assert set(hook.weights) == {"0.weight", "0.bias", "1.bias"}


def test_register_after_attach_keeps_the_optimizer_and_the_step_count():
    """register() sets the replica check's parameters again (DDP's ignore list) and nothing else."""
    from torch.nn.parallel import DistributedDataParallel

    from naig.monitor import MonitorHook

    with process_group_in_this_process():
        model = nn.Linear(3, 2)
        ddp = DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        hook = MonitorHook(model, Monitor(action="skip")).attach(opt)
        hook.register(ddp)
        with pytest.warns(UserWarning, match="warm-up"):
            ddp(torch.randn(4, 3)).square().mean().backward()  # skip without an optimizer would refuse
        opt.step()
        assert hook.step == 1 and hook.decision is not None and not hook.decision.flagged
