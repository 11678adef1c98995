"""docs/design.md's "where things go" tables, tried: one new engine, one new signal and one new fault kind,
each written into a copy of the sources by editing only the files its row names, then used end to end
in a process that imports the copy (forked warm, ``run_python``, with the server's naig and naig_cli
modules dropped first).

Each item is small but real: the engine runs ``sync`` at fixed lags and must give the lags engine's
numbers bit for bit; the signal is scored, recorded and swept by ``naig detect``'s protocol; the fault
kind is applied by ``naig simulate`` from the command line and by ``naig detect``'s cells.
"""

# ruff: noqa: E501  (the edits quote source lines verbatim beside the call that makes them)
from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_python

ROOT = Path(__file__).resolve().parents[1]

ENGINE = '''\
"""A demo engine: every worker's gradient at the current θ, one update per step (sync at fixed lags)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from naig.simulate.engines.base import OnServer
from naig.simulate.faults import GRADIENT_FAULTS
from naig.simulate.server import ServerState
from naig.simulate.strategies import Batch, make_strategy

__all__ = ["FreshEngine"]


class FreshRun(OnServer):
    clocked: ClassVar[bool] = False

    def __init__(self, workload: Any, setting: Any, rules: Any, rule: str, seed: int, lr: float) -> None:
        self.k, self.steps, self.workload = setting.workers, rules.steps, workload
        strategy = make_strategy(rule, rules.strategy_options(workload.sketch, lr))
        self.name, self.seed, self.lr = rule, seed, lr
        self.state = ServerState(workload.init_params(seed), strategy, rules.optimizer, lr, self.k, rules.faults,
                                 workload.fault_generator(seed))
        self.history = self.state.history
        self.gens = workload.worker_streams(seed, self.k)
        self.grads = self.theta.new_empty(self.k, self.theta.numel())
        self.losses = torch.zeros(self.k, device=workload.device)
        self.workers = torch.arange(self.k, device=workload.device)
        self.t, self.time, self.diverged_at, self.saved = 0, 0.0, None, []

    @property
    def done(self) -> bool:
        return self.t >= self.steps or self.diverged_at is not None

    progress = property(lambda self: self.t)
    updates_per_step = property(lambda self: 1)
    train_loss = property(lambda self: float(self.losses.mean()))

    def step(self) -> None:
        theta = self.theta.clone()
        for w in range(self.k):
            self.losses[w] = self.workload.worker_grad(theta, self.gens[w], self.grads[w])
        lags = torch.zeros(self.k, dtype=torch.long, device=theta.device)
        self.state.apply(Batch(self.grads, lags, self.workers, self.theta, theta.expand(self.k, -1)), step=self.t)
        self.diverged_at = self.t if self.state.diverged else None
        self.t += 1

    def communication(self) -> tuple[int, np.ndarray]:
        c = self.workload.config
        return self.t * self.k * c.batch_size, np.full(self.k, self.t * 4.0 * self.workload.n_params)

    def result_fields(self) -> dict[str, Any]:
        return {"correction": self.state.corrections.mean}


class FreshEngine:
    NAME: ClassVar[str] = "fresh"
    FAULT_KINDS: ClassVar[frozenset[str]] = GRADIENT_FAULTS

    @staticmethod
    def start(workload: Any, setting: Any, rules: Any, rule: str, seed: int, lr: float) -> FreshRun:
        return FreshRun(workload, setting, rules, rule, seed, lr)
'''


def _copy(tmp_path: Path) -> Path:
    """A copy of naig/ and naig_cli/ (its built kernel included), to be edited."""
    tree = tmp_path / "src"
    for package in ("naig", "naig_cli"):
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def _edit(tree: Path, path: str, old: str, new: str) -> None:
    """Replace the one occurrence of ``old`` in ``tree/path`` by ``new`` (the file's text must hold it)."""
    file = tree / path
    text = file.read_text(encoding="utf-8")
    assert text.count(old) == 1, (path, old)
    file.write_text(text.replace(old, new), encoding="utf-8")


_DROP_NAIG = """import sys
for _name in [m for m in sys.modules if m.split(".")[0] in ("naig", "naig_cli")]:
    del sys.modules[_name]
"""


