"""naig.monitor.ddp: ``MonitorHook`` inside DistributedDataParallel, on 3 real gloo processes and alone.

tests/monitor_ddp_ranks.py trains a small MLP (2 DDP buckets per step) for 10 steps per run; the
detectors' window is 8; rank 2 corrupts its gradient at step 10. Measured there: NaN and ×1000
are named alone at step 10 on every rank (×1000 by the individual norm and energy scores: with
K = 3 the relative score has 2 references and a threshold of thousands); a sign flip is named by
the individual cos score (z ≈ 62 > 22) when the ranks' gradients agree (1024 examples per rank).
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from naig.errors import UsageError
from naig.monitor import BadRankError, Monitor, MonitorHook, monitor_comm_hook, rank_signals
from naig.sketch import sketch_state_dict
from tests.conftest import flagged_steps, process_group_in_this_process, run_ranks


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    return run_ranks("tests.monitor_ddp_ranks", tmp_path_factory.mktemp("monitor_ddp"), timeout=240)


def test_log_mode_is_bit_identical_to_plain_ddp(ranks: dict) -> None:
    runs = ranks["runs"]
    assert runs["log"]["params"] == runs["plain"]["params"]
    assert runs["log_exact"]["params"] == runs["plain"]["params"]
    assert not flagged_steps(runs["log"]) and not flagged_steps(runs["log_exact"])


@pytest.mark.parametrize("kind", ["flip", "skip", "raise", "exclude", "warn"])
def test_every_rank_names_the_bad_rank_at_its_step_and_none_before(ranks: dict, kind: str) -> None:
    run, bad, step, world = ranks["runs"][kind], ranks["bad_rank"], ranks["bad_step"], ranks["world"]
    expected = [1.0 if r == bad else 0.0 for r in range(world)]
    assert flagged_steps(run) == {step: [expected] * world}, run["describe"][-1]
    line = run["describe"][step - 1]
    assert f"rank {bad} on {run['hosts'][bad]} in bucket " in line and "parameters)" in line


def test_a_rank_whose_weights_were_perturbed_is_named_from_the_next_check_on_every_rank(ranks: dict) -> None:
    """Weights ×(1 + 0.01 z) on one rank after step 5's update; checks at steps 1, 5, 9: named by the
    replica check at steps 9 and 10 (since 9), on every rank; the clean runs' checks name nobody."""
    run, bad, world = ranks["runs"]["desync"], ranks["bad_rank"], ranks["world"]
    every, after = ranks["weights_every"], ranks["desync_step"]
    first = next(s for s in range(after + 1, 100) if (s - 1) % every == 0)
    assert run["weight_flags"][:first - 1] == [[]] * (first - 1)
    assert run["weight_flags"][first - 1:] == [[[bad, first]]] * (len(run["weight_flags"]) - first + 1)
    expected = [1.0 if r == bad else 0.0 for r in range(world)]
    for step in range(first, len(run["flagged"]) + 1):
        assert run["flagged"][step - 1] == [expected] * world, step
    assert "weights differ" in run["describe"][-1]
    if all(f[1] == "weights" for f in run["flags"][-1]):  # named by the replica check alone: no bucket
        assert " in bucket" not in run["describe"][-1]
    for name in ("log", "skip", "flip"):  # replicas in sync: checked at steps 1 and 9, never named
        assert ranks["runs"][name]["weight_flags"] == [[]] * len(ranks["runs"][name]["flagged"])


def test_no_action_stops_training_for_desynchronised_weights(ranks: dict) -> None:
    """skip does not skip for the replica check (it cannot repair weights; skipping every step would
    stop training); exclude leaves the named rank out of the mean while the majority agrees (K = 3)."""
    bad, step = ranks["bad_rank"], ranks["bad_step"]  # step 10: after the check of step 9 named it
    for name in ("desync_skip", "desync_exclude"):
        run = ranks["runs"][name]
        assert run["weight_flags"][step - 1] == [[bad, 9]], name
        assert run["unchanged"] == [[0.0]] * ranks["world"], name  # the update was applied on every rank
    grads = np.array(ranks["runs"]["desync_exclude"]["grads"][step - 1], dtype=np.float64)
    others = [r for r in range(ranks["world"]) if r != bad]
    np.testing.assert_allclose(ranks["runs"]["desync_exclude"]["synced"], grads[others].mean(axis=0),
                               rtol=1e-6, atol=1e-7)


