"""The DDP communication hook (naig.distributed.ddp) on 3 real processes (gloo, CPU).

tests/ddp_ranks.py runs the ranks (with 2 ranks E₁ = E₂ always, so 3); this file runs it
as a timed subprocess, checks that no rank outlives it, and compares what the ranks
wrote with plain DDP, with ``naig.Router`` and with a hand-computed combine.
"""

from __future__ import annotations

import csv
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from naig import Router
from naig.distributed.ddp import TWO_RANKS, NaigCommHook, energies_to_mean
from naig.errors import UsageError
from naig.metric import fano_fisher_metric
from tests.conftest import process_group_in_this_process, run_ranks

WORLD = 3


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    return run_ranks("tests.ddp_ranks", tmp_path_factory.mktemp("ddp"), timeout=240)


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


# ----------------------------------------------------------------- construction, CSV, 2 ranks, imports


def _two_rank_warnings(record: list) -> list[str]:
    return [str(w.message) for w in record if str(w.message) == TWO_RANKS]


def test_two_ranks_energies_are_always_equal() -> None:
    """Why the hook warns: against the mean of two sketches the drifts are ±d, E_0 = E_1."""
    psi = torch.from_numpy(fano_fisher_metric((1, 2, 4)))
    s = torch.randn(50, 2, 14, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    e = np.stack([energies_to_mean(x, psi) for x in s])
    np.testing.assert_allclose(e[:, 0], e[:, 1], rtol=1e-12, atol=0)
    assert (e > 0).all() and "\n" not in TWO_RANKS


@pytest.mark.parametrize(("world", "warned"), [(2, 1), (3, 0), (4, 0)])
def test_two_ranks_warn_once_at_construction(world: int, warned: int) -> None:
    model = torch.nn.Linear(3, 2)
    with process_group_in_this_process("fake", world), warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        hook = NaigCommHook(model)
        hook.register(DistributedDataParallel(model))
    assert len(_two_rank_warnings(record)) == warned


def test_two_ranks_warn_at_register_when_built_before_the_group() -> None:
    model = torch.nn.Linear(3, 2)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        hook = NaigCommHook(model)  # no process group yet: nothing known
        assert not _two_rank_warnings(record)
        with process_group_in_this_process("fake", 2):
            hook.register(DistributedDataParallel(model))
    assert len(_two_rank_warnings(record)) == 1


@pytest.mark.parametrize("target", ["missing/x.csv", "."])
def test_bad_csv_path_fails_at_construction_naming_it(tmp_path, monkeypatch, target: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as info:
        NaigCommHook(torch.nn.Linear(3, 2), csv_path=target)
    msg = str(info.value)
    assert info.value.field == "csv_path" and msg.startswith("csv_path=") and "\n" not in msg
    assert ("create it" if target != "." else "pass a file name") in msg
    assert not (tmp_path / "missing").exists()


def _train(hook: NaigCommHook, model: torch.nn.Module, steps: int) -> None:
    ddp = DistributedDataParallel(model)
    hook.register(ddp)
    for i in range(steps):
        ddp(torch.full((2, 3), float(i + 1))).square().sum().backward()


def _steps(path) -> list[int]:
    with open(path, newline="") as fh:
        return [int(row["step"]) for row in csv.DictReader(fh)]


def test_existing_csv_is_refused_unless_append_which_continues_the_step_count(tmp_path) -> None:
    path = tmp_path / "hook.csv"
    model = torch.nn.Linear(3, 2)
    with process_group_in_this_process("gloo", 1):
        _train(NaigCommHook(model, csv_path=path), model, 2)
        first = path.read_text()
        assert _steps(path) == [1, 2]  # one bucket, one rank: one row per step
        with pytest.raises(UsageError, match=r"^csv_path=.*: exists; pass append=True"):
            NaigCommHook(model, csv_path=path)
        assert path.read_text() == first  # nothing written by the refused hook
        hook = NaigCommHook(model, csv_path=path, append=True)
        _train(hook, model, 3)
    assert _steps(path) == [1, 2, 3, 4, 5] and [r.step for r in hook.last] == [3]
    assert path.read_text().startswith(first)


def test_append_refuses_a_file_that_is_not_the_hooks_csv(tmp_path) -> None:
    other = tmp_path / "notes.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(UsageError, match=r"^csv_path=.*is not a CSV of this hook"):
        NaigCommHook(torch.nn.Linear(3, 2), csv_path=other, append=True)


@pytest.mark.parametrize(("kwargs", "field"), [({"module": "model"}, "module"), ({"line": 5}, "line"),
                                               ({"beta": "hot"}, "beta"), ({"seed": -1}, "seed")])
def test_wrong_arguments_are_usage_errors_naming_them(kwargs: dict, field: str) -> None:
    args = {"module": torch.nn.Linear(3, 2)} | kwargs
    with pytest.raises(UsageError) as info:
        NaigCommHook(args.pop("module"), **args)
    assert info.value.field == field


def test_importing_the_hook_loads_neither_scipy_nor_the_simulator() -> None:
    code = ("import sys, naig.distributed.ddp; print(sorted({m.split('.')[0] if m.startswith('scipy') "
            "else m for m in sys.modules if m.startswith(('scipy', 'naig.simulate'))}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", r.stdout


def test_the_hooks_library_modules_import_scipy_lazily() -> None:
    """What the hook module itself imports (its package __init__ aside) loads no scipy."""
    code = ("import sys, naig.energy, naig.gibbs, naig.metric, naig.sketch.core, naig.sketch.torch_sketch, "
            "naig.errors; print(sorted(m for m in sys.modules if m.startswith(('scipy', 'naig.simulate'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr[-2000:]
