"""The fixed-lags engine (naig.simulate.lags.engine; docs/design.md §8)."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

import naig.simulate as sim
from naig.errors import DataError, UsageError
from naig.simulate import SimulateConfig, Workload, parse_int_list, run_experiment
from naig.simulate.engines import start
from naig.simulate.lags.engine import LagsEngine, allocate_ring, ring_rows

TINY = SimulateConfig.from_options(steps=8, seeds=1, data_bytes=200_000, eval_every=0, eval_batches=2,
                      batch_size=4, strategies=("hogwild",), lags=(0, 3))


def _numbers(result: sim.SimulateResult) -> list[tuple]:
    return [(r.strategy, r.seed, r.final_val_loss, r.curve, r.mean_pi, r.k_eff)
            for r in result.runs]


def _spy(monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[int, torch.Tensor]], list[int]]:
    """Record (worker row, θ) of every gradient taken, and the ring size of every run."""
    seen: list[tuple[int, torch.Tensor]] = []
    rings: list[int] = []
    real, real_start = Workload.worker_grad, LagsEngine.start

    def spy(self, theta, gen, out):  # noqa: ANN001, ANN202
        seen.append((len(seen), theta.clone()))
        return real(self, theta, gen, out)

    def start(*args):  # noqa: ANN002, ANN202
        run = real_start(*args)
        rings.append(run.ring.shape[0])
        return run

    monkeypatch.setattr(Workload, "worker_grad", spy)
    monkeypatch.setattr(LagsEngine, "start", staticmethod(start))
    return seen, rings


@pytest.mark.parametrize("lag", [3, 6, 7, 8, 50, 10**8])  # TINY.steps = 8
def test_warmup_theta0_workers_see_clamped_stale_versions(monkeypatch: pytest.MonkeyPatch,
                                                           lag: int) -> None:
    """The old protocol: every worker reads θ_{max(t−τ, 0)} from step 0, also for lags ≥ steps."""
    seen, rings = _spy(monkeypatch)
    run_experiment(TINY.with_options(optimizer="sgd", lr=0.5, lags=(0, lag), warmup_theta0=True))
    fresh, stale = [th for _, th in seen[0::2]], [th for _, th in seen[1::2]]  # worker 0, worker 1
    assert all(not torch.equal(fresh[t], fresh[t + 1]) for t in range(len(fresh) - 1))
    for t in range(TINY.steps):
        assert torch.equal(stale[t], fresh[max(t - lag, 0)])
    assert rings == [min(lag, TINY.steps - 1) + 1]


@pytest.mark.parametrize("lag", [3, 6, 7, 8, 50])  # TINY.steps = 8
def test_a_lag_tau_worker_joins_at_step_tau(monkeypatch: pytest.MonkeyPatch, lag: int) -> None:
    """No start-up burst: worker 1 sends its first gradient at step τ, taken at θ_0, then θ_{t−τ}."""
    seen, rings = _spy(monkeypatch)
    res = run_experiment(TINY.with_options(optimizer="sgd", lr=0.5, lags=(0, lag)))
    thetas = [th for _, th in seen]
    fresh = thetas[:min(lag, TINY.steps)]  # steps 0..τ−1: worker 0 alone
    rest = thetas[len(fresh):]
    fresh += rest[0::2]
    stale = rest[1::2]
    assert len(stale) == max(0, TINY.steps - lag)  # one gradient per step from step τ on
    for i, th in enumerate(stale):
        assert torch.equal(th, fresh[i])  # step t = τ + i reads θ_{t−τ} = θ_i
    mean_pi = res.runs[0].mean_pi
    assert mean_pi[0] == pytest.approx(1.0 if lag >= TINY.steps else (lag + 0.5 * (TINY.steps - lag))
                                       / TINY.steps)
    assert (mean_pi[1] == pytest.approx(0.5)) if lag < TINY.steps else math.isnan(mean_pi[1])
    assert rings == [min(lag, TINY.steps - 1) + 1]


def test_steps_without_an_active_worker_are_skipped() -> None:
    sim_cfg = TINY.with_options(lags=(2, 3), strategies=("hogwild",))
    sim = Workload(sim_cfg)
    run = start(sim_cfg, sim, "hogwild", seed=0)
    theta0 = run.theta.detach().clone()
    run.step(), run.step()
    assert run.t == 2 and torch.equal(run.theta.detach(), theta0)  # nobody has joined yet
    run.step()
    assert not torch.equal(run.theta.detach(), theta0)
    assert math.isnan(run.history.rows()[2, 1]) and run.history.rows()[2, 0] == 1.0  # K_2 = 1 active worker


def test_ring_rows() -> None:
    assert ring_rows((0, 3), 8) == 4 and ring_rows((0, 0), 1) == 1
    assert ring_rows((0, 5000), 2) == 2 and ring_rows((0, 7), 8) == 8


def test_ring_that_cannot_be_allocated_is_a_usage_error() -> None:
    class Huge:  # stands in for θ: any allocation fails as torch's allocator would
        device = "cpu"

        def new_empty(self, *shape: int) -> None:
            raise RuntimeError("DefaultCPUAllocator: not enough memory")

        def numel(self) -> int:
            return 86_000_000

        def element_size(self) -> int:
            return 4

    with pytest.raises(UsageError, match=r"lags: the ring buffer of 2,001 parameter versions") as info:
        allocate_ring(Huge(), 2001)
    assert info.value.field == "lags"


def _nan_hogwild(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make hogwild's update NaN (θ_1 non-finite) without touching the other strategies."""
    from naig.simulate.strategies import Update
    from naig.simulate.strategies.hogwild import Hogwild

    def combine(self, batch):  # noqa: ANN001, ANN202
        k = batch.grads.shape[0]
        return Update(torch.full_like(batch.grads[0], math.nan), torch.full((k,), 1.0 / k))

    monkeypatch.setattr(Hogwild, "combine", combine)


