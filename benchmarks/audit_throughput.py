"""Throughput and peak memory of `naig audit` against `cat` and a minimal numpy pass (docs/design.md §9).

For each dtype asked for (default: float32 and bfloat16, in one run), writes a reference
and 4 worker files of a GPT-2-small-shaped state dict (124M parameters per file by
default, 148 tensors) into a temp dir, then times, interleaved, each in a fresh process
from a warm page cache:

  cat       `cat` of the 5 files to /dev/null: the read limit;
  baseline  (float32 only) python: safe_open(numpy) every tensor of every file once,
            accumulating ⟨x_k, x_R⟩, ‖x_k‖², ‖x_R‖² with np.dot — the least any audit must do;
  naig      `naig audit REF W1..W4 --json` (sketch + energies + exact float64 dots).

It prints median wall times and the ratios naig/cat (SPEC §4 target: float32 <= 4), naig/baseline
(target <= 1.3) and, with both dtypes, the bfloat16 audit over the float32 audit of the same
parameter count (target <= 1.1); then peak RSS of `naig audit` with 1 and with 4 worker files,
which should be the same (memory bounded by the chunk, not the number of files).

naig runs from compiled bytecode, as after `pip install` (the script byte-compiles the naig
packages first, like benchmarks/startup.py): an editable install under
PYTHONDONTWRITEBYTECODE=1 would otherwise recompile naig's sources on every start.

Usage: python benchmarks/audit_throughput.py [--params 124e6] [--runs 3]
           [--dtype float32,bfloat16] [--threads N] [--dir DIR]
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
from startup import compile_naig  # benchmarks/ is the script's folder, first on sys.path

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
DTYPES = ("float64", "float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
          "float8_e5m2fnuz")


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


def write_files(root: Path, shapes: dict[str, tuple[int, ...]], dtype: str) -> list[Path]:
    """Reference + 4 workers (reference plus independent noise) in ``dtype``, one tensor at a time."""
    import torch
    from safetensors.torch import save_file

    root.mkdir(parents=True, exist_ok=True)
    dt = getattr(torch, dtype)
    paths = [root / "ref.safetensors", *(root / f"worker{w}.safetensors" for w in range(4))]
    for k, path in enumerate(paths):
        state = {}
        for i, (name, shape) in enumerate(shapes.items()):
            ref = torch.randn(shape, generator=torch.Generator().manual_seed(i))
            noise = torch.randn(shape, generator=torch.Generator().manual_seed(1000 * k + i + 1))
            state[name] = (ref + 0.1 * k * noise).to(dt)
        save_file(state, path)
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
print(time.perf_counter() - t0, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime, status)
"""


def timed(cmd: list[str]) -> tuple[float, float, float]:
    """(wall seconds, peak RSS MiB, CPU seconds) of one fresh process."""
    out = subprocess.run([sys.executable, "-c", LAUNCHER, *cmd], capture_output=True, text=True)
    wall, rss, cpu, status = out.stdout.split()
    if status != "0":
        raise SystemExit(f"command failed ({status}): {' '.join(cmd)}\n{out.stderr}")
    return float(wall), float(rss), float(cpu)


def commands(paths: list[Path], dtype: str, threads: int | None) -> dict[str, list[str]]:
    """The commands timed for one set of files: cat, naig and (float32) the numpy baseline."""
    naig = [sys.executable, "-m", "naig_cli", "audit", *map(str, paths), "--json"]
    cmds = {"cat": [shutil.which("cat") or "/bin/cat", *map(str, paths)],
            "naig": naig + ([] if threads is None else ["--threads", str(threads)])}
    if dtype == "float32":
        cmds["baseline"] = [sys.executable, "-c", BASELINE, *map(str, paths)]
    return cmds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=124e6, help="parameters per file")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dtype", default="float32,bfloat16", help=f"comma-separated, of {', '.join(DTYPES)}")
    ap.add_argument("--threads", type=int, default=None, help="naig audit --threads (default: all cores)")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    dtypes = args.dtype.split(",")
    if any(d not in DTYPES for d in dtypes):
        raise SystemExit(f"--dtype: use some of {', '.join(DTYPES)}")
    root = Path(tempfile.mkdtemp(dir=args.dir))
    try:
        shapes = gpt2_shapes(args.params)
        n = sum(int(np.prod(s)) for s in shapes.values())
        files = {}
        for d in dtypes:
            print(f"writing 5 {d} files of {n / 1e6:.1f}M parameters ({len(shapes)} tensors) ...", flush=True)
            files[d] = write_files(root / d, shapes, d)
        compile_naig()
        cmds = {d: commands(p, d, args.threads) for d, p in files.items()}
        for c in cmds.values():  # warm the page cache
            for cmd in c.values():
                timed(cmd)
        times: dict[str, dict[str, list]] = {d: {k: [] for k in c} for d, c in cmds.items()}
        for _ in range(args.runs):
            for d, c in cmds.items():
                for k, cmd in c.items():
                    times[d][k].append(timed(cmd))
        one = timed(commands(files[dtypes[0]][:2], dtypes[0], args.threads)["naig"])
        report(n, {d: Path(p[0]).stat().st_size for d, p in files.items()}, times, one)
    finally:
        shutil.rmtree(root)


def report(n: int, sizes: dict[str, int], times: dict[str, dict[str, list]], one: tuple) -> None:
    """Print medians, the ratios and peak RSS figures."""
    med = {d: {k: statistics.median(w for w, _, _ in v) for k, v in t.items()} for d, t in times.items()}
    for d, m in med.items():
        gb = 5 * sizes[d] / 1e9
        for k, w in m.items():
            runs = times[d][k]
            rss, cpu = max(r for _, r, _ in runs), statistics.median(c for _, _, c in runs)
            fastest = min(x for x, _, _ in runs)
            print(f"{d:9} {k:9}: median {w:6.3f} s (min {fastest:6.3f}, {gb / w:6.2f} GB/s)"
                  f"  CPU {cpu:6.3f} s  peak RSS {rss:7.1f} MiB")
        print(f"{d:9} naig/cat = {m['naig'] / m['cat']:.2f}" + ("  (target <= 4)" if d == "float32" else ""))
        if "baseline" in m:
            print(f"{d:9} naig/baseline = {m['naig'] / m['baseline']:.2f}  (target <= 1.3)")
    for d in med:
        if d != "float32" and "float32" in med:
            print(f"{d} audit / float32 audit (same {n / 1e6:.1f}M params) = "
                  f"{med[d]['naig'] / med['float32']['naig']:.2f}  (target <= 1.1)")
    first = next(iter(times))
    print(f"naig audit peak RSS ({first}): 1 worker file {one[1]:.1f} MiB, 4 worker files "
          f"{max(r for _, r, _ in times[first]['naig']):.1f} MiB")


if __name__ == "__main__":
    main()