def test_nan_is_located_in_its_bucket(ranks: dict) -> None:
    run = ranks["runs"]["skip"]
    where = run["where"][ranks["bad_step"] - 1][str(ranks["bad_rank"])]
    bucket = next(b for b in run["buckets"] if "0.weight" in b)  # the NaN is in the first parameter
    assert where.startswith(f"bucket {run['buckets'].index(bucket)} (")
    assert "non-finite" in run["describe"][-1]


def test_skip_leaves_parameters_and_optimizer_state_unchanged_on_every_rank(ranks: dict) -> None:
    run, step = ranks["runs"]["skip"], ranks["bad_step"]
    assert run["unchanged"] == [[1.0]] * ranks["world"]
    assert run["adam_steps"] == [[float(step - 1)]] * ranks["world"]  # Adam's state skipped the step too
    assert ranks["runs"]["log"]["unchanged"] == [[0.0]] * ranks["world"]  # a normal step does change them


def test_raise_raises_on_every_rank_before_the_update(ranks: dict) -> None:
    run = ranks["runs"]["raise"]
    assert run["error"] == [[1.0]] * ranks["world"] and run["unchanged"] == [[1.0]] * ranks["world"]
    assert run["error_text"].startswith(f"step {ranks['bad_step']}: rank {ranks['bad_rank']} on ")
    assert "no update was applied" in run["error_text"]


def test_accumulation_reducing_every_micro_batch_is_said_and_no_sync_acts_on_the_step(ranks: dict) -> None:
    """×1000 on the first of 3 micro-batches. Each reduced: each is a decision, the first names the rank,
    the last (its gradient the all-reduced earlier ones plus its own) does not, and skip acts on the
    last one only, as rank 0 says once. Under no_sync() (Lightning, the Trainer, Accelerate): one
    decision per step, on the accumulated gradient, which skip skips, and nothing to say."""
    every, quiet = ranks["runs"]["accumulate"], ranks["runs"]["accumulate_no_sync"]
    step, bad, world, micro = ranks["bad_step"], ranks["bad_rank"], ranks["world"], ranks["micro"]
    assert every["decisions"] == list(range(1, micro * ranks["steps"] + 1))  # one per reduced micro-batch
    first, last = micro * (step - 1), micro * step - 1  # the bad step's first and last decisions (0-based)
    assert every["flagged"][first] == [bad] and every["flagged"][last] == []
    assert every["unchanged"] == [[0.0]] * world  # the last decision is clean: skip does not act
    assert len(every["warnings"]) == 1 and "skip acts on the last one's decision only" in every["warnings"][0]
    assert "no_sync()" in every["warnings"][0]
    assert quiet["decisions"][micro - 1::micro] == list(range(1, ranks["steps"] + 1))  # one per step
    assert quiet["flagged"][last] == [bad] and quiet["unchanged"] == [[1.0]] * world
    assert not quiet["warnings"]


def test_exclude_all_reduces_the_mean_of_the_other_ranks(ranks: dict) -> None:
    run, step, bad = ranks["runs"]["exclude"], ranks["bad_step"], ranks["bad_rank"]
    grads = np.array(run["grads"][step - 1], dtype=np.float64)  # (K, n) every rank's own gradient
    others = [r for r in range(ranks["world"]) if r != bad]
    want = grads[others].mean(axis=0)
    np.testing.assert_allclose(run["synced"], want, rtol=1e-6, atol=1e-7)
    assert not np.allclose(grads.mean(axis=0), want, rtol=1e-2)  # the plain mean would differ


