"""Local updates on the simulated clock (naig.simulate.arrivals.local; docs/design.md §13); the gossip
methods are in test_simulate_arrivals_gossip.py."""

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from naig.errors import UsageError
from naig.gibbs import gibbs_weights
from naig.simulate import SimulateConfig, Workload, run_experiment
from naig.simulate.arrivals.engine import ArrivalRun
from naig.simulate.arrivals.local import RoundRun, pseudo_gradients
from naig.simulate.engines import start

BASE = dict(seeds=1, data_bytes=200_000, eval_every=0, eval_batches=1, batch_size=4)
N_PARAMS = 120_576  # gpt-nano with the 256-byte vocabulary (checked below)


def _copy(gen: torch.Generator) -> torch.Generator:
    clone = torch.Generator(device=gen.device)
    clone.set_state(gen.get_state())
    return clone


def test_diloco_h1_one_worker_outer_lr_1_is_plain_adamw(float64: None) -> None:
    cfg = SimulateConfig.from_options(arrivals="const:1", local_steps=(1,), outer_lr=1.0,
                                      outer_momentum=0.0, steps=6,
                         strategies=("diloco",), **BASE)
    sim = Workload(cfg)
    run = start(cfg, sim, "diloco", seed=0)
    assert isinstance(run, RoundRun) and cfg.workers == 1 and run.theta.dtype == torch.float64
    gen = _copy(run.gens[0])
    theta = nn.Parameter(sim.init_params(0))
    adamw = torch.optim.AdamW([theta], lr=cfg.lr[0])
    grad = torch.empty_like(theta.detach())
    for step in range(cfg.steps):
        run.step()
        sim.worker_grad(theta.detach(), gen, grad)
        theta.grad = grad
        adamw.step()
        assert run.t == step + 1
        torch.testing.assert_close(run.theta.detach(), theta.detach(), rtol=0, atol=1e-12)
    assert run.done and not torch.equal(theta.detach(), sim.init_params(0))


def test_local_sgd_h1_is_synchronous_averaging(float64: None) -> None:
    cfg = SimulateConfig.from_options(arrivals="const:1,const:2,const:3", local_steps=(1,), steps=5,
                                      optimizer="sgd",
                         lr=0.5, strategies=("local-sgd", "sync"), **BASE)
    sim = Workload(cfg)
    local, sync = start(cfg, sim, "local-sgd", seed=1), start(cfg, sim, "sync", seed=1)
    assert isinstance(local, RoundRun) and not isinstance(sync, RoundRun)
    theta0 = local.theta.detach().clone()
    for _ in range(cfg.steps):
        local.step()
        sync.step()
        torch.testing.assert_close(local.theta.detach(), sync.theta.detach(), rtol=0, atol=1e-12)
    assert local.done and sync.done and (local.theta.detach() - theta0).abs().max() > 1e-3


def test_pseudo_gradient_sign_moves_theta_toward_the_workers_mean() -> None:
    cfg = SimulateConfig.from_options(arrivals="const:1,const:1,const:1", local_steps=(3,), outer_lr=0.5,
                         outer_momentum=0.0, steps=3, strategies=("diloco",), **BASE)
    run = start(cfg, Workload(cfg), "diloco", seed=0)
    before = run.theta.detach().clone()
    run.step()
    mean = torch.stack([p.detach() for p in run.replicas]).mean(0)  # the workers after their phases
    after = run.theta.detach()
    torch.testing.assert_close(after, before + 0.5 * (mean - before), rtol=0, atol=1e-6)
    assert (after - mean).norm() < (before - mean).norm()
    delta = pseudo_gradients(before, torch.stack([p.detach() for p in run.replicas])).mean(0)
    wrong = nn.Parameter(before.clone())  # the published fault: Δ = θ_k − θ
    wrong.grad = -delta
    torch.optim.SGD([wrong], lr=0.5).step()
    assert (wrong.detach() - mean).norm() > (before - mean).norm()


def test_diloco_outer_step_is_nesterov_sgd_on_the_mean_pseudo_gradient() -> None:
    cfg = SimulateConfig.from_options(arrivals="const:1,const:2", local_steps=(2,), steps=6,
                                      strategies=("diloco",),
                         **BASE)
    run = start(cfg, Workload(cfg), "diloco", seed=2)
    shadow = nn.Parameter(run.theta.detach().clone())
    outer = torch.optim.SGD([shadow], lr=0.7, momentum=0.9, nesterov=True)  # SPEC §8 defaults
    while not run.done:
        run.step()
        shadow.grad = run.pseudo.mean(0)
        outer.step()
        torch.testing.assert_close(run.theta.detach(), shadow.detach(), rtol=0, atol=1e-6)
    assert run.t == 3


