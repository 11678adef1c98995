"""Each example runs, and Experiment A's figures are measured independently by naig audit."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import assert_no_leftovers, run_naig, run_python

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def experiment_a(tmp_path_factory):
    out = tmp_path_factory.mktemp("experiment_a")
    r = run_python(ROOT / "examples" / "gram_schmidt_audit.py", "--out", out, timeout=300,
                   env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    assert "worker_lag35 " in r.stdout and "frozen" in r.stdout
    return out


def _audit(out: Path, beta: str) -> list[dict]:
    files = sorted(out.glob("worker_lag*.safetensors"))
    r = run_naig("audit", out / "oracle.safetensors", *files, "--beta", beta, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["files"]


def test_experiment_a_beta_1(experiment_a):
    files = {f["lag"]: f for f in _audit(experiment_a, "1")}
    cosines = [f["cos"] for f in files.values()]
    assert max(cosines) - min(cosines) < 1e-6 and cosines[0] == pytest.approx(0.8, abs=1e-6)
    assert round(files[10]["energy"], 2) == 9.23 and files[10]["verdict"] == "frozen"
    assert round(files[20]["energy"], 2) == 57.68 and files[20]["verdict"] == "frozen"
    assert files[20]["friction"] == pytest.approx(1.0, abs=1e-6)  # wholly in the ridge: E = E_max
    assert 0 < files[10]["friction"] < 1  # only partly in the ridge
    assert round(files[35]["energy"], 2) == 0.0
    assert files[35]["pi"] == max(f["pi"] for f in files.values())
    norms = [f["delta_norm"] for f in files.values()]
    assert max(norms) - min(norms) < 1e-5  # equal drift norms


def test_experiment_a_beta_auto_integrates_the_partial_worker(experiment_a):
    files = {f["lag"]: f for f in _audit(experiment_a, "auto")}
    assert files[10]["verdict"] == "integrated" and files[20]["verdict"] == "frozen"
    assert files[35]["pi"] == max(f["pi"] for f in files.values())


def test_router_loop_trains_and_its_gradients_audit(tmp_path):
    out = tmp_path / "grads"
    r = run_python(ROOT / "examples" / "router_loop.py", "--steps", "60", "--save", out, timeout=300,
                   cwd=ROOT)
    assert r.returncode == 0, r.stderr
    for rule in ("naig", "hogwild"):
        line = next(ln for ln in r.stdout.splitlines() if ln.startswith(rule))
        losses = [float(v) for v in line.split(":")[1].split()]
        assert len(losses) == 4 and losses[-1] < 0.9 * losses[0], line  # it learns
    audit = run_naig("audit", out / "ref.safetensors", out, "--json")
    assert audit.returncode == 0, audit.stderr
    files = json.loads(audit.stdout)["files"]
    assert sorted(f["worker"] for f in files) == [0, 1, 2, 3] and all(f["step"] == 59 for f in files)


def _readme_snippets() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_readme_has_python_snippets():
    """The README keeps one (the Router); the others moved to docs/, where tests/test_docs.py runs them."""
    assert len(_readme_snippets()) >= 1


@pytest.mark.parametrize("index", range(len(_readme_snippets())))
def test_readme_python_snippet_runs_as_it_stands(tmp_path, index):
    """Each snippet runs alone, unchanged, in an empty folder (files it writes land there)."""
    # A fresh interpreter: in one forked from the preloaded server, modules imported there would
    # already be attributes of their packages (a snippet using naig.io after `import naig` alone).
    r = subprocess.run([sys.executable, "-c", _readme_snippets()[index]], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
# Distributed engine (naig.distributed)
def test_ddp_gpt_trains_under_ddp_with_the_hook(tmp_path):
    """examples/ddp_gpt.py: 3 real ranks (gloo), a few steps, the hook's log on rank 0."""
    csv = tmp_path / "ddp.csv"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    r = run_python(ROOT / "examples" / "ddp_gpt.py", "--nproc", "3", "--steps", "4", "--every", "2",
                   "--route", "--csv", csv, timeout=240, env=env, cwd=tmp_path)  # (forked; its ranks too)
    assert_no_leftovers(str(tmp_path), what="a rank of examples/ddp_gpt.py")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step    4" in r.stdout and "3 ranks, routed" in r.stdout
    before, after = (float(v) for v in r.stdout.split("validation loss ")[1].split(" nats")[0].split(" -> "))
    assert after < before
    rows = csv.read_text().splitlines()
    assert rows[0] == "step,bucket,rank,energy,pi,cos,beta,routed" and len(rows) >= 1 + 4 * 3