def _python(tree: Path | None, code: str, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    """Run ``code`` as ``python -c`` in a process forked warm (``run_python``: torch imported) that imports
    the edited copy at ``tree``: the server's naig and naig_cli modules are dropped first, and the copy's
    folder, the run's ``sys.path[0]``, precedes the install. ``tree=None``: the installed naig, as is.
    ``ok``: assert the run succeeded."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    code = textwrap.dedent(code) if tree is None else _DROP_NAIG + textwrap.dedent(code)
    r = run_python("-c", code, *args, env=env, cwd=tree or ROOT, timeout=240)
    assert r.returncode == 0 or not ok, r.stdout + r.stderr
    return r


def test_an_engine_is_its_module_and_one_branch_of_select(tmp_path: Path) -> None:
    """Touches: naig/simulate/lags/fresh.py (new: in its setting's package), naig/simulate/engines/registry.py
    (one branch)."""
    tree = _copy(tmp_path)
    (tree / "naig/simulate/lags/fresh.py").write_text(ENGINE, encoding="utf-8")
    _edit(tree, "naig/simulate/engines/registry.py", '''    if config.setting.NAME == "lags":
        from naig.simulate.lags.engine import LagsEngine''', '''    if config.setting.NAME == "lags" and rule == "sync":
        from naig.simulate.lags.fresh import FreshEngine

        return FreshEngine
    if config.setting.NAME == "lags":
        from naig.simulate.lags.engine import LagsEngine''')
    code = '''
        import json
        from dataclasses import asdict
        import naig.simulate.engines.registry as registry
        from naig.simulate import SimulateConfig, run_experiment
        cfg = SimulateConfig.from_options(lags=(0, 3, 5), steps=6, seeds=1, strategies=("sync", "hogwild"),
                                          data_bytes=60_000, eval_every=3, eval_batches=2, jobs=1)
        runs = [{k: v for k, v in asdict(r).items() if k != "ms_per_step"} for r in run_experiment(cfg).runs]
        print(json.dumps({"engine": registry.select(cfg, "sync").NAME, "runs": runs}))
    '''
    new = __import__("json").loads(_python(tree, code).stdout.splitlines()[-1])
    before = __import__("json").loads(_python(None, code).stdout.splitlines()[-1])
    assert new["engine"] == "fresh" and before["engine"] == "lags"
    assert [r["strategy"] for r in new["runs"]] == ["sync", "hogwild"]
    for a, b in zip(new["runs"], before["runs"], strict=True):  # the same numbers, float for float
        assert a == b, (a["strategy"], a, b)


def test_a_signal_is_one_entry_of_the_table(tmp_path: Path) -> None:
    """Touches: naig/monitor/detectors.py (one ``SignalSpec``; its field ``rel_norm`` is computed
    already, so no new computation in signals.py)."""
    tree = _copy(tmp_path)
    _edit(tree, "naig/monitor/detectors.py", '''    SignalSpec("energy", "energy", "upper", np.cbrt),''', '''    SignalSpec("energy", "energy", "upper", np.cbrt),
    SignalSpec("relnorm", "rel_norm", "both", np.log),  # demo: log of ‖g_k‖ over the median rank's''')
    _python(tree, '''
        import numpy as np
        from naig.detect import measure
        from naig.monitor.detectors import SIDES, SIGNALS, Detector, signal_values
        from naig.monitor.records.schema import CSV_COLUMNS
        from naig.monitor.signals import rank_signals
        assert "relnorm" in SIGNALS and SIDES["relnorm"] == "both"
        assert "score_relnorm" in CSV_COLUMNS and "cusum_relnorm" in CSV_COLUMNS
        assert "relnorm" in measure.CANDIDATES["all/δ1"]["signals"]
        rng = np.random.default_rng(0)
        det = Detector(4, signals=("norm", "relnorm"), warmup=8, window=16)
        flags = []
        for step in range(40):
            scale = np.array([1.0, 1.0, 1.0, 1.0 if step < 30 else 4.0])
            sk = rng.standard_normal((4, 14)) * scale[:, None]
            sig = rank_signals(sk, (sk ** 2).sum(1) * 100, np.zeros(4))
            flags += det.update(sig).flags
        assert np.allclose(signal_values(sig, "relnorm"), np.log(sig.rel_norm))
        assert flags and {f.rank for f in flags} == {3} and {f.signal for f in flags} >= {"relnorm"}, flags
    ''')


def test_a_fault_kind_is_one_kind_its_transform_and_the_lists_that_run_it(tmp_path: Path) -> None:
    """Touches: naig/faults.py (a ``FaultKind`` and its transform), naig/simulate/faults.py
    (``FAULT_KINDS``), naig/detect/faults.py (``GRADIENT_KINDS``, ``DEFAULT_MAGNITUDES``, ``UNITS``),
    naig/simulate/options.py (the word in ``--faults``' help)."""
    tree = _copy(tmp_path)
    _edit(tree, "naig/faults.py", '''    FaultKind("layer", "ε", True, "1", _positive),''', '''    FaultKind("layer", "ε", True, "1", _positive),
    FaultKind("dropout", "f", True, "0.5", _fraction),''')
    _edit(tree, "naig/faults.py", '''def flip_bit32(value: float, bit: int) -> float:''', '''def _dropout(g: Tensor, f: float | None, gen: torch.Generator, layout: Sequence[int] | None) -> None:
    g[torch.randperm(g.numel(), generator=gen, device=gen.device)[:max(1, round(f * g.numel()))]] = 0.0


def flip_bit32(value: float, bit: int) -> float:''')
    _edit(tree, "naig/faults.py", '''_APPLY = {"scale": _scale,''', '''_APPLY = {"dropout": _dropout, "scale": _scale,''')
    _edit(tree, "naig/simulate/faults.py", '''"bitflip16", "kill", "hang")''', '''"bitflip16", "dropout", "kill", "hang")''')
    _edit(tree, "naig/detect/faults.py", '''"nan", "inf", "layer")''', '''"nan", "inf", "layer", "dropout")''')
    _edit(tree, "naig/detect/faults.py", '''    "layer": (0.3, 1.0, 3.0, 10.0, 100.0),''', '''    "layer": (0.3, 1.0, 3.0, 10.0, 100.0),
    "dropout": (0.1, 0.5, 1.0),''')
    _edit(tree, "naig/detect/faults.py", '''"layer": "ε", "stale"''', '''"layer": "ε", "dropout": "fraction", "stale"''')
    _edit(tree, "naig/simulate/options.py", "bitflip16:B (naig.faults)", "bitflip16:B, dropout:F (naig.faults)")
    r = _python(tree, '''
        import sys, torch
        from naig.detect.faults import FaultCell, apply_gradient_fault, catalogue
        from naig_cli.main import app
        g = torch.ones(10)
        bad = apply_gradient_fault(FaultCell("dropout", 0.5), g, torch.Generator().manual_seed(0))
        assert int((bad == 0).sum()) == 5 and torch.equal(g, torch.ones(10))
        assert [c.magnitude for c in catalogue(("dropout",))] == [0.1, 0.5, 1.0]
        sys.argv = ["naig", "simulate", "--lags", "0,0,0", "--strategies", "hogwild", "--steps", "3", "--seeds",
                    "1", "--data-bytes", "60000", "--faults", "2:dropout:1@1", "--json"]
        app()
    ''')
    out = __import__("json").loads(r.stdout)
    assert out["config"]["faults"] == ["2:dropout:1@1"] and len(out["runs"]) == 1
    refused = _python(tree, "import runpy; runpy.run_module('naig', run_name='__main__')", "simulate",
                      "--faults", "2:dropout:2", ok=False)  # python -m naig simulate …
    assert refused.returncode == 2 and "dropout" in refused.stderr and "fraction" in refused.stderr, refused.stderr


@pytest.mark.parametrize("row", ["an engine", "a scored signal", "a gradient fault kind"])
def test_design_names_the_files_these_tests_touch(row: str) -> None:
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| {row} |"))
    assert "tests/test_where_things_go.py" in text
    touched = {"an engine": ("<setting>/<engine>.py", "engines/registry.py"),
               "a scored signal": ("signals.py", "detectors.SIGNAL_TABLE"),
               "a gradient fault kind": ("naig/faults.py", "FAULT_KINDS", "GRADIENT_KINDS", "options.py")}[row]
    for word in touched:
        assert word in line, (row, word)