def test_warn_writes_one_line_on_rank_zero(ranks: dict) -> None:
    run = ranks["runs"]["warn"]
    assert len(run["warnings"]) == 1 and "\n" not in run["warnings"][0]
    assert run["warnings"][0] == run["describe"][ranks["bad_step"] - 1]
    # skip and exclude change training: they write the same line, saying what they did; log says nothing
    for kind, said in (("skip", "(skip: this step's optimizer update is skipped on every rank)"),
                       ("exclude", "left out of this step's mean)")):
        if kind in ranks["runs"]:
            lines = ranks["runs"][kind]["warnings"]
            assert len(lines) == 1 and said in lines[0]
            assert lines[0].startswith(f"step {ranks['bad_step']}: rank ")
    desync = ranks["runs"]["desync_exclude"]["warnings"]  # a minority's weights: left out, said each step
    assert desync and all("left out of this step's mean)" in line for line in desync)
    quiet = ("log", "log_exact", "flip", "raise", "desync", "desync_skip")  # desync_skip: weights never skip
    assert all(not ranks["runs"][k]["warnings"] for k in quiet)


def test_bytes_beyond_ddps_own(ranks: dict) -> None:
    runs = ranks["runs"]
    buckets = len(runs["log"]["buckets"])
    # 16 floats + records lost per bucket, and the replica check's row (at every step: a NaN row
    # between checks, so the payload's width never depends on a rank's step count)
    assert runs["log"]["extra_bytes"] == 136 * (buckets + 1) and buckets >= 2
    assert runs["log_exact"]["extra_bytes"] == 136 * 2 + 16


@pytest.mark.parametrize("kind", ["log", "log_exact", "skip", "warn", "flip"])
def test_signals_equal_a_single_process_float64_computation(ranks: dict, kind: str) -> None:
    run = ranks["runs"][kind]
    exact = kind == "log_exact"
    assert ("cos" in run["exact"]) == exact
    for grads, payload, recorded in zip(run["grads"], run["payloads"], run["signals"], strict=True):
        g = np.array(grads, dtype=np.float64)  # (K, n): every rank's float32 gradient, exactly
        states = [_split(row, run["shapes"]) for row in g]
        sketches = np.stack([sketch_state_dict(s, 0, impl="numpy") for s in states])
        with np.errstate(invalid="ignore", over="ignore"):
            sq = (g * g).sum(1)
        bad = (~np.isfinite(g)).sum(1)
        p = np.array(payload)
        # summed over buckets: agreement to float64 summation order
        np.testing.assert_allclose(p[:, :14], sketches, rtol=1e-9, atol=1e-12 * np.nanmax(np.abs(sketches)))
        np.testing.assert_allclose(p[:, 14], sq, rtol=1e-12)
        np.testing.assert_array_equal(p[:, 15], bad)
        if exact:
            mean = g.mean(axis=0)  # DDP's all-reduced float32 mean, here in float64
            mine = rank_signals(sketches, sq, bad, dots=g @ mean, sq_dists=((g - mean) ** 2).sum(1)).to_dict()
            tol = 1e-5  # the float32 all-reduce against a float64 mean
        else:
            mine, tol = rank_signals(sketches, sq, bad).to_dict(), 1e-9
        for key in ("sq_norm", "rel_norm", "energy", "cos", "sq_dist"):
            np.testing.assert_allclose(recorded[key], mine[key], rtol=tol, atol=1e-12, err_msg=key)


def _split(flat: np.ndarray, shapes: dict) -> dict[str, np.ndarray]:
    out, i = {}, 0
    for name, shape in shapes.items():
        n = math.prod(shape)
        out[name] = flat[i:i + n].reshape(shape)
        i += n
    return out


# ----------------------------------------------------------------- one process (gloo, world 1)


def _setup(action: str) -> tuple[torch.nn.Module, DistributedDataParallel, torch.optim.Optimizer,
                                 MonitorHook]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    ddp = DistributedDataParallel(model)
    hook = MonitorHook(model, Monitor(action=action, window=3))
    ddp.register_comm_hook(state=hook, hook=monitor_comm_hook)  # what Lightning's DDPStrategy does
    return model, ddp, torch.optim.Adam(ddp.parameters(), lr=0.1), hook


def test_skip_applies_inside_a_closure_as_lightning_calls_step() -> None:
    with process_group_in_this_process():
        model, ddp, opt, hook = _setup("skip")
        hook.attach(opt)

        def closure(scale: float) -> torch.Tensor:
            opt.zero_grad()
            loss = ddp(torch.ones(4, 3)).square().sum() * scale
            loss.backward()
            return loss

        opt.step(lambda: closure(1.0))
        before = [p.detach().clone() for p in model.parameters()]
        opt.step(lambda: closure(float("nan")))  # the backward runs inside step: skip after it
        assert hook.decision.flagged and hook.decision.ranks == (0,)
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        opt.step(closure=lambda: closure(1.0))
        assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


