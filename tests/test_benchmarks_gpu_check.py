"""benchmarks/gpu_check.py on the CPU: its plumbing with a tiny model (the real run needs a lent GPU)."""

from __future__ import annotations

import doctest
import importlib.util
import json
import math
import os
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import run_python

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
TINY = ["--device", "cpu", "--skip-monitor", "--model", "gpt-nano", "--sketch-model", "gpt-nano",
        "--sketch-vocab", "256",
        "--sketch-repeats", "3"]


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    # One torch thread: on CPU the script checks plumbing, not speed, and beside the other test
    # worker two threads cost it 2x the CPU (14 s vs 7 s wall beside two busy processes, measured).
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop("OUT", None)
    return run_python(SCRIPT, *args, cwd=ROOT, timeout=timeout, env=env)


def _errors(stderr: str) -> list[str]:
    """stderr lines that are not Python warnings."""
    return [ln for ln in stderr.splitlines() if ln.strip() and "Warning" not in ln and not ln.startswith(" ")]


def test_plumbing_on_cpu_writes_every_part(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = _run(*TINY, "--steps", "3", "--strategies", "naig,hogwild", "--lags", "0,2", "--out", str(out))
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    doc = json.loads((out / "gpu_check.json").read_text())
    assert doc["exit_code"] == 0 and doc["reason"] is None
    assert {"date", "command", "options", "environment", "budget_seconds", "elapsed_s"} <= set(doc)
    assert "--lags 0,2" in doc["command"]
    env = doc["environment"]
    assert env["torch"] == torch.__version__ and env["device"] == "cpu"

    sk = doc["sketch"]
    assert sk["status"] == "finished" and sk["finished"]
    assert sk["layout"]["n_params"] > 0 and sk["layout"]["vocab"] == 256
    assert set(sk["dtypes"]) == {"fp32", "bf16"}
    for r_dtype in sk["dtypes"].values():
        assert r_dtype["passed"]
        for check in ("full_vs_numpy", "prefix_vs_python_loop"):
            assert r_dtype[check]["passed"] and r_dtype[check]["max_err_over_bound"] <= 1.0
        assert r_dtype["prefix_vs_python_loop"]["scalars"] > 0
        assert r_dtype["ms_per_gradient"] > 0 and r_dtype["k_rows"] == 2

    sim = doc["simulate"]
    assert sim["status"] == "finished" and sim["finished"] and sim["steps"] == 3
    assert "autocast" in sim["precision"]
    assert list(sim["per_strategy"]) == ["naig", "hogwild"]
    for row in sim["per_strategy"].values():
        assert row["finished"] and row["runs_finished"] == 1
        assert len(row["final_val_loss"]) == 1 and math.isfinite(row["final_val_loss"][0])
        assert row["updates"] == [3] and row["steps_per_s"] > 0
        assert row["peak_gib"] is None  # CPU: no GPU memory to report
    overhead = sim["routing_overhead"]
    assert overhead["ratio"] == pytest.approx(overhead["naig_ms_per_step"] / overhead["hogwild_ms_per_step"])
    assert sim["config"]["lags"]["lags"] == [0, 2]

    result = json.loads((out / sim["result_file"]).read_text())
    assert {r["strategy"] for r in result["runs"]} == {"naig", "hogwild"}
    with tarfile.open(out / "simulate-csv.tar.gz") as tar:
        assert len([m for m in tar.getnames() if m.endswith(".csv")]) == 2
    assert (out / "gpu_check.log").read_text().strip()
    last = r.stdout.strip().splitlines()
    assert last[-1].strip().startswith("routing overhead") and any(ln.startswith("gpu_check:") for ln in last)


def test_budget_stops_a_run_and_never_reports_it_finished(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = _run(*TINY, "--skip-sketch", "--steps", "1000000", "--strategies", "naig,hogwild", "--lags", "0,2",
             "--budget-seconds", "2", "--out", str(out))
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = _errors(r.stderr)
    assert len(lines) == 1 and "budget" in lines[0], r.stderr
    doc = json.loads((out / "gpu_check.json").read_text())
    assert doc["sketch"]["status"] == "skipped"
    assert doc["simulate"]["status"] == "stopped" and not doc["simulate"]["finished"]
    assert not any(row["finished"] for row in doc["simulate"]["per_strategy"].values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: --device cuda is valid here")
def test_cuda_without_a_gpu_is_a_one_line_usage_error(tmp_path: Path) -> None:
    r = _run("--device", "cuda", "--out", str(tmp_path / "out"), timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "cuda" in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("bad", [("--lags", "0,x"), ("--monitor-batch", "0"), ("--monitor-models", "gpt9")])
def test_usage_errors_are_one_line(tmp_path: Path, bad: tuple[str, str]) -> None:
    r = _run(*TINY, *bad, "--out", str(tmp_path / "out"), timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert bad[0].lstrip("-") in r.stderr and not (tmp_path / "out").exists()


def _module() -> object:
    """The script as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docstring_examples() -> None:
    module = _module()
    failed, attempted = doctest.testmod(module)
    assert attempted > 0 and failed == 0


def test_the_comparison_fails_beyond_the_float64_bound() -> None:
    module = _module()
    gen = np.random.default_rng(0)
    x = gen.standard_normal(10_000)
    buckets = gen.integers(0, 14, x.size)
    ref = np.bincount(buckets, weights=x, minlength=14)
    shuffled = gen.permutation(x.size)  # the same terms summed in another order
    got = np.bincount(buckets[shuffled], weights=x[shuffled], minlength=14)
    counts = np.bincount(buckets, minlength=14)
    abs_sums = np.bincount(buckets, weights=np.abs(x), minlength=14)
    assert module.compare_sketches(got, ref, counts, abs_sums)["passed"]
    bound = module.summation_bound(counts, abs_sums)
    wrong = got.copy()
    wrong[3] += 2 * bound[3]
    out = module.compare_sketches(wrong, ref, counts, abs_sums)
    assert not out["passed"] and out["max_err_over_bound"] > 1


def test_steps_are_sized_from_a_probe_to_the_budget(tmp_path: Path) -> None:
    out, budget = tmp_path / "out", 20.0  # the probe (~2 s idle) must fit well inside it on a loaded machine
    r = _run(*TINY, "--skip-sketch", "--strategies", "naig,hogwild", "--lags", "0,2", "--probe-steps", "2",
             "--budget-seconds", str(budget), "--out", str(out))
    doc = json.loads((out / "gpu_check.json").read_text())
    sim = doc["simulate"]
    assert r.returncode in (0, 1), (r.stdout, r.stderr)
    if "sizing" not in sim:  # the budget ran out inside the probe itself (a machine loaded many times over)
        assert r.returncode == 1 and sim["status"] == "stopped" and "budget" in sim["reason"], sim
        return
    sizing = sim["sizing"]
    assert sizing["strategies"] == ["naig", "hogwild"] and sizing["grad_s"] > 0
    gc = _module()  # the steps are the most whose estimate from the probe's times fits what is left
    fits = gc.size_steps(sizing["available_s"] / sizing["margin"], sizing["grad_s"], sizing["eval_s"],
                         sizing["run_start_s"], ("naig", "hogwild"), (0, 2), 1,
                         lambda s: gc._evaluations(max(1, s // 4), s))
    assert sizing["steps"] == fits
    if fits < 1:  # a loaded machine: the probe left too little of the budget (CI, 2026-12-06), and it says so
        assert r.returncode == 1 and sim["status"] == "stopped" and "fit no step" in sim["reason"], sim
        return
    assert sim["steps"] == sizing["steps"]
    # a slow machine may stop the last run at the budget: then it says so and reports it unfinished
    if r.returncode == 1:
        assert sim["status"] == "stopped" and "budget" in sim["reason"]
    else:
        assert all(row["finished"] for row in sim["per_strategy"].values())
    assert doc["elapsed_s"] <= budget + 5


def test_the_monitor_part_on_cpu(tmp_path: Path) -> None:
    """Part 3's plumbing: the payload kernel against the other CPU body, and the step overhead."""
    out = tmp_path / "out"
    r = _run("--device", "cpu", "--skip-sketch", "--skip-simulate", "--monitor-models", "tiny,gpt-nano",
             "--monitor-rounds", "2", "--monitor-steps", "1", "--sketch-repeats", "2", "--out", str(out))
    assert r.returncode == 0, (r.stdout, r.stderr)
    mon = json.loads((out / "gpu_check.json").read_text())["monitor"]
    assert mon["status"] == "finished" and mon["hbm_tbps"] == 4.8
    tiny = mon["models"]["tiny"]
    assert tiny["kernel"]["n_params"] == tiny["step"]["n_params"] == 64 * 128 + 128 + 128 * 64 + 64
    for d in ("fp32", "bf16"):
        assert tiny["kernel"][d]["check"]["passed"] and tiny["kernel"][d]["gb_per_s"] > 0
    assert tiny["step"]["ms_plain"] > 0 and tiny["step"]["ratio"] > 0
    assert tiny["step"]["backend"] == "gloo"  # the one-rank group of the DDP variants
    assert set(tiny["step"]["ms"]) == {"plain", "observe", "ddp", "ddp+hook"}
    ms = tiny["step"]["ms"]
    assert tiny["step"]["ddp_ratio"] == pytest.approx(ms["ddp+hook"] / ms["ddp"])
    assert "MonitorHook" in r.stdout
    nano = mon["models"]["gpt-nano"]  # the GPT path: the preset's layout, 8 sequences, next-byte loss
    assert nano["kernel"]["n_params"] == nano["step"]["n_params"] == 120_576 and nano["step"]["batch"] == 8
    assert all(nano["kernel"][d]["check"]["passed"] for d in ("fp32", "bf16"))
    assert "monitor finished:" in r.stdout


def test_the_payload_check_fails_beyond_the_bound_and_on_other_counts() -> None:
    module = _module()
    ref = np.r_[np.arange(14.0), 30.0, 0.0]
    assert module.payload_check(ref.copy(), ref, 1000, 100.0)["passed"]
    assert not module.payload_check(ref + np.r_[np.zeros(13), 1e-6, 0, 0], ref, 1000, 100.0)["passed"]
    assert not module.payload_check(np.r_[ref[:-1], 1.0], ref, 1000, 100.0)["passed"]


def test_the_monitor_models_are_built_on_the_device_asked_for() -> None:
    """Part 3's MLPs hold their parameters on the device named (the first H200 run built them on the CPU)."""
    model = _module()._mlp((8, 16, 4), torch.device("meta"))
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert sum(p.numel() for p in model.parameters()) == 8 * 16 + 16 + 16 * 4 + 4
