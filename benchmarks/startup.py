"""Start-up cost of `naig spectrum` against importing its libraries (docs/design.md §9).

Prints the ratio of the median wall time of `naig spectrum` to the median wall
time of `python -c "import numpy, typer, rich"`, measured interleaved
(baseline, naig, baseline, naig, ...) so that machine noise hits both alike.
Target: ratio ≤ 1.5.

Both sides run from compiled bytecode: the script first byte-compiles the naig
packages, as `pip install` does for a regular install (an editable install under
PYTHONDONTWRITEBYTECODE=1 would otherwise recompile naig's sources on every start,
while numpy, typer and rich were compiled when they were installed).

Usage: python benchmarks/startup.py [--runs 7]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

BASELINE = [sys.executable, "-c", "import numpy, typer, rich"]


def _naig_cmd() -> list[str]:
    exe = shutil.which("naig")
    return [exe, "spectrum"] if exe else [sys.executable, "-m", "naig_cli", "spectrum"]


def compile_naig() -> None:
    """Byte-compile the naig packages where they are installed, as `pip install` does."""
    import importlib.util

    for pkg in ("naig", "naig_cli"):
        for folder in importlib.util.find_spec(pkg).submodule_search_locations:
            subprocess.run([sys.executable, "-m", "compileall", "-q", folder], check=True)


def _wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each (>= 5)")
    runs = max(5, parser.parse_args().runs)
    naig = _naig_cmd()
    compile_naig()
    _wall(BASELINE), _wall(naig)  # warm the page cache
    base, ours = [], []
    for _ in range(runs):
        base.append(_wall(BASELINE))
        ours.append(_wall(naig))
    b, o = statistics.median(base), statistics.median(ours)
    print(f"baseline  {' '.join(BASELINE[1:])!s:40}  median {b * 1e3:7.1f} ms  ({runs} runs)")
    print(f"naig      {' '.join(naig)!s:40}  median {o * 1e3:7.1f} ms  ({runs} runs)")
    print(f"ratio naig/baseline = {o / b:.2f}  (target <= 1.5)")


if __name__ == "__main__":
    main()