def test_a_diverging_run_stops_and_the_others_go_on(monkeypatch: pytest.MonkeyPatch) -> None:
    _nan_hogwild(monkeypatch)
    cfg = TINY.with_options(steps=4, seeds=2, eval_every=2, strategies=("naig", "hogwild"))
    res = run_experiment(cfg)
    naig, hog = res.summaries
    assert [r.diverged_at for r in res.runs] == [None, 0, None, 0]
    assert res.diverged == tuple(r for r in res.runs if r.strategy == "hogwild")
    bad = res.runs[1]
    assert math.isnan(bad.final_val_loss) and [s for s, _ in bad.curve] == [0, 2, 4]
    assert all(math.isnan(v) for _, v in bad.curve[1:])
    assert math.isnan(hog.val_loss_mean) and math.isnan(hog.val_loss_std)
    assert hog.diverged_at == (0, 0) and naig.diverged_at == (None, None)
    assert math.isfinite(naig.val_loss_mean)
    assert hog.loss["diverged"] == 2 and hog.loss["median"] == math.inf
    assert naig.paired_vs_hogwild["n"] == 0 and naig.paired_vs_hogwild["dropped"] == 2


def test_divergence_is_recorded_for_every_strategy_without_raising() -> None:
    cfg = TINY.with_options(steps=3, optimizer="sgd", lr=1e6,
                              strategies=("hogwild", "naig", "naig-exact"))
    res = run_experiment(cfg)  # used to raise "every energy is non-finite" for naig
    assert all(r.diverged_at is not None and math.isnan(r.final_val_loss) for r in res.runs)
    assert len(res.diverged) == 3


def test_one_seed_has_no_std() -> None:
    res = run_experiment(TINY.with_options(steps=2))
    assert res.summaries[0].val_loss_std is None