class _Wrapped(torch.optim.Optimizer):
    """A framework's optimizer wrapper as Accelerate's ``AcceleratedOptimizer`` is: an ``Optimizer``
    subclass that never runs ``Optimizer.__init__`` (no step hooks of its own) and holds the torch
    optimizer as ``.optimizer``, whose ``step`` its own calls."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:  # noqa: D107 (no super().__init__)
        self.optimizer = optimizer

    def step(self, closure=None):  # noqa: ANN001, ANN201 (torch's signature)
        return self.optimizer.step(closure)


def test_skip_applies_through_a_framework_wrapper_of_the_optimizer() -> None:
    """``attach(AcceleratedOptimizer)`` was a bare AttributeError (a review, 2026-12-07): a wrapper
    without step hooks is attached through the torch optimizer it holds."""
    with process_group_in_this_process():
        model, ddp, opt, hook = _setup("skip")
        hook.attach(_Wrapped(opt))
        before = [p.detach().clone() for p in model.parameters()]
        ddp(torch.ones(4, 3)).square().sum().mul(float("nan")).backward()
        _Wrapped(opt).step()
        assert hook.decision.flagged
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize("action", ["skip", "raise"])
def test_detaching_before_the_step_applies_a_flagged_decision_says_so(action: str) -> None:
    """Detached between backward() and optimizer.step(), skip lost a flagged step without a word (a
    review, 2026-12-07); detached after the step, nothing is said."""
    with process_group_in_this_process():
        model, ddp, opt, hook = _setup(action)
        hook.attach(opt)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ddp(torch.ones(4, 3)).square().sum().mul(float("nan")).backward()
        said = f"detached before optimizer.step\\(\\) applied {action} to step 1"
        with pytest.warns(UserWarning, match=said):
            hook.detach()
        model, ddp, opt, hook = _setup(action)
        hook.attach(opt)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ddp(torch.ones(4, 3)).square().sum().mul(float("nan")).backward()
            try:
                opt.step()
            except BadRankError:  # raise: as asked
                assert action == "raise"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            hook.detach()


def _hook_lines(make: Callable[[torch.nn.Module], torch.optim.Optimizer], state: dict | None = None,
                steps: int = 1, twice: bool = False) -> tuple[list[str], dict]:
    """The hook's 'starts afresh' and 'gradient tensor' lines over ``steps`` steps of a fresh monitor on
    the optimizer ``make`` builds (``state`` loaded into it first; attached twice with ``twice``), and
    the optimizer's state after them. Steps take a closure (LBFGS needs one)."""
    _, ddp, _, hook = _setup("log")
    opt = make(ddp)
    if state is not None:
        opt.load_state_dict(state)
    for _ in range(2 if twice else 1):
        hook.attach(opt)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = ddp(torch.ones(4, 3)).square().sum()
        loss.backward()
        return loss

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(steps):
            opt.step(closure)
    lines = [str(w.message) for w in caught]
    return [m for m in lines if "afresh" in m or "gradient tensor" in m], opt.state_dict()


def test_a_resumed_optimizer_with_a_fresh_monitor_is_pointed_to_the_monitors_state() -> None:
    """A run resumed from a checkpoint without the monitor's state starts its warm-up again (a ×1000 rank
    then goes unnamed: a new user's run, 2026-12-06): said once, at the first step; a fresh run says
    nothing."""
    adam = lambda m: torch.optim.Adam(m.parameters())  # noqa: E731
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)  # noqa: E731 (state: momentum only)
    with process_group_in_this_process():
        fresh, saved = _hook_lines(adam, steps=2)
        assert not fresh
        said, _ = _hook_lines(adam, saved, steps=2)
        assert len(said) == 1 and "starts afresh" in said[0] and "load the Monitor's state_dict()" in said[0]
        # fresh: Adagrad makes its state (step 0) when built, LBFGS before the closure; attached twice
        assert not _hook_lines(lambda m: torch.optim.Adagrad(m.parameters(), lr=0.1))[0]
        assert not _hook_lines(lambda m: torch.optim.LBFGS(m.parameters(), max_iter=1))[0]
        assert not _hook_lines(adam, twice=True)[0]
        said, _ = _hook_lines(sgd, _hook_lines(sgd)[1])
        assert len(said) == 1 and "starts afresh" in said[0]


