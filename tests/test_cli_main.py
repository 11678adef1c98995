"""The app as a whole: `python -m naig`, `--version` naming the sketch kernel, one-line usage errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from naig import __version__
from naig.sketch.kernels import HAVE_COMPILED, compiled_isa
from tests.conftest import default_sigint

ROOT = Path(__file__).resolve().parents[1]


_WITHOUT_KERNEL = (
    "import sys; sys.modules['naig.sketch._kernel'] = None; "  # the extension cannot be imported
    "from naig_cli.main import app; app(prog_name='naig')"
)


def _naig(*args: str, code: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "naig", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, **(env or {})}, preexec_fn=default_sigint)  # (a Ctrl-C test)


def test_python_dash_m_naig_runs_the_cli():
    r = _naig("spectrum", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["verified"] is True


def test_version_names_the_sketch_kernel():
    path = f"C, {compiled_isa()}" if HAVE_COMPILED else "numpy; the C extension was not built"
    assert _naig("--version").stdout.strip() == f"naig {__version__} (sketch kernel: {path})"
    if HAVE_COMPILED:  # the vector bodies, capped by NAIG_KERNEL_ISA
        capped = _naig("--version", env={"NAIG_KERNEL_ISA": "portable"}).stdout
        assert capped.strip().endswith("(sketch kernel: C, portable)")
    forced = _naig("--version", env={"NAIG_PURE_NUMPY": "1"}).stdout
    assert forced.strip().endswith("(sketch kernel: numpy, forced by NAIG_PURE_NUMPY=1)")
    missing = _naig("--version", code=_WITHOUT_KERNEL).stdout
    assert missing.strip().endswith("(sketch kernel: numpy; the C extension was not built)")


def test_audit_warns_once_when_the_kernel_was_not_built(tmp_path):
    from naig.io import save_gradients
    from tests.conftest import make_state

    for name in ("ref", "w"):
        save_gradients(tmp_path / f"{name}.safetensors", make_state(len(name)))
    args = ("audit", str(tmp_path / "ref.safetensors"), str(tmp_path / "w.safetensors"), "--json")
    r = _naig(*args, code=_WITHOUT_KERNEL)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("warning: the C sketch kernel was not built")
    assert json.loads(r.stdout)["files"][0]["energy"] > 0
    assert _naig(*args, env={"NAIG_PURE_NUMPY": "1"}).stderr == ""  # asked for: no warning


def test_usage_errors_are_one_line_sentences():
    r = _naig("spectrum", "--tol", "x")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert r.stderr.startswith("error: Invalid value for '--tol'")
    assert ". See 'naig spectrum --help'." in r.stderr


@pytest.mark.parametrize(("command", "symbols"), [
    ("audit", ("cos", "E ± spread", "ρ", "π", "K_eff", "frozen")),
    ("simulate", ("τ̄", "t→sync loss", "π", "!", "K_eff", "frozen", "H first→last")),
    ("staleness", ("τ", "λ̂", "E[A]", "E[max C]", "Little", "B,", "start-up", "batch means")),
])
def test_help_explains_every_symbol_the_command_prints(command: str, symbols: tuple[str, ...]) -> None:
    from typer.testing import CliRunner

    from naig_cli.main import app

    text = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"}).stdout
    columns = text.split("Columns" if "Columns" in text else "Rows", 1)[1]
    for s in symbols:
        assert s in columns, s


@pytest.mark.parametrize("command", ["simulate", "detect"])
def test_help_examples_fit_80_columns_unwrapped(command: str) -> None:
    """Help is read at 80 columns (a pipe, a narrow terminal): each example line is a whole command, a
    comment or a continuation, never a command wrapped mid-word into the next line."""
    from typer.testing import CliRunner

    from naig_cli.main import app

    text = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "80"}).stdout
    block = text.split("Examples", 1)[1].split("Columns", 1)[0]
    lines = [ln.strip() for ln in block.splitlines() if ln.strip()]
    assert len(lines) >= 5, block
    for ln in lines:
        assert ln.startswith((f"naig {command}", "# ", "--")), ln


def test_ctrl_c_before_a_result_says_so_in_one_line_and_exits_130() -> None:
    """A Ctrl-C while a command starts (here: as spectrum prints) is a one-line error, not silence."""
    code = ("import signal, naig_cli._common as c; "
            "c.print_json = lambda *a, **k: signal.raise_signal(signal.SIGINT); "
            "from naig_cli.main import app; app(prog_name='naig')")
    r = _naig("spectrum", "--json", code=code)
    assert r.returncode == 130 and r.stdout == ""
    assert r.stderr == "error: interrupted before the command had a result to report\n"
