"""Throughput and peak memory of `naig audit` against a minimal numpy pass (docs/design.md §9).

Writes a reference and 4 worker files of a GPT-2-small-shaped float32 state dict
(124M parameters per file by default, 148 tensors) into a temp dir, then runs,
interleaved, each in a fresh process:

  baseline  python: safe_open(numpy) every tensor of every file once, accumulating
            ⟨x_k, x_R⟩, ‖x_k‖², ‖x_R‖² with np.dot — the least any audit must do;
  naig      `naig audit REF W1..W4 --json` (sketch + energies + exact float64 dots).

It prints the median wall times, their ratio (target <= 1.3) and each run's peak
RSS; then peak RSS of `naig audit` with 1 and with 4 worker files, which should
be the same (memory bounded by the chunk, not the number of files).

Usage: python benchmarks/audit_throughput.py [--params 124e6] [--runs 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

BASELINE = r"""
import sys, numpy as np
from safetensors import safe_open
ref, *workers = sys.argv[1:]
handles = [safe_open(p, "numpy") for p in (ref, *workers)]
fr, *fw = [h.__enter__() for h in handles]
rr, dots, norms = 0.0, [0.0] * len(fw), [0.0] * len(fw)
for name in fr.keys():
    r = fr.get_tensor(name).reshape(-1)
    rr += float(np.dot(r, r))
    for k, f in enumerate(fw):
        x = f.get_tensor(name).reshape(-1)
        dots[k] += float(np.dot(x, r)); norms[k] += float(np.dot(x, x))
print([d / (n * rr) ** 0.5 for d, n in zip(dots, norms)])
"""


def gpt2_shapes(target: float) -> dict[str, tuple[int, ...]]:
    """GPT-2 small tensor shapes; layers added until ``target`` parameters are reached."""
    d, shapes = 768, {"wte": (50257, 768), "wpe": (1024, 768)}
    layer = 0
    while sum(int(np.prod(s)) for s in shapes.values()) < target:
        for name, shape in [("ln_1.w", (d,)), ("ln_1.b", (d,)), ("attn.c_attn.w", (d, 3 * d)),
                            ("attn.c_attn.b", (3 * d,)), ("attn.c_proj.w", (d, d)),
                            ("attn.c_proj.b", (d,)), ("ln_2.w", (d,)), ("ln_2.b", (d,)),
                            ("mlp.c_fc.w", (d, 4 * d)), ("mlp.c_fc.b", (4 * d,)),
                            ("mlp.c_proj.w", (4 * d, d)), ("mlp.c_proj.b", (d,))]:
            shapes[f"h.{layer}.{name}"] = shape
        layer += 1
    return shapes


def write_files(root: Path, shapes: dict[str, tuple[int, ...]]) -> list[Path]:
    """Reference + 4 workers (reference plus independent noise), float32 safetensors."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    ref = {k: rng.standard_normal(s, dtype=np.float32) for k, s in shapes.items()}
    paths = [root / "ref.safetensors"]
    save_file(ref, paths[0])
    for w in range(4):
        state = {k: v + np.float32(0.1 * (w + 1)) * rng.standard_normal(v.shape, dtype=np.float32)
                 for k, v in ref.items()}
        paths.append(root / f"worker{w}.safetensors")
        save_file(state, paths[-1])
        del state
    return paths


# A child's ru_maxrss starts from its parent's RSS at fork time, so each command is
# forked from this small launcher rather than from the benchmark (which held the files).
LAUNCHER = r"""
import os, sys, time
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    fd = os.open(os.devnull, os.O_WRONLY); os.dup2(fd, 1)
    os.execv(sys.argv[1], sys.argv[1:])
_, status, usage = os.wait4(pid, 0)
print(time.perf_counter() - t0, usage.ru_maxrss / 1024, status)
"""


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one fresh process."""
    out = subprocess.run([sys.executable, "-c", LAUNCHER, *cmd], capture_output=True, text=True)
    wall, rss, status = out.stdout.split()
    if status != "0":
        raise SystemExit(f"command failed ({status}): {' '.join(cmd)}\n{out.stderr}")
    return float(wall), float(rss)


def _naig(paths: list[Path]) -> list[str]:
    return [sys.executable, "-m", "naig_cli", "audit", *map(str, paths), "--json"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=124e6, help="parameters per file")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(dir=args.dir))
    try:
        shapes = gpt2_shapes(args.params)
        n = sum(int(np.prod(s)) for s in shapes.values())
        print(f"writing 5 files of {n / 1e6:.1f}M float32 parameters ({len(shapes)} tensors) ...")
        paths = write_files(root, shapes)
        base_cmd = [sys.executable, "-c", BASELINE, *map(str, paths)]
        timed(base_cmd), timed(_naig(paths))  # warm the page cache
        base, ours = [], []
        for _ in range(args.runs):
            base.append(timed(base_cmd))
            ours.append(timed(_naig(paths)))
        report(n, base, ours, timed(_naig(paths[:2])))
    finally:
        shutil.rmtree(root)


def report(n: int, base: list, ours: list, one: tuple[float, float]) -> None:
    """Print medians, the ratio and peak RSS figures."""
    b, o = statistics.median(w for w, _ in base), statistics.median(w for w, _ in ours)
    gb = 5 * n * 4 / 1e9
    print(f"baseline numpy pass : median {b:6.2f} s  ({gb / b:5.2f} GB/s)  peak RSS "
          f"{max(m for _, m in base):7.1f} MiB")
    print(f"naig audit          : median {o:6.2f} s  ({gb / o:5.2f} GB/s)  peak RSS "
          f"{max(m for _, m in ours):7.1f} MiB")
    print(f"ratio naig/baseline = {o / b:.2f}  (target <= 1.3)")
    print(f"naig audit peak RSS: 1 worker file {one[1]:.1f} MiB, 4 worker files "
          f"{max(m for _, m in ours):.1f} MiB")


if __name__ == "__main__":
    main()