def test_a_discarded_flagged_gradient_spares_the_next_step_and_a_replayed_one_is_skipped_again() -> None:
    """skip acts on the latest decision: a flagged gradient thrown away without a step (GradScaler's
    non-finite step, zero_grad) does not reach the next clean step; after a rollback (the monitor's and
    the model's state restored) the replayed flagged step, same step number, is skipped again (an
    adversarial review of this session's changes, 2026-12-06)."""
    def backward(ddp: DistributedDataParallel, scale: float) -> None:
        ddp(torch.ones(4, 3)).square().sum().mul(scale).backward()

    with process_group_in_this_process(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the warm-up's and the rollback's lines
        model, ddp, opt, hook = _setup("skip")
        hook.attach(opt)
        for _ in range(3):
            opt.zero_grad()
            backward(ddp, 1.0)
            opt.step()
        opt.zero_grad()
        backward(ddp, float("nan"))  # flagged; the step is not taken (as GradScaler does)
        assert hook.decision.flagged
        opt.zero_grad()
        backward(ddp, 1.0)
        before = [q.detach().clone() for q in model.parameters()]
        opt.step()
        assert not any(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
        saved = (hook.monitor.state_dict(), copy.deepcopy(model.state_dict()),
                 copy.deepcopy(opt.state_dict()))
        for _ in range(2):  # the same flagged step, then again after rolling back to before it
            opt.zero_grad()
            backward(ddp, float("nan"))
            before = [q.detach().clone() for q in model.parameters()]
            opt.step()
            assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
            assert all(bool(torch.isfinite(q).all()) for q in model.parameters())
            hook.monitor.load_state_dict(saved[0])
            model.load_state_dict(saved[1])
            opt.load_state_dict(saved[2])


def test_a_sparse_embedding_ddp_ignores_is_not_refused() -> None:
    with process_group_in_this_process():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.EmbeddingBag(20, 6, sparse=True), torch.nn.Linear(6, 2))
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ["0.weight"])
        ddp = DistributedDataParallel(model)
        hook = MonitorHook(model, Monitor()).register(ddp)
        ddp(torch.tensor([[1, 4, 4]])).sum().backward()
        assert hook.decision.step == 1 and model[0].weight.grad.layout == torch.sparse_coo


def test_sparse_gradients_are_refused_in_one_line_not_deep_in_the_sketch() -> None:
    """nn.EmbeddingBag(sparse=True) under DDP ended in 'unsupported memory format option' from inside
    the sketch (an adversarial review, 2026-12-06): refused at register, naming the module; registered
    as Lightning's DDPStrategy does (ddp.register_comm_hook, which register() never sees), refused at
    the sparse bucket, naming it."""
    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.EmbeddingBag(20, 6, sparse=True), torch.nn.Linear(6, 2))

    with process_group_in_this_process():
        first = model()
        ddp = DistributedDataParallel(first)
        with pytest.raises(UsageError, match="module '0' makes sparse gradients") as err:
            MonitorHook(first, Monitor()).register(ddp)
        assert err.value.field == "ddp" and "sparse=False" in str(err.value)
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)  # nothing was registered on it
        second = model()
        ddp2 = DistributedDataParallel(second)
        ddp2.register_comm_hook(state=MonitorHook(second, Monitor()), hook=monitor_comm_hook)
        with pytest.raises(UsageError, match=r"bucket \d+ \(0.weight\) holds a sparse gradient") as err:
            ddp2(torch.tensor([[1, 4, 4]])).sum().backward()
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("action", ["skip", "raise"])
def test_skip_and_raise_without_an_attached_optimizer_are_refused(action: str) -> None:
    with process_group_in_this_process():
        _, ddp, _, _ = _setup(action)
        with pytest.raises(UsageError, match="attach") as err:
            ddp(torch.ones(2, 3)).sum().backward()
        assert err.value.field == "action"


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"module": "model"}, "module"), ({"monitor": "log"}, "monitor"), ({"exact": 1}, "exact"),
    ({"per_bucket": "yes"}, "per_bucket"), ({"monitor": Monitor(action="exclude"), "exact": True}, "exact"),
    ({"module": torch.nn.Module()}, "module"),
])
def test_bad_arguments_are_usage_errors(kwargs: dict, field: str) -> None:
    args = {"module": torch.nn.Linear(3, 2)} | kwargs
    with pytest.raises(UsageError) as err:
        MonitorHook(args.pop("module"), **args)
    assert err.value.field == field


