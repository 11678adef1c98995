"""run_audit: figures measured against a direct computation (docs/design.md §6, §7)."""

import math

import numpy as np
import pytest
import torch

from naig.audit import AuditConfig, run_audit
from naig.energy import energy
from naig.gibbs import gibbs_weights
from naig.io import save_gradients
from naig.sketch import sketch_reference
from tests.conftest import make_state


def _flat(state):
    return np.concatenate([v.double().reshape(-1).numpy() for v in state.values()])


def _load(path):
    from safetensors.torch import load_file

    return load_file(path)


def test_matches_direct_computation(grads_dir):
    ref_path = grads_dir / "ref.safetensors"
    workers = sorted((grads_dir / "workers").glob("*.safetensors"))
    result = run_audit(ref_path, workers, AuditConfig(beta=0.5, chunk=97))
    ref = _load(ref_path)
    sr = sketch_reference({k: v.double().numpy() for k, v in ref.items()})
    energies = []
    for score, path in zip(result.files, workers, strict=True):
        x = _load(path)
        sx = sketch_reference({k: v.double().numpy() for k, v in x.items()})
        e = float(energy(sx - sr))
        energies.append(e)
        a, b = _flat(x), _flat(ref)
        assert score.energy == pytest.approx(e, rel=1e-10, abs=1e-10)
        assert score.delta_norm == pytest.approx(np.linalg.norm(a - b), rel=1e-12, abs=1e-12)
        assert score.cos == pytest.approx(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)), rel=1e-12)
    np.testing.assert_allclose([f.pi for f in result.files], gibbs_weights(np.array(energies), 0.5))
    assert result.n == 40 * 30 + 30 + 7 * 40 and result.compression == pytest.approx(result.n / 14)
    assert [f.meta("lag") for f in result.files] == [0, 10, 20]
    assert result.bytes_read == 4 * result.n * 4  # reference once + three workers, float32


def test_chunk_size_does_not_change_results(grads_dir):
    args = (grads_dir / "ref.safetensors", [grads_dir / "workers"])
    a = run_audit(*args, AuditConfig(chunk=13))
    b = run_audit(*args, AuditConfig(chunk=1 << 22))
    for fa, fb in zip(a.files, b.files, strict=True):
        assert fa.energy == pytest.approx(fb.energy, rel=1e-12, abs=1e-12)
        assert fa.cos == pytest.approx(fb.cos, rel=1e-13)


def test_sketches_report_mean_and_std(grads_dir):
    args = (grads_dir / "ref.safetensors", [grads_dir / "workers"])
    r = run_audit(*args, AuditConfig(sketches=5, seed=3))
    singles = [run_audit(*args, AuditConfig(seed=3 + i)) for i in range(5)]
    for k, f in enumerate(r.files):
        es = [s.files[k].energy for s in singles]
        assert f.energy == pytest.approx(np.mean(es), rel=1e-10, abs=1e-12)
        assert f.energy_std == pytest.approx(np.std(es, ddof=1), rel=1e-8, abs=1e-12)


def test_auto_beta_and_verdicts(grads_dir):
    r = run_audit(grads_dir / "ref.safetensors", [grads_dir / "workers"])
    e = np.array([f.energy for f in r.files])
    assert r.beta == pytest.approx(1 / np.median(e[e > 0]))
    assert sum(f.pi for f in r.files) == pytest.approx(1.0)
    assert r.k_eff == pytest.approx(1 / sum(f.pi**2 for f in r.files))
    for f in r.files:
        assert f.verdict == ("frozen" if f.pi < 0.01 / 3 else "integrated")


def test_non_finite_worker_gets_zero_weight(tmp_path):
    ref = make_state(0)
    save_gradients(tmp_path / "ref.safetensors", ref)
    bad = dict(ref)
    bad["layer.bias"] = bad["layer.bias"].clone()
    bad["layer.bias"][3] = float("nan")
    save_gradients(tmp_path / "bad.safetensors", bad)
    save_gradients(tmp_path / "ok.safetensors", make_state(1))
    r = run_audit(tmp_path / "ref.safetensors", [tmp_path / "bad.safetensors", tmp_path / "ok.safetensors"])
    bad_score, ok_score = r.files
    assert bad_score.verdict == "non-finite" and bad_score.pi == 0.0
    assert bad_score.nonfinite_tensor == "layer.bias" and math.isnan(bad_score.energy)
    assert ok_score.pi == 1.0 and ok_score.verdict == "integrated"


