"""Decentralised local updates (naig.simulate.arrivals.gossip; docs/design.md §13): GASLoC's accelerated
gossip, its DiLoCo limit, its clock and bytes; naig's asynchronous gossip-adam."""


import numpy as np
import pytest
import torch
from torch import nn

from naig.errors import UsageError
from naig.simulate import SimulateConfig, Workload
from naig.simulate.arrivals.gossip import GaslocRun, GossipAdamRun, gasloc_update, gossip_matrix, round_graph
from naig.simulate.engines import start

BASE = dict(seeds=1, data_bytes=200_000, eval_every=0, eval_batches=1, batch_size=2)
N_PARAMS = 120_576  # gpt-nano with the 256-byte vocabulary


def test_gossip_matrices_are_doubly_stochastic_and_preserve_the_mean() -> None:
    rng = np.random.default_rng(0)
    for k in range(2, 9):
        for topology in ("one-peer", "two-peer", "complete", "ring"):
            edges = round_graph(topology, k, rng)
            w = gossip_matrix(k, edges)
            np.testing.assert_allclose(w, w.T, rtol=0, atol=0)
            np.testing.assert_allclose(w.sum(0), 1.0, rtol=0, atol=1e-15)
            np.testing.assert_allclose(w.sum(1), 1.0, rtol=0, atol=1e-15)
            assert (w >= 0).all()
            x = rng.normal(size=(k, 5))
            np.testing.assert_allclose((w @ x).mean(0), x.mean(0), rtol=0, atol=1e-12)
    pair = gossip_matrix(5, [(1, 3)])  # a matching: α = 1/(1 + 1), the pair is averaged, the rest unchanged
    np.testing.assert_allclose(pair[[1, 3]][:, [1, 3]], 0.5, atol=0)
    np.testing.assert_allclose(gossip_matrix(4, round_graph("complete", 4, rng)), np.full((4, 4), 0.25),
                               atol=1e-15)  # α = 1/K on the complete graph: the exact average
    ring = gossip_matrix(4, round_graph("ring", 4, rng))  # degree 2: α = 1/3
    np.testing.assert_allclose(ring[0], [1 / 3, 1 / 3, 0, 1 / 3], atol=1e-15)
    np.testing.assert_allclose(gossip_matrix(2, [(0, 1)], alpha=0.2), [[0.8, 0.2], [0.2, 0.8]], atol=1e-15)
    np.testing.assert_array_equal(gossip_matrix(3, []), np.eye(3))
    with pytest.raises(ValueError, match="two different workers"):
        gossip_matrix(3, [(1, 1)])


def test_round_graphs_have_the_degrees_of_their_topology() -> None:
    rng = np.random.default_rng(1)
    seen = set()
    for _ in range(50):
        one = round_graph("one-peer", 6, rng)  # K even: a perfect matching
        assert sorted(v for e in one for v in e) == list(range(6))
        seen.add(tuple(one))
        odd = round_graph("one-peer", 5, rng)  # K odd: one worker sits out
        assert len(odd) == 2 and len({v for e in odd for v in e}) == 4
        two = round_graph("two-peer", 6, rng)
        degree = np.bincount([v for e in two for v in e], minlength=6)
        assert degree.max() <= 2 and degree.min() >= 1 and len(set(two)) == len(two)
    assert len(seen) > 5  # the matchings are random
    assert round_graph("complete", 4, rng) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    assert round_graph("ring", 2, rng) == [(0, 1)] and round_graph("one-peer", 1, rng) == []


def test_the_mixed_update_is_nesterov_sgd_on_the_mean_drift_on_a_complete_graph() -> None:
    """The derivation of docs/design.md §13 on tensors: θ_{t+1} = x̃_t + γ(x̃_t − x̃_{t−1}), x̃ = the exact
    average of θ + ηg, is torch's SGD (lr η, Nesterov momentum γ) on the pseudo-gradient −mean_i g_t^i."""
    gen = torch.Generator().manual_seed(0)
    k, n, eta, gamma = 4, 7, 0.7, 0.9
    average = torch.full((k, k), 1.0 / k, dtype=torch.float64)
    theta0 = torch.randn(n, generator=gen, dtype=torch.float64)
    params, previous = theta0.expand(k, -1).clone(), theta0.expand(k, -1).clone()
    shadow = nn.Parameter(theta0.clone())
    outer = torch.optim.SGD([shadow], lr=eta, momentum=gamma, nesterov=True)
    for _ in range(12):
        drift = torch.randn(k, n, generator=gen, dtype=torch.float64)
        params, previous = gasloc_update(params, drift, previous, average, eta, gamma, "mixed")
        shadow.grad = -drift.mean(0)
        outer.step()
        torch.testing.assert_close(params, shadow.detach().expand(k, -1), rtol=0, atol=1e-12)
    summarised = gasloc_update(params, drift, previous, average, eta, gamma, "summarised")[0]
    assert (summarised - summarised.mean(0)).abs().max() > 1e-3  # the workers keep γη(g^i_t − g^i_{t−1})