def test_register_and_attach_refuse_other_objects() -> None:
    hook = MonitorHook(torch.nn.Linear(3, 2))
    with pytest.raises(UsageError) as err:
        hook.register(torch.nn.Linear(3, 2))
    assert err.value.field == "ddp"
    with pytest.raises(UsageError) as err:
        hook.attach("sgd")
    assert err.value.field == "optimizer"
    sgd = torch.optim.SGD(torch.nn.Linear(3, 2).parameters(), lr=0.1)
    with pytest.raises(UsageError, match="got a StepLR") as err:  # it holds an optimizer, but is none
        hook.attach(torch.optim.lr_scheduler.StepLR(sgd, 1))


def test_register_refuses_a_ddp_of_another_model_or_another_group() -> None:
    """The hook reads the parameters of its ``module`` and all-reduces over the monitor's group: a DDP
    model wrapping another model, or reducing over another group, is refused at ``register`` (until
    2026-12-06 the first was read under placeholder names, and the second changed the gradients in
    ``log`` mode: the hook reduced over WORLD where DDP reduces over its pair)."""
    with process_group_in_this_process():
        model = torch.nn.Linear(3, 2)
        ddp = DistributedDataParallel(model)
        with pytest.raises(UsageError) as err:
            MonitorHook(torch.nn.Linear(3, 2)).register(ddp)
        assert err.value.field == "module"
        group = dist.new_group([0])
        other = DistributedDataParallel(torch.nn.Linear(3, 2), process_group=group)
        with pytest.raises(UsageError) as err:
            MonitorHook(other).register(other)
        assert err.value.field == "process_group"
        assert MonitorHook(other, Monitor(process_group=group)).register(other).monitor.group is group
        assert MonitorHook(model).register(ddp).names  # the model DDP wraps: accepted


def test_a_new_hook_takes_over_a_detached_one_on_the_same_ddp_model() -> None:
    """DDP keeps its communication hook for good: a second ``trainer.train()`` (or a new action after
    ``detach``) registers another ``MonitorHook`` on the same model. Until 2026-12-06 that was refused
    with advice about another hook that was the monitor's own; now the detached hook hands its buckets
    to the new one, and a hook still attached is refused."""
    with process_group_in_this_process():
        model = torch.nn.Linear(3, 2)
        ddp = DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)

        def step(scale: float = 1.0) -> None:
            opt.zero_grad()
            (ddp(torch.ones(4, 3)).square().sum() * scale).backward()
            opt.step()

        first = MonitorHook(model, Monitor(window=3)).register(ddp).attach(opt)
        step()
        with pytest.raises(UsageError, match="not detached") as err:
            MonitorHook(model).register(ddp)
        assert err.value.field == "ddp"
        first.detach()
        step()
        assert first.step == 1
        second = MonitorHook(model, Monitor(action="skip", window=3)).register(ddp).attach(opt)
        step()
        before = [p.detach().clone() for p in model.parameters()]
        step(float("nan"))
        assert (first.step, second.step) == (1, 2) and second.decision.ranks == (0,)
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # skipped
        second.detach()
        with pytest.raises(UsageError, match="detached; make a new MonitorHook"):
            second.register(ddp)  # it would hand its buckets to itself
        third = MonitorHook(model, Monitor(window=3)).register(ddp)
        step()
        assert (second.step, third.step) == (2, 1) and first.active() is third