def test_byte_counts_and_times_by_hand() -> None:
    n = N_PARAMS
    base = dict(arrivals="const:1,const:2", uplink="const:0.5", bandwidth=(4.0 * n,), local_steps=(2,),
                steps=4, **BASE)
    sim_cfg = SimulateConfig.from_options(strategies=("diloco", "gasloc", "allreduce", "diloco-naig"), **base)
    sim = Workload(sim_cfg)
    assert sim.n_params == n
    diloco = start(sim_cfg, sim, "diloco", seed=0)
    while not diloco.done:
        diloco.step()
    # 8 gradients = 2 rounds; a round: max(2·1 s, 2·2 s) compute + ring all-reduce of 2(K−1) = 2
    # steps of (0.5 s latency + (4n/2 bytes)/(4n bytes/s)); bytes: 2(K−1)/K·4n = 4n per round
    assert diloco.t == 2 and diloco.gradients == 8
    assert diloco.time == pytest.approx(2 * (4 + 2 * (0.5 + 0.5)), abs=1e-12)
    np.testing.assert_array_equal(diloco.bytes_sent, [8.0 * n, 8.0 * n])
    assert diloco.describe()["busy_fraction"] == pytest.approx([4 / 12, 8 / 12], abs=1e-12)
    allreduce = start(sim_cfg, sim, "allreduce", seed=0)
    while not allreduce.done:
        allreduce.step()
    assert allreduce.t == 4 and allreduce.time == pytest.approx(4 * (2 + 2 * 1.0), abs=1e-12)
    np.testing.assert_array_equal(allreduce.bytes_sent, [16.0 * n, 16.0 * n])
    naig = start(sim_cfg, sim, "diloco-naig", seed=0)
    while not naig.done:
        naig.step()
    np.testing.assert_array_equal(naig.bytes_sent, [2 * (4.0 * n + 56), 2 * (4.0 * n + 56)])  # + sketch


def test_naig_weights_pseudo_gradients_against_their_mean() -> None:
    cfg = SimulateConfig.from_options(arrivals="exp:1,exp:1,exp:2", local_steps=(2,), steps=4, beta=2.0,
                         strategies=("diloco-naig-exact",), **BASE)
    run = start(cfg, Workload(cfg), "diloco-naig-exact", seed=0)
    assert isinstance(run, RoundRun) and run.gibbs
    run.step()
    d = run.pseudo.to(torch.float64)
    e = (8 / 3) * (4 / 14) * ((d - d.mean(0)) ** 2).sum(-1)  # reference = the mean pseudo-gradient
    pi = gibbs_weights(e.numpy(), 2.0)
    np.testing.assert_allclose(run.history.rows()[0], pi, rtol=1e-6, atol=0)
    assert abs(run.history.rows()[0].sum() - 1) < 1e-12
    assert run.describe()["reference"] == "mean pseudo-gradient"


def test_every_strategy_gets_the_same_samples() -> None:
    cfg = SimulateConfig.from_options(arrivals="exp:1,exp:1,exp:2,exp:4", local_steps=(3, 2, 1, 1), steps=5,
                         strategies=("diloco", "gasloc", "gossip-adam", "local-sgd", "allreduce", "naig",
                                     "hogwild"),
                         **{**BASE, "eval_every": 2})
    res = run_experiment(cfg)
    budget = cfg.steps * 4 * cfg.batch_size
    for r in res.runs:
        assert r.curve_samples[0] == 0 and r.curve_samples[-1] == budget, r.strategy
        assert len(r.curve_samples) == len(r.curve_bytes) == len(r.curve_seconds) == len(r.curve)
        assert list(r.curve_seconds) == sorted(r.curve_seconds) and r.curve_seconds[-1] > 0
    diloco = next(r for r in res.runs if r.strategy == "diloco")
    assert diloco.local["rounds"] == 3  # 7 + 7 gradients, then the last 6 spread as 2,2,1,1
    hog = next(r for r in res.runs if r.strategy == "hogwild")
    assert hog.local is None and sum(hog.bytes_per_worker) == cfg.steps * 4 * 4.0 * N_PARAMS
    summary = {s.strategy: s for s in res.summaries}
    ring = 2 * 3 / 4 * 4.0 * N_PARAMS  # 2(K − 1)/K · 4n per all-reduce, one per step
    assert summary["allreduce"].bytes_per_worker == pytest.approx((cfg.steps * ring,) * 4)