@pytest.mark.parametrize("momentum", [None, 0.0])
def test_gasloc_on_a_complete_graph_is_diloco(float64: None, momentum: float | None) -> None:
    """Default γ = 0.9: diloco's Nesterov SGD (lr 0.7, momentum 0.9); γ = 0: its plain outer SGD."""
    cfg = SimulateConfig.from_options(arrivals="const:1,const:2,const:1", local_steps=(1, 1, 2), steps=4,
                                      strategies=("diloco", "gasloc"), topology="complete",
                                      outer_momentum=momentum, **BASE)
    sim = Workload(cfg)
    diloco, gasloc = start(cfg, sim, "diloco", seed=0), start(cfg, sim, "gasloc", seed=0)
    assert isinstance(gasloc, GaslocRun) and gasloc.params.dtype == torch.float64
    theta0 = diloco.theta.clone()
    while not diloco.done:
        diloco.step()
        gasloc.step()
        torch.testing.assert_close(gasloc.params, diloco.theta.expand(3, -1), rtol=0, atol=1e-12)
    assert gasloc.done and gasloc.t == diloco.t == 3 and gasloc.gradients == diloco.gradients == 12
    assert (diloco.theta - theta0).abs().max() > 1e-3  # they moved


def test_summarised_form_on_a_complete_graph_is_not_diloco(float64: None) -> None:
    cfg = SimulateConfig.from_options(arrivals="const:1,const:1,const:1", local_steps=(1,), steps=2,
                                      strategies=("diloco", "gasloc"), topology="complete",
                                      gasloc_form="summarised", **BASE)
    sim = Workload(cfg)
    diloco, gasloc = start(cfg, sim, "diloco", seed=0), start(cfg, sim, "gasloc", seed=0)
    for _ in range(2):
        diloco.step()
        gasloc.step()
    assert gasloc.describe()["form"] == "summarised"
    assert (gasloc.params - gasloc.params.mean(0)).abs().max() > 1e-6  # unequal workers
    assert (gasloc.theta - diloco.theta).abs().max() > 1e-6


