"""The DDP communication hook (naig.distributed.ddp) on 3 real processes (gloo, CPU).

tests/ddp_ranks.py runs the ranks (with 2 ranks E₁ = E₂ always, so 3); this file runs it
as a timed subprocess, checks that no rank outlives it, and compares what the ranks
wrote with plain DDP, with ``naig.Router`` and with a hand-computed combine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from naig import Router
from naig.distributed.ddp import energies_to_mean
from naig.metric import fano_fisher_metric
from tests.conftest import leftover_processes

WORLD = 3


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("ddp")
    out = tmp / "out.json"
    env = {**os.environ, "TMPDIR": str(tmp)}
    try:
        cmd = [sys.executable, "-m", "tests.ddp_ranks", str(out)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    finally:
        deadline = time.monotonic() + 10
        while leftover_processes(str(tmp)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not leftover_processes(str(tmp))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


def _bucket(grads: list, step: int, names: list[str]) -> list[dict[str, torch.Tensor]]:
    """Each rank's gradient of one step, restricted to a bucket's parameters."""
    return [{n: torch.tensor(grads[k][step - 1][n]) for n in names} for k in range(WORLD)]


def _mean(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {n: sum(s[n] for s in states) / len(states) for n in states[0]}


def _flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in state.values()]).double()


def test_route_false_is_bit_identical_to_plain_ddp(ranks: dict) -> None:
    assert ranks["bit_identical"] == [True] * WORLD


def test_logged_energies_and_weights_equal_the_router(ranks: dict) -> None:
    records = ranks["records"]
    assert {r["step"] for r in records} == {1, 2, 3} and len(records) > 3  # several buckets per step
    assert ranks["same_on_every_rank"]
    router = Router(lags=None, beta="auto", seed=0)
    for rec in records:
        states = _bucket(ranks["grads"], rec["step"], rec["parameters"])
        ref = _mean(states)
        # the wire carries float32 sketches (56 B per rank): agreement to float32 rounding
        # (measured: 8e-8 relative on E, 2e-8 on π)
        assert rec["energies"] == pytest.approx(router.energies(states, reference=ref).tolist(), rel=1e-6)
        assert rec["pi"] == pytest.approx(router.weights(states, reference=ref).tolist(), abs=1e-7)
        g = [_flat(s) for s in states]
        mean = sum(g) / WORLD  # route=False: the all-reduced bucket is the mean
        cos = [float(x @ mean / (x.norm() * mean.norm())) for x in g]
        assert rec["cos"] == pytest.approx(cos, rel=1e-5)


def test_route_true_all_reduces_the_pi_weighted_sum(ranks: dict) -> None:
    (step1,) = {r["step"] for r in ranks["routed_records"]}
    for rec in ranks["routed_records"]:
        states = _bucket(ranks["routed_grads"], step1, rec["parameters"])
        for name in rec["parameters"]:
            want = sum(p * s[name].double() for p, s in zip(rec["pi"], states, strict=True))
            got = torch.tensor(ranks["routed"][name]).double()
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-7), name


def test_route_true_leaves_a_nan_rank_out(ranks: dict) -> None:
    for rec in ranks["nan_records"]:
        assert rec["pi"][2] == 0.0 and sum(rec["pi"]) == pytest.approx(1.0)
        assert np.isnan(rec["energies"][2])
    assert ranks["nan_synced_finite"] and ranks["nan_finite"]


def test_energies_to_mean_ignores_non_finite_rows() -> None:
    psi = torch.from_numpy(fano_fisher_metric((1, 2, 4)))
    s = torch.zeros(3, 14, dtype=torch.float64)
    s[0, 4], s[2] = 2.0, float("nan")
    e = energies_to_mean(s, psi)  # mean of rows 0 and 1: coordinate 4 = 1
    assert e[:2].tolist() == pytest.approx([2.0, 2.0]) and np.isnan(e[2])
