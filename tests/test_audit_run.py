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
    pos = e[e > 0]
    assert r.beta == pytest.approx(1 / (pos.min() if len(pos) == 2 else np.median(pos)))  # naig.gibbs
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


def _doc(result):
    doc = result.to_dict()
    del doc["seconds"], doc["throughput_bytes_per_s"]
    return doc


def test_thread_count_does_not_change_a_single_bit(tmp_path):
    """Per-piece sums are folded in one fixed order: 1, 2 or 3 threads give the same JSON."""
    ref = make_state(0)
    save_gradients(tmp_path / "ref.safetensors", ref)
    dtypes = (torch.float32, torch.bfloat16, torch.float8_e5m2fnuz, torch.float64)
    for k, dt in enumerate(dtypes):
        noise = make_state(50 + k, scale=0.2 * (k + 1))
        save_gradients(tmp_path / f"w{k}.safetensors", {n: (ref[n] + noise[n]).to(dt) for n in ref})
    workers = [tmp_path / f"w{k}.safetensors" for k in range(len(dtypes))]
    cfgs = [AuditConfig(chunk=97, sketches=3, threads=t) for t in (1, 2, 3)]
    docs = [_doc(run_audit(tmp_path / "ref.safetensors", workers, cfg)) for cfg in cfgs]
    assert docs[0] == docs[1] == docs[2]


def test_thread_count_does_not_change_a_single_bit_with_large_pieces(tmp_path):
    """Batches of several pieces of ~100k scalars (several tasks per batch, each streamed in
    cached blocks): 1, 2 and 4 threads give the same JSON."""
    g = torch.Generator().manual_seed(3)
    shapes = {"a": (300, 701), "b": (100_003,), "c": (5,), "d": (90_000,)}
    ref = {n: torch.randn(s, generator=g) for n, s in shapes.items()}
    save_gradients(tmp_path / "ref.safetensors", ref)
    for k, dt in enumerate((torch.float32, torch.bfloat16, torch.float16)):
        save_gradients(tmp_path / f"w{k}.safetensors",
                       {n: (v + 0.1 * (k + 1) * torch.randn(v.shape, generator=g)).to(dt)
                        for n, v in ref.items()})
    workers = [tmp_path / f"w{k}.safetensors" for k in range(3)]
    docs = [_doc(run_audit(tmp_path / "ref.safetensors", workers, AuditConfig(chunk=400_000, threads=t)))
            for t in (1, 2, 4)]
    assert docs[0] == docs[1] == docs[2]


FLOAT_DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn,
                torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu]


@pytest.mark.parametrize("dt", FLOAT_DTYPES, ids=str)
def test_every_float_dtype_is_audited_as_its_exact_float64_upcast(tmp_path, dt):
    """bf16, fp16 and every fp8 (fnuz and e8m0 too) are audited, not skipped, with the same numbers."""
    def state(seed):
        s = make_state(seed)
        return {n: (v.abs() + 0.1 if dt == torch.float8_e8m0fnu else v).to(dt) for n, v in s.items()}

    low = {"ref": state(0), "w": state(1)}
    for name, s in low.items():
        save_gradients(tmp_path / f"{name}.safetensors", s)
        save_gradients(tmp_path / f"{name}64.safetensors", {k: v.double() for k, v in s.items()})
    a = run_audit(tmp_path / "ref.safetensors", [tmp_path / "w.safetensors"], AuditConfig(chunk=300))
    b = run_audit(tmp_path / "ref64.safetensors", [tmp_path / "w64.safetensors"], AuditConfig(chunk=300))
    assert a.skipped["other dtype"] == 0 and a.n == b.n == 40 * 30 + 30 + 7 * 40
    fa, fb = a.files[0], b.files[0]
    assert (fa.energy, fa.cos, fa.delta_norm, fa.energy_spread, fa.drift) == (
        fb.energy, fb.cos, fb.delta_norm, fb.energy_spread, fb.drift)
    assert a.bytes_read * 8 == b.bytes_read * torch.empty(0, dtype=dt).element_size()