def test_zero_norm_cosine_undefined(tmp_path):
    zero = {k: torch.zeros_like(v) for k, v in make_state(0).items()}
    save_gradients(tmp_path / "ref.safetensors", zero)
    save_gradients(tmp_path / "w.safetensors", make_state(1))
    (f,) = run_audit(tmp_path / "ref.safetensors", [tmp_path / "w.safetensors"]).files
    assert f.cos is None and f.delta_norm > 0 and np.isfinite(f.energy)


def test_low_precision_equals_upcast_float32(tmp_path):
    ref = make_state(0, dtype=torch.bfloat16)
    w = make_state(1, dtype=torch.bfloat16)
    save_gradients(tmp_path / "ref.safetensors", ref)
    save_gradients(tmp_path / "w.safetensors", w)
    save_gradients(tmp_path / "ref32.safetensors", {k: v.float() for k, v in ref.items()})
    save_gradients(tmp_path / "w32.safetensors", {k: v.float() for k, v in w.items()})
    (a,) = run_audit(tmp_path / "ref.safetensors", [tmp_path / "w.safetensors"]).files
    (b,) = run_audit(tmp_path / "ref32.safetensors", [tmp_path / "w32.safetensors"]).files
    assert (a.energy, a.cos, a.delta_norm) == (b.energy, b.cos, b.delta_norm)


def test_reference_listed_as_worker_is_skipped(grads_dir):
    ref = grads_dir / "ref.safetensors"
    r = run_audit(ref, [ref, grads_dir / "workers"])
    assert len(r.files) == 3 and any("reference itself" in w for w in r.warnings)


def test_router_and_audit_agree_on_the_same_gradients(grads_dir):
    """The library Router (torch) and the streaming audit (files) share one sketch definition."""
    from safetensors.torch import load_file

    from naig.router import Router

    ref = load_file(grads_dir / "ref.safetensors")
    paths = sorted((grads_dir / "workers").glob("*.safetensors"))
    workers = [load_file(p) for p in paths]
    e_router = Router(lags=(0, 10, 20), seed=4).energies(workers, reference=ref)
    e_audit = [f.energy for f in run_audit(grads_dir / "ref.safetensors", paths, AuditConfig(seed=4)).files]
    np.testing.assert_allclose(e_audit, e_router, rtol=1e-10, atol=1e-10)


def test_cosine_of_a_file_with_itself_is_clamped_to_one(tmp_path):
    rng = np.random.default_rng(0)
    found = None
    for _ in range(200):  # find vectors whose float64 cosine with themselves rounds above 1
        x = rng.normal(size=7).astype(np.float32)
        a = x.astype(np.float64)
        if (a @ a) / (np.sqrt(a @ a) * np.sqrt(a @ a)) > 1.0:
            found = x
            break
    assert found is not None, "no vector rounds above 1: the test needs another seed"
    save_gradients(tmp_path / "r.safetensors", {"w": torch.from_numpy(found)})
    save_gradients(tmp_path / "w.safetensors", {"w": torch.from_numpy(found.copy())})
    (f,) = run_audit(tmp_path / "r.safetensors", [tmp_path / "w.safetensors"]).files
    assert f.cos == 1.0


def test_energy_rank_correlation_with_lag(tmp_path):
    """Workers drifting more the staler they are: r_s = 1 for ‖Δ‖; the exact p-value of 4 files is 2/24."""
    ref = make_state(0)
    save_gradients(tmp_path / "ref.safetensors", ref)
    for k, lag in enumerate((0, 10, 20, 35)):
        noise = make_state(50 + k, scale=0.1 * (k + 1))
        save_gradients(tmp_path / f"w{k}.safetensors", {n: ref[n] + noise[n] for n in ref}, lag=lag)
    r = run_audit(tmp_path / "ref.safetensors", sorted(tmp_path.glob("w*.safetensors")))
    doc = r.lag_correlation
    assert doc["files"] == 4 and doc["exact"] is True and doc["seed"] == 0
    assert doc["delta_norm"] == {"spearman": 1.0, "p_value": pytest.approx(2 / 24)}
    from scipy.stats import spearmanr

    want = spearmanr([0, 10, 20, 35], [f.energy for f in r.files]).statistic
    assert doc["energy"]["spearman"] == pytest.approx(want, abs=1e-12)
    assert r.to_dict()["lag_correlation"] == doc


def test_no_lag_metadata_no_correlation(grads_dir, tmp_path):
    save_gradients(tmp_path / "a.safetensors", make_state(1))
    save_gradients(tmp_path / "b.safetensors", make_state(2))
    r = run_audit(grads_dir / "ref.safetensors", [tmp_path])
    assert r.lag_correlation is None and r.to_dict()["lag_correlation"] is None