def test_sync_computes_every_gradient_at_theta_t(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[torch.Tensor] = []
    real = Workload.worker_grad
    monkeypatch.setattr(Workload, "worker_grad",
                        lambda s, th, g, o: (seen.append(th.clone()), real(s, th, g, o))[1])
    run_experiment(TINY.with_options(strategies=("sync",), steps=5))
    assert all(torch.equal(seen[2 * t], seen[2 * t + 1]) for t in range(5))


def test_zero_lags_make_hogwild_equal_sync() -> None:
    cfg = TINY.with_options(lags=(0, 0), strategies=("hogwild", "sync"), steps=4)
    a, b = run_experiment(cfg).runs
    assert a.curve == b.curve


def test_same_seed_same_numbers_and_learning() -> None:
    cfg = TINY.with_options(steps=20, strategies=("naig", "hogwild"))
    one, two = run_experiment(cfg), run_experiment(cfg)
    assert _numbers(one) == _numbers(two)
    assert math.isclose(one.untrained_val_loss, math.log(256), abs_tol=0.2)
    assert all(r.final_val_loss < one.untrained_val_loss - 0.5 for r in one.runs)


def test_summary_statistics_with_joins() -> None:
    """Lags 0, 2, 4 over 10 steps: K_t = 1, 1, 2, 2, 3 × 6 (workers join at step τ)."""
    cfg = TINY.with_options(steps=10, lags=(0, 2, 4), strategies=("hogwild", "staleness"))
    hog, stale = run_experiment(cfg).summaries
    assert hog.k_eff == pytest.approx((2 * 1 + 2 * 2 + 6 * 3) / 10)
    assert hog.mean_pi == pytest.approx(((2 + 2 / 2 + 6 / 3) / 10, (2 / 2 + 6 / 3) / 8, 1 / 3))
    assert hog.entropy_last == pytest.approx(1.0) and hog.frozen_fraction == 0.0
    # staleness: π_k = 1 / (K_t max(1, τ_k)) over the steps worker k is active
    assert stale.mean_pi == pytest.approx((0.5, (2 / 4 + 6 / 6) / 8, 1 / 12))


def test_summary_statistics() -> None:
    cfg = TINY.with_options(steps=10, seeds=2, lags=(0, 2, 4), warmup_theta0=True,
                              strategies=("naig", "hogwild", "staleness"))
    res = run_experiment(cfg)
    naig, hog, stale = res.summaries
    assert hog.paired_vs_hogwild["diff"] == 0.0 and hog.k_eff == 3.0
    assert (hog.entropy_first, hog.entropy_last) == pytest.approx((1.0, 1.0))
    assert hog.frozen_fraction == 0.0
    assert math.isclose(sum(naig.mean_pi), 1.0) and naig.k_eff <= 3.0
    assert stale.mean_pi == pytest.approx((1 / 3, 1 / 6, 1 / 12))
    diffs = [a.final_val_loss - b.final_val_loss for a, b in zip(res.runs[0::3], res.runs[1::3], strict=True)]
    assert math.isclose(naig.paired_vs_hogwild["diff"], sum(diffs) / 2)
    assert naig.loss["ci95"][0] < naig.loss["mean"] < naig.loss["ci95"][1]
    assert res.best_baseline == "hogwild" or res.best_baseline == "staleness"  # naig is not a baseline
    assert len(res.runs) == 6 and naig.val_loss_std >= 0
    assert res.routing_bytes == 56 and res.gradient_bytes == 4 * res.n_params


def test_save_grads_writes_audit_ready_files(tmp_path: Path) -> None:
    cfg = TINY.with_options(strategies=("naig",), save_grads=str(tmp_path), save_at=(5,))
    res = run_experiment(cfg)
    folder = tmp_path / "naig-seed0-step5"
    assert sorted(p.name for p in folder.iterdir()) == [
        "ref.safetensors", "worker0.safetensors", "worker1.safetensors"]
    assert len(res.saved_files) == 3
    with safe_open(folder / "worker1.safetensors", "pt") as f:
        meta = f.metadata()
        assert "wte.weight" in set(f.keys())
    assert meta == {"lag": "3", "step": "5", "worker": "1", "strategy": "naig", "seed": "0"}


def test_a_ctrl_c_keeps_the_saved_files_of_the_runs_before_it_in_the_result(tmp_path: Path) -> None:
    """A stop in a seed's second run: the first run's files are in ``saved_files`` (they were only
    added when a seed ended, so a stop within the seed lost them)."""
    def stop(event: sim.StepEvent) -> None:
        if event.strategy == "naig" and event.step == 7:
            raise KeyboardInterrupt

    cfg = TINY.with_options(strategies=("hogwild", "naig"), save_grads=str(tmp_path), save_at=(5,), jobs=1)
    res = run_experiment(cfg, stop)
    assert res.interrupted and [r.strategy for r in res.finished] == ["hogwild"]
    written = sorted(str(p) for p in (tmp_path / "hogwild-seed0-step5").iterdir())
    assert sorted(res.saved_files) == written and len(written) == 3  # ref and two workers


def test_a_stop_while_a_step_is_saved_leaves_no_folder_under_its_name_and_a_rerun_writes_it_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C after the first of the step's three files: no ``naig-seed0-step5`` holding one file
    (the audit would take it for the whole step), only a hidden ``.partial`` folder of its own,
    which the next run leaves alone (as it leaves a user's file or folder of a like name)."""
    import naig.simulate.lags.engine as lags_engine

    real, calls = lags_engine.save_gradients, []

    def stopped_at_the_second_file(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(args[0])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    (tmp_path / ".naig-seed0-step5.partial").write_text("a user's file")
    cfg = TINY.with_options(strategies=("naig",), save_grads=str(tmp_path), save_at=(5,), jobs=1)
    monkeypatch.setattr(lags_engine, "save_gradients", stopped_at_the_second_file)
    res = run_experiment(cfg)
    assert res.interrupted and not res.finished and res.saved_files == ()
    left = sorted(p.name for p in tmp_path.iterdir())
    assert "naig-seed0-step5" not in left and len(left) == 2, left
    monkeypatch.setattr(lags_engine, "save_gradients", real)
    res = run_experiment(cfg)
    folder = tmp_path / "naig-seed0-step5"
    assert sorted(p.name for p in folder.iterdir()) == ["ref.safetensors", "worker0.safetensors",
                                                        "worker1.safetensors"]
    assert sorted(res.saved_files) == sorted(str(p) for p in folder.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*left, folder.name])  # the others kept
    assert (tmp_path / ".naig-seed0-step5.partial").read_text() == "a user's file"


def test_a_run_stopped_before_its_first_row_leaves_no_empty_log(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop as a run begins (its log opened, no row yet; a parallel child told to end then): no
    empty ``NAME.partial.csv`` is left; a cut log always has its header and whole rows."""
    import naig.simulate.runs as runs

    def stopped(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise KeyboardInterrupt

    monkeypatch.setattr(runs, "_timed", stopped)
    res = run_experiment(TINY.with_options(strategies=("naig",), log_dir=str(tmp_path), jobs=1))
    assert res.interrupted and not res.finished
    assert list(tmp_path.iterdir()) == []


def test_a_step_folder_filled_during_the_run_is_a_one_line_error_and_no_hidden_folder_is_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process writes into the step's folder while the run saves: the rename cannot replace
    it; a ``DataError`` names the folder, and the run's hidden folder is removed."""
    import naig.simulate.lags.engine as lags_engine

    real = lags_engine.save_gradients

    def meanwhile(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        (tmp_path / "naig-seed0-step5").mkdir(exist_ok=True)
        (tmp_path / "naig-seed0-step5" / "other.txt").write_text("not ours")
        return real(*args, **kwargs)

    monkeypatch.setattr(lags_engine, "save_gradients", meanwhile)
    cfg = TINY.with_options(strategies=("naig",), save_grads=str(tmp_path), save_at=(5,), jobs=1)
    with pytest.raises(DataError, match=r"naig-seed0-step5: the step's gradient files could not be put"):
        run_experiment(cfg)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["naig-seed0-step5"]
    assert [p.name for p in (tmp_path / "naig-seed0-step5").iterdir()] == ["other.txt"]


def test_a_step_folder_that_is_a_link_is_refused_before_training(tmp_path: Path) -> None:
    """A link to an empty folder under a step's name: refused with the other non-empty names, before
    any training (the step's folder is renamed into place, which a link cannot take)."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "grads").mkdir()
    (tmp_path / "grads" / "naig-seed0-step5").symlink_to(tmp_path / "empty")
    with pytest.raises(UsageError, match="naig-seed0-step5 there holds files of an earlier run .* a link"):
        run_experiment(TINY.with_options(strategies=("naig",), save_grads=str(tmp_path / "grads"),
                                         save_at=(5,)))


@pytest.mark.parametrize(("change", "field", "match"), [
    ({"strategies": ("naig", "fast")}, "strategies", "strategies='fast': unknown strategy"),
    ({"model": "gpt-9"}, "model", "model='gpt-9': unknown preset"),
    ({"beta": -1.0}, "beta", "beta=-1.0: must be finite"),
    ({"lags": (0, -1)}, "lags", r"lags=\(0, -1\): use non-negative ints"),
    ({"optimizer": "lion"}, "optimizer", "optimizer='lion': use sgd or adam"),
    ({"save_at": (99,), "save_grads": "x"}, "save_at", "steps must lie in 0..7"),
    ({"device": "tpu"}, "device", "device='tpu'"),
    ({"lags": (0, 2**31)}, "lags", r"lags=\(0, 2147483648\): a lag must be at most"),
    ({"steps": 10**10}, "steps", "steps=10000000000"),
    ({"dc_lambda": math.nan}, "dc_lambda", "dc_lambda=nan"),
    ({"dc_lambda": math.inf}, "dc_lambda", "dc_lambda=inf"),
    ({"dc_lambda": -0.1}, "dc_lambda", "dc_lambda=-0.1"),
    ({"sketch_seed": -1}, "sketch_seed", "sketch_seed=-1"),
    ({"sketch_seed": 2**64}, "sketch_seed", "sketch_seed=18446744073709551616"),
    ({"strategies": ("naig", "naig", "hogwild")}, "strategies", "naig listed more than once"),
    ({"batch_size": 0}, "batch_size", "batch_size=0"),
    ({"eval_batches": 0}, "eval_batches", "eval_batches=0"),
    ({"eval_every": -1}, "eval_every", "eval_every=-1"),
    ({"save_at": (10,), "steps": 2}, "save_at", "needs `save_grads`"),
    ({"save_grads": ""}, "save_grads", "save_grads=''"),
    ({"save_grads": "x"}, "save_grads", "needs `save_at`"),
])
def test_bad_config_is_a_usage_error_naming_the_field(change: dict, field: str, match: str) -> None:
    with pytest.raises(UsageError, match=match) as info:
        TINY.with_options(**change)
    assert info.value.field == field and "--" not in str(info.value)


@pytest.mark.parametrize("text", ["0,a", "", "1,-2", "0;10", "1.5"])
def test_parse_int_list_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="lags") as info:
        parse_int_list(text, "lags")
    assert info.value.value == text


def test_parse_int_list_accepts() -> None:
    assert parse_int_list("0,10,20,35", "lags") == (0, 10, 20, 35)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_gpu_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="device='cuda': no CUDA GPU"):
        TINY.with_options(device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_runs_on_cuda() -> None:
    res = run_experiment(TINY.with_options(device="cuda", strategies=("naig",)))
    assert res.device == "cuda" and res.runs[0].final_val_loss < res.untrained_val_loss


def test_save_grads_must_be_a_directory(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    for target in (f, f / "sub"):
        with pytest.raises(UsageError, match="is not a directory"):
            TINY.with_options(save_grads=str(target), save_at=(1,))
    TINY.with_options(save_grads=str(tmp_path / "new" / "dir"), save_at=(1,))


def test_a_run_steps_one_server_update_at_a_time() -> None:
    sim_cfg = TINY.with_options(strategies=("naig",), lags=(0, 2))
    sim = Workload(sim_cfg)
    run = start(sim_cfg, sim, "naig", seed=0)
    theta0 = run.theta.detach().clone()
    run.step()
    run.step()
    assert run.t == 2 and run.diverged_at is None
    assert not torch.equal(run.theta.detach(), theta0)
    assert torch.equal(run.stale_params()[1], theta0)  # lag 2 joins at t = 2 and reads θ_0
    rows = run.history.rows()
    assert rows[:2, 0].tolist() == [1.0, 1.0] and np.isnan(rows[:2, 1]).all()  # alone so far
    run.step()
    assert math.isclose(float(run.history.rows()[2].sum()), 1.0)