@pytest.mark.parametrize("arrivals", ["const:1,const:1,const:1", "const:1,const:2,const:1,const:3"])
def test_gamma_0_on_a_one_peer_matching_averages_the_proposals_of_each_pair(float64: None,
                                                                            arrivals: str) -> None:
    cfg = SimulateConfig.from_options(arrivals=arrivals, local_steps=(1,), steps=3, outer_momentum=0.0,
                                      strategies=("gasloc",), **BASE)
    run = start(cfg, Workload(cfg), "gasloc", seed=3)
    eta, k = run.method.outer_lr, cfg.workers
    assert (eta, run.method.topology, run.method.form) == (0.7, "one-peer", "mixed")
    for _ in range(3):
        before = run.params.clone()
        run.step()
        proposals = torch.stack([before[w] + eta * (run.replicas[w].detach() - before[w]) for w in range(k)])
        expected = proposals.clone()
        for i, j in run.edges:
            expected[[i, j]] = (proposals[i] + proposals[j]) / 2
        matched = {v for e in run.edges for v in e}
        assert len(matched) == 2 * (k // 2) and len(run.edges) == k // 2
        torch.testing.assert_close(run.params, expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(run.theta, proposals.mean(0), rtol=0, atol=1e-12)  # the mean is kept
    assert run.done


def test_a_gasloc_round_waits_only_for_matched_peers_and_sends_4n_per_peer() -> None:
    n = N_PARAMS
    cfg = SimulateConfig.from_options(arrivals="const:1,const:1,const:1,const:1", uplink="const:0.5",
                                      bandwidth=(4.0 * n, 4.0 * n, 4.0 * n, 1.0 * n), local_steps=(2,),
                                      steps=4, strategies=("gasloc",), **BASE)
    run = start(cfg, Workload(cfg), "gasloc", seed=0)
    run.step()
    partner = next(i + j - 3 for i, j in run.edges if 3 in (i, j))
    # ready at 2 s; a fast pair: 0.5 s latency + 4n/(4n B/s); the slow worker's pair: 0.5 + 4n/(n B/s)
    expected = np.full(4, 3.5)
    expected[[3, partner]] = 6.5
    np.testing.assert_allclose(run.finished, expected, rtol=0, atol=1e-12)
    assert run.time == pytest.approx(6.5, abs=1e-12)
    np.testing.assert_array_equal(run.bytes_sent, np.full(4, 4.0 * n))
    before = run.finished.copy()
    run.step()  # round 2: each pair starts when its later member is ready (2 s of compute after its end)
    for i, j in run.edges:
        slow = 3 in (i, j)
        end = max(before[i], before[j]) + 2 + 0.5 + (4.0 if slow else 1.0)
        assert run.finished[i] == pytest.approx(end, abs=1e-12) == run.finished[j]
    assert run.done and run.exchanges == 8
    np.testing.assert_array_equal(run.bytes_sent, np.full(4, 8.0 * n))


def test_a_complete_graph_sends_to_k_minus_1_peers_on_a_shared_link() -> None:
    n = N_PARAMS
    cfg = SimulateConfig.from_options(arrivals="const:1,const:1,const:3", bandwidth=(4.0 * n,),
                                      local_steps=(1,), steps=2, topology="complete", strategies=("gasloc",),
                                      **BASE)
    run = start(cfg, Workload(cfg), "gasloc", seed=0)
    run.step()
    # each worker's link carries 2 messages of 4n bytes: 2 s per transfer; every pair waits for worker 2 (3 s)
    np.testing.assert_allclose(run.finished, [5.0, 5.0, 5.0], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(run.bytes_sent, np.full(3, 2 * 4.0 * n))
    assert run.describe()["busy_fraction"] == pytest.approx([1 / 5, 1 / 5, 3 / 5], abs=1e-12)


@pytest.mark.parametrize(("changes", "field", "needle"), [
    (dict(topology="complete", strategies=("diloco",)), "topology", "gasloc only"),
    (dict(gasloc_form="mixed", strategies=("gossip-adam",)), "gasloc_form", "gasloc only"),
    (dict(gossip_step=0.6, topology="two-peer", strategies=("gasloc",)), "gossip_step", "(0, 0.5]"),
    (dict(gossip_step=0.5, topology="complete", strategies=("gasloc",)), "gossip_step", "degree up to 3"),
    (dict(gossip_step=0.0, strategies=("gasloc",)), "gossip_step", "(0, 1/d]"),
    (dict(topology="star", strategies=("gasloc",)), "topology", "one-peer, two-peer, complete, ring"),
    (dict(gasloc_form="nesterov", strategies=("gasloc",)), "gasloc_form", "mixed, summarised"),
    (dict(faults=("0:nan",), strategies=("gasloc", "gossip-adam")), "faults", "gasloc and gossip-adam"),
])
def test_bad_gasloc_options_name_their_field(changes: dict, field: str, needle: str) -> None:
    with pytest.raises(UsageError) as info:
        SimulateConfig.from_options(arrivals="exp:1,exp:1,exp:1,exp:1", **changes)
    assert info.value.field == field and needle in info.value.message, str(info.value)


def test_gasloc_options_reach_the_run() -> None:
    cfg = SimulateConfig.from_options(arrivals="const:1,const:1,const:1,const:1", local_steps=(1,), steps=2,
                                      strategies=("gasloc",), topology="two-peer", gossip_step=0.25,
                                      outer_lr=0.5, outer_momentum=0.3, gasloc_form="summarised", **BASE)
    run = start(cfg, Workload(cfg), "gasloc", seed=0)
    run.step()
    m = run.method
    assert (m.topology, m.gossip_step, m.outer_lr, m.momentum, m.form) == ("two-peer", 0.25, 0.5, 0.3,
                                                                          "summarised")
    degree = np.bincount([v for e in run.edges for v in e], minlength=4)
    np.testing.assert_array_equal(run.bytes_sent, degree * 4.0 * N_PARAMS)
    d = run.describe()
    assert d["topology"] == "two-peer" and d["gossip_step"] == 0.25 and d["outer"] == "gossip"


# gossip-adam: naig's asynchronous variant (gasloc's name until 2026-12-01)

def test_gossip_adam_exchanges_by_hand() -> None:
    n = N_PARAMS
    cfg = SimulateConfig.from_options(arrivals="const:1,const:1", uplink="const:0.5", bandwidth=(4.0 * n,),
                                      local_steps=(2,), steps=4, strategies=("gossip-adam",), **BASE)
    run = start(cfg, Workload(cfg), "gossip-adam", seed=0)
    assert isinstance(run, GossipAdamRun) and run.method.outer == "adam" and run.method.outer_lr == cfg.lr[0]
    times = []
    while not run.done:
        run.step()
        times.append(run.time)
    # both finish 2 steps at 2 s, exchange (0.5 + 4n/(4n) s), run 2 more steps, exchange again
    assert times == pytest.approx([2.0, 2.0, 3.5, 5.5, 5.5, 7.0], abs=1e-12)
    assert run.exchanges == 2 and run.gradients == 8 and run.t == 4
    np.testing.assert_array_equal(run.bytes_sent, [8.0 * n, 8.0 * n])
    torch.testing.assert_close(run.params[0].detach(), run.params[1].detach(), rtol=0, atol=0)  # averaged


def test_gossip_adam_exchanges_preserve_the_workers_mean_and_slow_workers_gossip_less() -> None:
    cfg = SimulateConfig.from_options(arrivals="const:1,const:1,const:1,const:4", local_steps=(1,), steps=8,
                                      strategies=("gossip-adam",), **BASE)
    run = start(cfg, Workload(cfg), "gossip-adam", seed=0)
    mixes = 0
    while not run.done:
        nxt = run.events[0]
        before = run.theta.clone()
        run.step()
        if nxt[2] >= 0:  # an exchange ended: the pair was averaged
            mixes += 1
            torch.testing.assert_close(run.theta, before, rtol=0, atol=1e-6)
    assert mixes == run.exchanges > 0 and run.gradients == run.budget == 32
    assert run.bytes_sent.sum() == 2 * 4.0 * N_PARAMS * run.exchanges
    assert run.bytes_sent[3] < run.bytes_sent[:3].min()  # the slow worker finishes fewer phases
