"""Hostile input to the CLI, one table of cases (issue 18): every bad value must end in one line.

Each case runs ``python -m naig_cli ARGS`` in a fresh working directory, in its own session,
with its address space capped (``RLIMIT_AS``, set in the child before it starts), and
asserts what a user is owed:

- exit status 1 (data) or 2 (usage), as the case says;
- stderr is exactly one line, ``error: …``, naming what the case names, and no traceback;
- stdout is empty and nothing was written: the working directory holds the same files
  with the same sizes and times;
- no process of the run is left (its session's process group is gone);
- the run fits under the memory cap: a runaway request is refused, not attempted.

Add a command by adding rows to ``CASES`` (``naig simulate`` rows belong here too). A row's
arguments may use ``{good}``, ``{other}``, ``{text}``, ``{trunc}`` for the fixture files.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
MEMORY_CAP = 4 * 2**30  # bytes of address space (python + torch + numpy need about 2 GiB of it)
TIMEOUT = 60


@dataclass(frozen=True)
class Case:
    """One hostile command line.

    Attributes:
        args: ``naig`` arguments (placeholders ``{good}`` etc. name fixture files).
        code: the exit status owed (1 data, 2 usage).
        needles: text the one error line must contain (the option named, the fix).
    """

    args: tuple[str, ...]
    code: int
    needles: tuple[str, ...] = ()


def _c(line: str, code: int, *needles: str) -> Case:
    return Case(tuple(line.split()), code, needles)


CASES: dict[str, Case] = {
    # naig staleness: runaway sizes, extreme laws, malformed options
    "staleness-updates-1e12": _c(f"staleness --updates {10**12}", 2, "--updates", "GiB of memory"),
    "staleness-updates-1e9": _c(f"staleness --updates {10**9}", 2, "--updates", "GiB of memory"),
    "staleness-workers-1e8": _c(f"staleness --workers {10**8} --updates 1000", 2, "--workers", "at most"),
    "staleness-workers-1e6": _c(f"staleness --workers {10**6} --updates {10**9}", 2, "GiB of memory"),
    "staleness-workers-0": _c("staleness --workers 0", 2, "--workers"),
    "staleness-sigma-40": _c("staleness --compute lognormal:1:40", 2, "--compute", "sigma"),
    "staleness-mean-tiny": _c("staleness --compute exp:1e-300", 2, "--compute"),
    "staleness-mean-huge": _c("staleness --compute exp:1e300", 2, "--compute"),
    "staleness-const-huge": _c("staleness --uplink const:1e300", 2, "--uplink"),
    "staleness-gamma-shape": _c("staleness --compute gamma:1:1e-300", 2, "--compute", "shape"),
    "staleness-nan": _c("staleness --compute exp:nan", 2, "--compute", "finite"),
    "staleness-bandwidth": _c("staleness --bandwidth 1e-300", 2, "--bandwidth"),
    "staleness-params": _c(f"staleness --params {10**40}", 2, "--params"),
    "staleness-window": _c("staleness --workers 2 --window 5", 2, "--window"),
    "staleness-sweep": _c("staleness --sweep workers=0..3", 2, "--sweep"),
    "staleness-sweep-memory": _c(f"staleness --sweep workers=1,2 --updates {10**12}", 2, "GiB"),
    "staleness-seed": _c(f"staleness --seed {2**64}", 2, "--seed"),
    # naig spectrum
    "spectrum-line": _c("spectrum --line 1,2,3", 2, "--line"),
    "spectrum-line-text": _c("spectrum --line a,b,c", 2, "--line"),
    "spectrum-tol-negative": _c("spectrum --tol -1", 2, "--tol"),
    "spectrum-tol-nan": _c("spectrum --tol nan", 2, "--tol"),
    "spectrum-tol-huge": _c("spectrum --tol 2", 2, "--tol"),
    # naig audit
    "audit-missing-ref": _c("audit missing.safetensors {good}", 1, "missing.safetensors"),
    "audit-missing-worker": _c("audit {good} missing.safetensors", 1, "missing.safetensors"),
    "audit-text-file": _c("audit {good} {text}", 1, "notes.txt"),
    "audit-truncated": _c("audit {good} {trunc}", 1, "trunc.safetensors"),
    "audit-beta": _c("audit {good} {other} --beta -1", 2, "--beta"),
    "audit-beta-nan": _c("audit {good} {other} --beta nan", 2, "--beta"),
    "audit-line": _c("audit {good} {other} --line 1,2,3", 2, "--line"),
    "audit-chunk": _c("audit {good} {other} --chunk-mb 0", 2, "--chunk-mb"),
    "audit-keys-regex": _c("audit {good} {other} --keys ([", 2, "--keys"),
    "audit-csv-dir": _c("audit {good} {other} --csv missing/out.csv", 2, "--csv"),
}


@pytest.fixture
def workdir(tmp_path: Path) -> dict[str, str]:
    """A working directory with a reference, a worker, a text file and a truncated file."""
    gen = torch.Generator().manual_seed(0)
    save_file({"w": torch.randn(64, 8, generator=gen), "b": torch.randn(8, generator=gen)},
              str(tmp_path / "good.safetensors"))
    save_file({"w": torch.randn(64, 8, generator=gen), "b": torch.randn(8, generator=gen)},
              str(tmp_path / "other.safetensors"))
    (tmp_path / "notes.txt").write_text("not a tensor file\n")
    (tmp_path / "trunc.safetensors").write_bytes((tmp_path / "good.safetensors").read_bytes()[:100])
    return {"good": "good.safetensors", "other": "other.safetensors", "text": "notes.txt",
            "trunc": "trunc.safetensors", "dir": str(tmp_path)}


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_ends_in_one_line(name: str, workdir: dict[str, str]) -> None:
    case = CASES[name]
    cwd = Path(workdir["dir"])
    before = _snapshot(cwd)
    argv = [a.format(**workdir) for a in case.args]
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT), "NAIG_DEBUG": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "naig_cli", *argv], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_cap_memory,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert not _group_alive(proc.pid), f"{name}: a process of the run is still alive"
    assert proc.returncode == case.code, (name, proc.returncode, err[-2000:])
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (name, err[-2000:])
    assert "Traceback" not in err and "MemoryError" not in err and "Unable to allocate" not in err, err
    for needle in case.needles:
        assert needle in lines[0], (name, needle, lines[0])
    assert out == "", (name, out[:500])
    assert _snapshot(cwd) == before, f"{name}: wrote to the working directory"
