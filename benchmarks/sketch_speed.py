"""The monitor's sketch at the sizes people train: build time and memory, throughput on one thread.

docs/monitor.md ("Overhead and memory"). Three parts, one process, one thread
(``torch.set_num_threads(1)``):

1. **Build** ``MonitorSketch.build`` for GPT-2-shaped layouts of about 10M, 124M and 1.2B
   parameters (names ``h.{i}.attn.c_attn.weight``, …): seconds (median of 3) and the bytes the
   sketch holds (``LayoutSketch.nbytes``), next to the 16 bytes per parameter (an int64 bucket and
   a float64 sign) the stored-hash sketch held before. Targets at 1B: ≤ 1 s and ≤ 64 MB.
2. **Throughput** (this thread's CPU time, ``time.thread_time``: on a loaded machine wall time
   counts other processes' slices) of ``pack`` (the payload [S g | ‖g‖² | non-finite count], one read) on one
   flat float32 and bfloat16 gradient of ``--elements`` values, per body available here
   (``compiled``, ``numpy``, ``torch``): GB/s of gradient read and G values/s, median of
   ``--repeats``. Target: float32 ≥ 4 GB/s on the compiled body, bfloat16 the same values/s.
3. **The stored-hash sketch it replaces** (``naig.sketch.torch_sketch.TorchSketch``, an
   ``index_add_`` into 14 float64 bins) on the same float32 gradient, for the ratio.
4. **The C kernel's vector bodies side by side**: ``portable``, ``avx2`` (hash then sum, 1,024
   values at a time), ``avx512`` and ``avx512-ifma`` (the hash in the summing loop) as far as
   this CPU has them, each in its own process (``NAIG_KERNEL_ISA`` caps the bodies at import),
   interleaved in ``--repeats`` rounds; GB/s and the ratio of values/s to ``avx2``'s.

The machine is shared: the repeats are interleaved between bodies and the medians printed.

Usage: python benchmarks/sketch_speed.py [--elements 67108864] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from naig.monitor.signals import MonitorSketch, pack
from naig.sketch.kernels import compiled_isa
from naig.sketch.layout_sketch import compiled_available
from naig.sketch.torch_sketch import TorchSketch

__all__ = ["gpt2_layout", "main"]

LAYOUTS = {"10M": (6, 256, 16384), "124M": (12, 768, 50257), "1.2B": (22, 2048, 50257)}  # layers, d, vocab
BUILD_TARGET_S, BUILD_TARGET_MB, GBPS_TARGET = 1.0, 64.0, 4.0


BODY_CAPS = ["portable", "avx2", "avx512", "avx512-ifma"]  # the kernel's vector bodies, in order


def gpt2_layout(layers: int, d: int, vocab: int, context: int = 1024) -> list[tuple[str, int]]:
    """(name, numel) of a GPT-2-shaped model (Radford et al. 2019; HF ``GPT2LMHeadModel`` names)."""
    out = [("wte.weight", vocab * d), ("wpe.weight", context * d)]
    for i in range(layers):
        p = f"h.{i}."
        out += [(p + "ln_1.weight", d), (p + "ln_1.bias", d), (p + "attn.c_attn.weight", 3 * d * d),
                (p + "attn.c_attn.bias", 3 * d), (p + "attn.c_proj.weight", d * d),
                (p + "attn.c_proj.bias", d), (p + "ln_2.weight", d), (p + "ln_2.bias", d),
                (p + "mlp.c_fc.weight", 4 * d * d), (p + "mlp.c_fc.bias", 4 * d),
                (p + "mlp.c_proj.weight", 4 * d * d), (p + "mlp.c_proj.bias", d)]
    return out + [("ln_f.weight", d), ("ln_f.bias", d)]


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--elements", type=int, default=1 << 26)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--body-round", action="store_true", help=argparse.SUPPRESS)  # one child's round
    return p.parse_args(argv)


def _build(out: list[str]) -> None:
    out.append("BUILD (MonitorSketch.build, blocks=1; median of 3)")
    out.append(f"  {'layout':<6} {'parameters':>14} {'tensors':>8} {'build s':>8} {'held B':>9} "
               f"{'stored-hash B':>14}")
    for label, (layers, d, vocab) in LAYOUTS.items():
        named = gpt2_layout(layers, d, vocab)
        times, sk = [], None
        for _ in range(3):
            t0 = time.perf_counter()
            sk = MonitorSketch.build(named, seed=0)
            times.append(time.perf_counter() - t0)
        n = sk.numel
        held = sk.layout.nbytes()
        out.append(f"  {label:<6} {n:14d} {len(named):8d} {statistics.median(times):8.4f} {held:9d} "
                   f"{16 * n:14d}")
        if label == "1.2B":
            met = statistics.median(times) <= BUILD_TARGET_S and held <= BUILD_TARGET_MB * 2**20
            out.append(f"  target at 1B: <= {BUILD_TARGET_S} s and <= {BUILD_TARGET_MB:.0f} MB: "
                       f"{'met' if met else 'NOT met'}")


def _throughput(args: argparse.Namespace, out: list[str]) -> None:
    n = args.elements
    gen = torch.Generator().manual_seed(0)
    grads = {"fp32": torch.randn(n, generator=gen), "bf16": torch.randn(n, generator=gen).bfloat16()}
    sk = MonitorSketch.build([("w", n)], seed=0)
    bodies = (["compiled"] if compiled_available() else []) + ["numpy", "torch"]
    small = min(n, 1 << 22)  # the chunked python bodies on a slice (they are ~10-100x slower)
    sk_small = MonitorSketch.build([("w", small)], seed=0)
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeats):
        for dt, g in grads.items():
            for body in bodies:
                x, s = (g, sk) if body == "compiled" else (g[:small], sk_small)
                t0 = time.thread_time()
                s.layout(x, body)
                times.setdefault((dt, body), []).append((time.thread_time() - t0) / x.numel())
    old = TorchSketch.build([("w", small)], seed=0)
    old_t = []
    for _ in range(args.repeats):
        x = grads["fp32"][:small]
        t0 = time.thread_time()
        old(x)
        old_t.append((time.thread_time() - t0) / small)
    assert pack(grads["fp32"], sk).shape == (16,)  # pack is this body: the payload of one read
    out.append(f"THROUGHPUT (one thread; compiled on {n} values, numpy/torch/stored-hash on {small}; "
               f"median of {args.repeats}; C kernel bodies: {compiled_isa() or 'not built'})")
    out.append(f"  {'dtype':<5} {'body':<12} {'GB/s':>7} {'Gvalues/s':>10}")
    for (dt, body), ts in times.items():
        per = statistics.median(ts)
        size = grads[dt].element_size()
        out.append(f"  {dt:<5} {body:<12} {size / per / 1e9:7.2f} {1 / per / 1e9:10.3f}")
    per_old = statistics.median(old_t)
    out.append(f"  fp32  {'stored-hash':<12} {4 / per_old / 1e9:7.2f} {1 / per_old / 1e9:10.3f}  "
               "(TorchSketch index_add_, the monitor's sketch before)")
    if compiled_available():
        f32, b16 = (statistics.median(times[(dt, "compiled")]) for dt in ("fp32", "bf16"))
        gbps, ratio = 4 / f32 / 1e9, f32 / b16
        out.append(f"  target: fp32 >= {GBPS_TARGET} GB/s: {gbps:.2f} ({_met(gbps >= GBPS_TARGET)}); "
                   f"bf16 values/s over fp32's: {ratio:.2f} ({_met(ratio >= 0.95)}, >= 0.95)")
        out.append(f"  speed-up over the stored-hash sketch (fp32): "
                   f"{per_old / statistics.median(times[('fp32', 'compiled')]):.1f}x")


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _body_round(n: int) -> None:
    """One round in a child: seconds per value of the compiled body, float32 and bfloat16 (JSON)."""
    gen = torch.Generator().manual_seed(0)
    sk = MonitorSketch.build([("w", n)], seed=0)
    per = {}
    grads = {"fp32": torch.randn(n, generator=gen), "bf16": torch.randn(n, generator=gen).bfloat16()}
    for dt, g in grads.items():
        sk.layout(g, "compiled")  # warm: the pages touched, the code loaded
        t0 = time.thread_time()
        sk.layout(g, "compiled")
        per[dt] = (time.thread_time() - t0) / n
    print(json.dumps({"isa": compiled_isa(), **per}))


def _bodies(args: argparse.Namespace, out: list[str]) -> None:
    """The C kernel's vector bodies side by side: a process per body (NAIG_KERNEL_ISA caps them at
    import) and round, the bodies interleaved in each round; medians and ratios to ``avx2``."""
    caps = [c for c in BODY_CAPS if BODY_CAPS.index(c) <= BODY_CAPS.index(compiled_isa())]
    per: dict[str, dict[str, list[float]]] = {c: {"fp32": [], "bf16": []} for c in caps}
    for _ in range(args.repeats):
        for cap in caps:
            cmd = [sys.executable, __file__, "--body-round", "--elements", str(args.elements)]
            env = {**os.environ, "NAIG_KERNEL_ISA": cap, "OMP_NUM_THREADS": "1"}
            row = json.loads(subprocess.run(cmd, capture_output=True, text=True, env=env, check=True,
                                            timeout=600).stdout)
            assert row["isa"] == cap, row  # the cap took effect
            for dt in ("fp32", "bf16"):
                per[cap][dt].append(row[dt])
    out.append(f"VECTOR BODIES (compiled, {args.elements} values, a process per body and round, "
               f"{args.repeats} interleaved rounds; ratio: G values/s over avx2's)")
    out.append(f"  {'bodies':<12} {'fp32 GB/s':>10} {'ratio':>6} {'bf16 GB/s':>10} {'ratio':>6}")
    base = {dt: statistics.median(per["avx2"][dt]) for dt in ("fp32", "bf16")} if "avx2" in per else None
    for cap in caps:
        cells = []
        for dt, size in (("fp32", 4), ("bf16", 2)):
            t = statistics.median(per[cap][dt])
            cells.append(f"{size / t / 1e9:10.2f} {base[dt] / t if base else float('nan'):6.2f}")
        out.append(f"  {cap:<12} {cells[0]} {cells[1]}")


def main(argv: list[str]) -> None:
    args = _args(argv)
    torch.set_num_threads(1)
    if args.body_round:
        _body_round(args.elements)
        return
    out: list[str] = []
    _build(out)
    _throughput(args, out)
    if compiled_available():
        _bodies(args, out)
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1:])