def test_one_monitor_decides_one_models_steps() -> None:
    """Two DDP models (a GAN's generator and discriminator) given one Monitor: until 2026-12-06 both
    hooks fed one history (two decisions per iteration, each mixing the models); now the second hook
    is refused at registration (at its first step when the framework registered it), and may take
    over once the first is detached."""
    with process_group_in_this_process():
        shared = Monitor(window=3)
        first, second = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
        ddp1, ddp2 = DistributedDataParallel(first), DistributedDataParallel(second)
        other = torch.nn.Linear(3, 2)
        hooked = DistributedDataParallel(other)
        hooked.register_comm_hook(None, default_hooks.allreduce_hook)
        refused = MonitorHook(other, shared)
        with pytest.raises(UsageError, match="has a communication hook already"):
            refused.register(hooked)  # a refused registration claims nothing
        hook1 = MonitorHook(first, shared).register(ddp1)
        with pytest.raises(UsageError, match="already decides the steps of another MonitorHook") as err:
            MonitorHook(second, shared).register(ddp2)  # refused before DDP holds it
        assert err.value.field == "monitor"
        with pytest.raises(UsageError, match="observe\\(\\) would add a second gradient"):
            shared.observe({"w": torch.ones(3)})
        ddp1(torch.ones(4, 3)).sum().backward()
        assert (hook1.step, shared.detector.step) == (1, 1)
        hook1.detach()
        hook2 = MonitorHook(second, shared).register(ddp2)
        ddp2(torch.ones(4, 3)).sum().backward()
        assert hook2.decision is not None and shared.detector.step == 2
        # a hook DDP was given directly (as Lightning's strategy does) is refused at its first step
        third = torch.nn.Linear(3, 2)
        ddp3 = DistributedDataParallel(third)
        ddp3.register_comm_hook(state=MonitorHook(third, shared), hook=monitor_comm_hook)
        with pytest.raises(UsageError, match="already decides the steps of another MonitorHook"):
            ddp3(torch.ones(4, 3)).sum().backward()


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (and NCCL)")


@needs_cuda
def test_on_cuda_log_mode_is_bit_identical_to_plain_ddp_over_nccl() -> None:
    """One NCCL rank on the GPU: DDP with ``MonitorHook`` (log) trains bit for bit as plain DDP, and a NaN
    step is named at that step."""
    device = torch.device("cuda", 0)
    with process_group_in_this_process("nccl"):
        params, flagged = {}, {}
        for variant in ("plain", "log"):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8))
            model = model.to(device)
            ddp = DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=0.01)  # several buckets
            hook = MonitorHook(model, Monitor(window=3)).register(ddp) if variant == "log" else None
            opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
            gen = torch.Generator(device=device).manual_seed(1)
            flagged[variant] = []
            for step in range(12):
                opt.zero_grad()
                scale = float("nan") if step == 10 else 1.0
                (ddp(torch.randn(32, 64, device=device, generator=gen)).square().mean() * scale).backward()
                if hook is not None:
                    flagged[variant].append(hook.decision.ranks if hook.decision.flagged else ())
                if step != 10:
                    opt.step()
            params[variant] = [p.detach().cpu() for p in model.parameters()]
            del ddp, hook
        assert all(torch.equal(a, b) for a, b in zip(params["plain"], params["log"], strict=True))
        assert flagged["log"] == [()] * 10 + [(0,), ()]


@pytest.mark.parametrize(("run", "setting"), [("per_bucket_mismatch", "per_bucket=0"),
                                              ("exact_mismatch", "exact=1")])
def test_a_hook_set_up_otherwise_on_one_rank_is_the_same_error_on_every_rank(ranks: dict, run: str,
                                                                            setting: str) -> None:
    """per_bucket or exact on one rank only change the step's collectives: the first gather (fixed size)
    compares every rank's setup and the first backward stops on every rank with one line naming the
    ranks and both setups (until 2026-12-08: a gloo abort, or ranks waiting on each other)."""
    errors = ranks["runs"][run]["errors"]
    assert all(e is not None and e == errors[0] for e in errors), errors
    assert "ranks 1 send the monitor payloads set up as '" in errors[0] and setting in errors[0], errors[0]
    assert "ranks 0, 2 as '" in errors[0] and "build every rank's monitor and hook alike" in errors[0]