def _real_gradients(tmp_path):
    """Gradients of a small MLP on two batches (reference, worker) and a sparse edit of the reference."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10))
    grads = []
    for batch in range(2):
        g = torch.Generator().manual_seed(batch)
        x, y = torch.randn(32, 20, generator=g), torch.randint(0, 10, (32,), generator=g)
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    sparse = {n: v.clone() for n, v in grads[0].items()}
    sparse["0.weight"][3, :3] += torch.tensor([0.8, -0.1, 0.05])  # a drift on three coordinates
    for name, g in (("ref", grads[0]), ("other_batch", grads[1]), ("sparse", sparse)):
        save_gradients(tmp_path / f"{name}.safetensors", g)
    return [tmp_path / "other_batch.safetensors", tmp_path / "sparse.safetensors"]


def test_energy_spread_matches_the_spread_over_many_sketch_seeds(tmp_path):
    """Analytic std of E (docs/design.md §5.1) against 600 sketch seeds on real gradient files."""
    workers = _real_gradients(tmp_path)
    r = run_audit(tmp_path / "ref.safetensors", workers, AuditConfig(sketches=600, seed=11))
    single = run_audit(tmp_path / "ref.safetensors", workers, AuditConfig(seed=11))
    chi2 = []  # the χ²₄ law's std, (8/3)(‖Δ‖²/14)·√8, which ignores Σ Δ⁴
    for f, one in zip(r.files, single.files, strict=True):
        per_sketch = f.energy_spread * np.sqrt(600)  # the spread of one sketch's E
        assert f.energy_std == pytest.approx(per_sketch, rel=0.15)  # ~4 standard errors at 600 seeds
        assert one.energy_spread == pytest.approx(per_sketch, rel=1e-12)
        assert f.energy == pytest.approx(32 / 3 / 14 * f.delta_norm**2, rel=0.15)  # E[E] = tr Ψ ‖Δ‖² / 14
        chi2.append(np.sqrt(0.5) * 32 / 3 / 14 * f.delta_norm**2)
    assert r.files[0].energy_std == pytest.approx(chi2[0], rel=0.15)  # thousands of coordinates: χ²₄
    assert r.files[1].energy_std > 1.3 * chi2[1]  # three coordinates: Σ Δ⁴ makes E noisier than χ²₄


@pytest.mark.parametrize("seed,pairs", [(0, [(1, 2)]), (1, [])])
def test_rank_overlaps_follow_the_spreads(grads_dir, seed, pairs):
    """Seed 0: w1 16.2 ± 7.8 and w2 34.2 ± 29.1 overlap; seed 1: 4.9 ± 7.8 and 67.4 ± 29.1 do not."""
    r = run_audit(grads_dir / "ref.safetensors", [grads_dir / "workers"], AuditConfig(seed=seed))
    e = [f.energy for f in r.files]
    s = [f.energy_spread for f in r.files]
    lo = [max(a - b, 0.0) for a, b in zip(e, s, strict=True)]
    want = [(i, j) for i in range(3) for j in range(i + 1, 3) if lo[i] < e[j] + s[j] and lo[j] < e[i] + s[i]]
    assert r.rank_overlaps() == want == pairs
    doc = r.to_dict()
    assert doc["ranking_stable"] == (not pairs) and len(doc["rank_overlaps"]) == len(pairs)
    assert r.files[0].energy == 0.0 and r.files[0].energy_spread == 0.0  # w0 equals the reference


def test_huge_finite_float64_values_are_not_called_non_finite(tmp_path):
    """|x| ~ 1e80: Σ (x − r)⁴ overflows float64, but every value is finite: E, cos and ‖Δ‖
    are computed (only the spread, which needs the fourth powers, is undefined)."""
    g = torch.Generator().manual_seed(5)
    ref = {"a": torch.randn(1000, generator=g, dtype=torch.float64) * 1e80}
    work = {"a": ref["a"] + torch.randn(1000, generator=g, dtype=torch.float64) * 1e79}
    save_gradients(tmp_path / "ref.safetensors", ref)
    save_gradients(tmp_path / "w.safetensors", work)
    save_gradients(tmp_path / "w2.safetensors", {"a": ref["a"] * 1.5})
    r = run_audit(tmp_path / "ref.safetensors", [tmp_path / "w.safetensors", tmp_path / "w2.safetensors"])
    f = r.files[0]
    assert f.verdict != "non-finite" and f.nonfinite_tensor is None and np.isfinite(f.energy)
    x, y = work["a"].numpy(), ref["a"].numpy()
    assert f.cos == pytest.approx(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)), rel=1e-12)
    assert f.delta_norm == pytest.approx(np.linalg.norm(x - y), rel=1e-12)
    assert f.energy_spread is None


def test_files_whose_tensors_are_all_empty_are_refused_not_called_integrated(tmp_path):
    """Nothing compared (n = 0) is no verdict: a one-line DataError naming the reference."""
    from naig.errors import DataError

    for name in ("ref", "w"):
        save_gradients(tmp_path / f"{name}.safetensors", {"w": torch.zeros(0, 3), "b": torch.zeros(0)})
    with pytest.raises(DataError, match=r"ref\.safetensors: the 2 tensor\(s\) compared hold no values"):
        run_audit(tmp_path / "ref.safetensors", [tmp_path / "w.safetensors"])
    save_gradients(tmp_path / "ref2.safetensors", {"w": torch.zeros(0, 3), "b": torch.zeros(2)})
    save_gradients(tmp_path / "w3.safetensors", {"w": torch.zeros(0, 3), "b": torch.ones(2)})
    (f,) = run_audit(tmp_path / "ref2.safetensors", [tmp_path / "w3.safetensors"]).files  # 2 values: audited
    assert f.delta_norm == pytest.approx(math.sqrt(2.0))
