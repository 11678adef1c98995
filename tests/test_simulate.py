"""The simulate loop of SPEC §3.3 (naig.simulate)."""

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import naig.simulate as sim
from naig.errors import UsageError
from naig.simulate import SimulateConfig, parse_lags, run_simulation

TINY = SimulateConfig(steps=8, seeds=1, data_bytes=200_000, eval_every=0, eval_batches=2,
                      batch_size=4, strategies=("hogwild",), lags=(0, 3))


def _numbers(result: sim.SimulateResult) -> list[tuple]:
    return [(r.strategy, r.seed, r.final_val_loss, r.curve, r.mean_pi, r.k_eff)
            for r in result.runs]


def test_workers_see_clamped_stale_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[torch.Tensor] = []
    real = sim._worker_grad

    def spy(setup, theta, gen, out):  # noqa: ANN001, ANN202
        seen.append(theta.clone())
        real(setup, theta, gen, out)

    monkeypatch.setattr(sim, "_worker_grad", spy)
    run_simulation(dataclasses.replace(TINY, optimizer="sgd", lr=0.5))
    fresh, stale = seen[0::2], seen[1::2]  # worker 0 (τ = 0), worker 1 (τ = 3)
    assert all(not torch.equal(fresh[t], fresh[t + 1]) for t in range(len(fresh) - 1))
    for t in range(TINY.steps):
        assert torch.equal(stale[t], fresh[max(t - 3, 0)])


def test_sync_computes_every_gradient_at_theta_t(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[torch.Tensor] = []
    real = sim._worker_grad
    monkeypatch.setattr(sim, "_worker_grad",
                        lambda s, th, g, o: (seen.append(th.clone()), real(s, th, g, o)))
    run_simulation(dataclasses.replace(TINY, strategies=("sync",), steps=5))
    assert all(torch.equal(seen[2 * t], seen[2 * t + 1]) for t in range(5))


def test_zero_lags_make_hogwild_equal_sync() -> None:
    cfg = dataclasses.replace(TINY, lags=(0, 0), strategies=("hogwild", "sync"), steps=4)
    a, b = run_simulation(cfg).runs
    assert a.curve == b.curve


def test_same_seed_same_numbers_and_learning() -> None:
    cfg = dataclasses.replace(TINY, steps=20, strategies=("naig", "hogwild"))
    one, two = run_simulation(cfg), run_simulation(cfg)
    assert _numbers(one) == _numbers(two)
    assert math.isclose(one.untrained_val_loss, math.log(256), abs_tol=0.2)
    assert all(r.final_val_loss < one.untrained_val_loss - 0.5 for r in one.runs)


def test_summary_statistics() -> None:
    cfg = dataclasses.replace(TINY, steps=10, seeds=2, lags=(0, 2, 4),
                              strategies=("naig", "hogwild", "staleness"))
    res = run_simulation(cfg)
    naig, hog, stale = res.summaries
    assert hog.change_vs_hogwild_pct == 0.0 and hog.k_eff == 3.0
    assert (hog.entropy_first, hog.entropy_last) == pytest.approx((1.0, 1.0))
    assert hog.frozen_fraction == 0.0
    assert math.isclose(sum(naig.mean_pi), 1.0) and naig.k_eff <= 3.0
    assert stale.mean_pi == pytest.approx((1 / 3, 1 / 6, 1 / 12))
    expected = 100 * (naig.val_loss_mean - hog.val_loss_mean) / hog.val_loss_mean
    assert math.isclose(naig.change_vs_hogwild_pct, expected)
    assert len(res.runs) == 6 and naig.val_loss_std >= 0
    assert res.routing_bytes == 56 and res.gradient_bytes == 4 * res.n_params


def test_save_grads_writes_audit_ready_files(tmp_path: Path) -> None:
    cfg = dataclasses.replace(TINY, strategies=("naig",), save_grads=str(tmp_path), save_at=(5,))
    res = run_simulation(cfg)
    folder = tmp_path / "naig-seed0-step5"
    assert sorted(p.name for p in folder.iterdir()) == [
        "ref.safetensors", "worker0.safetensors", "worker1.safetensors"]
    assert len(res.saved_files) == 3
    with safe_open(folder / "worker1.safetensors", "pt") as f:
        meta = f.metadata()
        assert "wte.weight" in set(f.keys())
    assert meta == {"lag": "3", "step": "5", "worker": "1", "strategy": "naig", "seed": "0"}


@pytest.mark.parametrize(("change", "match"), [
    ({"strategies": ("naig", "fast")}, "--strategies: unknown strategy 'fast'"),
    ({"model": "gpt-9"}, "--model 'gpt-9'"),
    ({"beta": -1.0}, "--beta"),
    ({"lags": (0, -1)}, "--lags"),
    ({"optimizer": "lion"}, "--optimizer"),
    ({"save_at": (99,), "save_grads": "x"}, "--save-at"),
    ({"device": "tpu"}, "--device 'tpu'"),
])
def test_bad_config_is_a_usage_error(change: dict, match: str) -> None:
    with pytest.raises(UsageError, match=match):
        dataclasses.replace(TINY, **change).validate()


@pytest.mark.parametrize("text", ["0,a", "", "1,-2", "0;10", "1.5"])
def test_parse_lags_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="--lags"):
        parse_lags(text)


def test_parse_lags_accepts() -> None:
    assert parse_lags("0,10,20,35") == (0, 10, 20, 35)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_without_gpu_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="--device cuda: no CUDA GPU"):
        dataclasses.replace(TINY, device="cuda").validate()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_runs_on_cuda() -> None:
    res = run_simulation(dataclasses.replace(TINY, device="cuda", strategies=("naig",)))
    assert res.device == "cuda" and res.runs[0].final_val_loss < res.untrained_val_loss