def test_communication_of_an_arrival_run_counts_one_gradient_message_per_arrival() -> None:
    cfg = SimulateConfig.from_options(arrivals="exp:1,exp:3", steps=4, strategies=("hogwild",), **BASE)
    run = start(cfg, Workload(cfg), "hogwild", seed=0)
    while not run.done:
        run.step()
    samples, sent = run.communication()
    per = np.bincount(run.sender[:run.gradients], minlength=2)
    assert samples == 8 * cfg.batch_size and per[0] > per[1]
    np.testing.assert_array_equal(sent, per * 4.0 * N_PARAMS)


def test_same_seed_same_numbers() -> None:
    cfg = SimulateConfig.from_options(arrivals="exp:1,exp:2,exp:4", local_steps=(2,), steps=4,
                                      strategies=("gasloc",),
                         **BASE)
    a, b = run_experiment(cfg).runs[0], run_experiment(cfg).runs[0]
    assert dataclasses.replace(a, ms_per_step=0) == dataclasses.replace(b, ms_per_step=0)


@pytest.mark.parametrize(("changes", "field", "needle"), [
    (dict(strategies=("diloco",)), "strategies", "needs `arrivals`"),
    (dict(local_steps=(5,)), "local_steps", "needs `arrivals`"),
    (dict(bandwidth=(1e6,)), "bandwidth", "needs `arrivals`"),
    (dict(arrivals="exp:1,exp:2", outer_lr=0.5, strategies=("hogwild",)), "outer_lr",
     "local-update strategies only"),
    (dict(arrivals="exp:1,exp:2", outer_momentum=0.5, strategies=("allreduce", "local-sgd")),
     "outer_momentum", "list one in `strategies`"),
    (dict(arrivals="exp:1,exp:2", local_steps=(5,), strategies=("hogwild", "allreduce")), "local_steps",
     "diloco, diloco-naig, diloco-naig-exact, gasloc, gossip-adam, local-sgd"),
    (dict(arrivals="exp:1,exp:2", strategies=("diloco",), local_steps=(1, 2, 3)), "local_steps",
     "one per worker"),
    (dict(arrivals="exp:1,exp:2", strategies=("diloco",), local_steps=(0,)), "local_steps", "int >= 1"),
    (dict(arrivals="exp:1,exp:2", strategies=("diloco",), outer_momentum=1.0), "outer_momentum", "[0, 1)"),
    (dict(arrivals="exp:1,exp:2", strategies=("diloco",), outer_lr=float("nan")), "outer_lr", "finite"),
    (dict(arrivals="exp:1,exp:2", bandwidth=(1e6, 0.0)), "bandwidth", "> 0"),
    (dict(arrivals="exp:1,exp:2", bandwidth=(1e6, 1e6, 1e6)), "bandwidth", "one per worker"),
])
def test_bad_local_options_name_their_field(changes: dict, field: str, needle: str) -> None:
    with pytest.raises(UsageError) as exc:
        SimulateConfig.from_options(**changes)
    assert exc.value.field == field and needle in exc.value.message


def test_one_name_is_one_algorithm_and_defaults() -> None:
    """naig is the gradient rule beside local-update methods too; diloco-naig weights pseudo-gradients."""
    plain = SimulateConfig.from_options(arrivals="exp:1,exp:2")
    assert plain.setting.bandwidth == ()
    cfg = SimulateConfig.from_options(arrivals="exp:1,exp:2", strategies=("naig", "diloco", "diloco-naig"))
    assert cfg.setting.inner_steps() == (10, 10)
    two = SimulateConfig.from_options(arrivals="exp:1,exp:2", local_steps=[4, 2], strategies=("diloco",))
    assert two.setting.inner_steps() == (4, 2)
    with pytest.raises(UsageError, match="local-update strategies only"):  # no method to take it
        SimulateConfig.from_options(arrivals="exp:1,exp:2", local_steps=(4, 2), strategies=("naig",))
    assert SimulateConfig.from_options(arrivals="exp:1").workers == 1  # K = the list length
    sim_cfg = cfg.with_options(steps=1, **BASE)
    sim = Workload(sim_cfg)
    assert isinstance(start(sim_cfg, sim, "naig", seed=0), ArrivalRun)  # the same naig as without diloco
    run = start(sim_cfg, sim, "diloco-naig", seed=0)
    assert isinstance(run, RoundRun) and run.method.weighting == "gibbs"
