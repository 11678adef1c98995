"""One prepared GPU check (issue 23): the torch sketch on the device, then ``naig simulate`` at 124M.

Part 1 (sketch): a state dict with the ``gpt2-124m`` parameter layout (GPT-2's 50,257-token
vocabulary by default, so 124,439,808 parameters; ``--sketch-vocab 256`` gives the preset's
own byte vocabulary, 86,039,040) is filled with seeded N(0, 1) values, in fp32 and in bf16.
The torch sketch on the device (``TorchSketch.build`` + ``__call__``, the simulator's path)
is compared with the CPU reference: the vectorised numpy body (``naig.sketch.core.sketch_tensor``)
on the whole state dict, and the readable Python loop (``sketch_state_dict(..., impl="reference")``)
against the dispatcher's torch body on the device on a prefix of every tensor. Tolerance: both
sides add the same exact float64 terms s_i·x_i (the fp32/bf16 values upcast exactly) in other
orders, and any order of summing m terms is within γ_{m−1}·Σ|x_i| of the exact sum
(γ_k = k·u/(1 − k·u), u = 2⁻⁵³; Higham, "Accuracy and Stability of Numerical Algorithms",
2nd ed., §4.2), so bucket a passes when |device − reference| ≤ 2·γ_{m_a−1}·Σ_a|x_i|. That is a
worst case; the observed error is reported as a fraction of it. Then the sketch's time per
gradient on the device (synchronised, median of ``--sketch-repeats``), for one row and for K rows.

Part 3 (monitor; runs between parts 1 and 2): per model of ``--monitor-models`` (MLPs of 126M
and 940M parameters by default; ``gpt2-124m``, GPT-2 small's shape, on request; ``MONITOR_MODELS``),
the monitor's payload kernel (``MonitorSketch.payload``: Triton on CUDA) on one flat fp32 and bf16
gradient of that layout, checked against the CPU's C kernel within the float64 summation bound
(``payload_check``; counts equal), its synchronised time (median of ``--sketch-repeats``), GB/s
read, share of the H200's 4.8 TB/s HBM bandwidth and ratio to torch's own ``x.sum()``; then the
one-GPU step overhead: SGD steps plain, with ``Monitor.observe`` of the gradients, under one-rank
DDP (NCCL; gloo on CPU) and under that DDP with ``MonitorHook`` (``log``), every variant from the
same initialisation (interleaved ``--monitor-rounds`` of ``--monitor-steps`` steps of
``--monitor-batch`` examples, medians and paired ratios).

Part 2 (simulate): ``SimulateConfig.from_options`` + ``run_experiment`` (the library behind
``naig simulate``) at ``--lags`` for ``--strategies``, in fp32: ``naig simulate`` has no bf16
autocast (``--tf32`` lets fp32 matmuls use TF32 tensor cores, off by default). Without
``--steps``, a short probe (every worker from step 0; naig and hogwild when listed, else the
first two strategies) measures the time per gradient, per evaluation and per run start, and
the steps are sized to fill ``--budget-seconds``. Reported per strategy: final validation
loss, server steps/s (the engine's synchronised step time), peak GPU memory (reset every step,
so each strategy's own), and the routing overhead naig ms/step ÷ hogwild ms/step from the
result's summaries.

The budget (``--budget-seconds``, counted from the start of ``main``): nothing starts once it
is spent; each run starts only when its estimated time (from the probe, or from the runs
before it) fits what is left; a run still going when it is spent is stopped (Ctrl-C's path in
``run_experiment``: the run is dropped, never reported as finished).

Writes under ``--out``: ``gpu_check.json`` (versions, device, command line, date, every number,
each part's status; rewritten after every part, so a killed run leaves what it had),
``simulate.json`` (the ``SimulateResult``), ``gpu_check.log``, ``simulate-csv.tar.gz`` (one
per-step CSV per run: train loss, validation loss, π_k), and prints a short table last.
Exit 0: every part finished; 1: a part failed or did not finish within the budget (one line
on stderr says why); 2: usage (e.g. ``--device cuda`` without a GPU, one line).

On a lent H200 (one call, ~8 minutes; the device tool's ``timeout_s`` 600 leaves ~2 minutes
for start-up and the files; naig is not installed there, hence ``PYTHONPATH=.``)::

    PYTHONUNBUFFERED=1 PYTHONPATH=. python3 benchmarks/gpu_check.py --out "$OUT"

or ``bash benchmarks/gpu_run.sh`` (the C kernel built in place, the CUDA tests, then this script;
its settings and the four runs of 2026-12-04 are in docs/results/gpu-h200.md).

A rerun with less device time left: ``--budget-seconds 240 --skip-sketch``, or fixed steps
``--steps 100 --strategies naig,hogwild``. Copy into ``docs/results/`` (dated, "H200", the
command): ``gpu_check.json``, ``simulate.json`` and the printed table (the last lines of
``gpu_check.log``); the CSVs for figures if wanted.

Watch for: the simulated ``gpt2-124m`` is GPT-2 124M's shape with a byte vocabulary (256), so it
has 86,039,040 parameters, not 124M (part 1 sketches the 124M layout). Memory at lags 0,10,20,35:
``buffer_rows`` = 2K + min(35, steps − 1) + 1 + 3 = 47 parameter-sized float32 rows (the ring of
36 versions) = 15.1 GiB, plus ``Workload.batch_bytes`` ≈ 16.1 GiB at batch 8 × 1024 tokens;
``Workload.check_memory`` refuses a run that does not fit before it starts (a failed part 2
naming ``lags`` or ``batch_size``). The probe's ring holds only ``--probe-steps`` versions, so
its peak memory is below the main run's. The corpus is the device's Python stdlib (3.12 there),
not the one of CPU runs here.

CPU plumbing test (tests/test_benchmarks_gpu_check.py)::

    python benchmarks/gpu_check.py --device cpu --model gpt-nano --sketch-model gpt-nano \\
        --sketch-vocab 256 --steps 3 --strategies naig,hogwild --lags 0,2 --out /tmp/gpu_check
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from naig import __version__ as naig_version
from naig import sketch_state_dict
from naig.errors import NaigError, UsageError
from naig.io import json_ready
from naig.monitor import Monitor, MonitorHook
from naig.monitor.signals import MonitorSketch
from naig.simulate import SimulateConfig, StepEvent, parse_int_list, run_experiment
from naig.simulate.engines import buffer_rows
from naig.simulate.model import GPT, get_preset, lm_loss
from naig.simulate.strategies import STRATEGIES
from naig.sketch.core import SKETCH_DIM, TensorHash, sketch_tensor
from naig.sketch.layout_sketch import compiled_available
from naig.sketch.torch_sketch import TorchSketch

__all__ = ["main", "build_parser", "sketch_layout", "summation_bound", "compare_sketches", "size_steps",
           "BudgetSpent", "MONITOR_MODELS", "monitor_part", "payload_check"]

ROOT = Path(__file__).resolve().parents[1]
GPT2_VOCAB = 50_257  # GPT-2's BPE vocabulary: with it the gpt2-124m layout has 124,439,808 parameters
U = 2.0**-53  # unit roundoff of float64
AUTOCAST_NOTE = ("fp32: naig simulate has no bf16 autocast option (SimulateConfig has no precision field), "
                 "so part 2 runs in fp32")
TOLERANCE_NOTE = (
    "float64 summation bound: both sides sum the same exact terms s_i*x_i (fp32/bf16 upcast exactly to "
    "float64, signs +-1) in different orders; any order of m terms is within gamma_{m-1}*sum|x_i| of the "
    "exact sum (gamma_k = k*u/(1-k*u), u = 2^-53; Higham 2002, sec. 4.2), so bucket a passes when "
    "|device - reference| <= 2*gamma_{m_a-1}*sum_a|x_i| (sum|x| in float64, divided by 1-gamma for its own "
    "rounding). A worst case: the observed error is reported as a fraction of it (max_err_over_bound).")
MARGIN = 1.15  # sizing: the probe's times are scaled by this (drift, the first steps' warm-up)
HBM_TBPS = 4.8  # H200 HBM3e peak bandwidth, TB/s (NVIDIA H200 datasheet), for the monitor kernel's share
MONITOR_MODELS: dict[str, tuple[int, ...] | str] = {  # part 3: MLP widths (Linear + GELU), or a GPT preset
    "124m": (1024, 8192, 8192, 4096, 4096, 1024),  # 125.9M parameters
    "1b": (4096, 16384, 16384, 16384, 16384, 4096),  # 939.6M parameters
    "tiny": (64, 128, 64),  # the CPU plumbing test
    "gpt2-124m": "gpt2-124m",  # GPT-2 small's shape, byte vocabulary: 86.0M parameters, next-byte loss
    "gpt-nano": "gpt-nano",  # the CPU plumbing test of the GPT path
}
RESERVE_S = 15.0  # sizing: seconds kept for writing the files and the table (at most 10% of the budget)


class BudgetSpent(KeyboardInterrupt):
    """Raised from the progress callback: ``run_experiment`` handles it as Ctrl-C (keeps the finished
    runs, drops the one in progress, sets ``interrupted``)."""


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line on stderr, exit 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _usage(message: str) -> NoReturn:
    sys.stderr.write(f"gpu_check.py: error: {message}\n")
    raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    """The command-line options (see the module docstring)."""
    ap = _Parser(prog="gpu_check.py", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "./gpu_check_out",
                    help="output folder (default: $OUT, else ./gpu_check_out)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda, or cpu for the plumbing")
    ap.add_argument("--model", default="gpt2-124m", help="simulate preset (part 2)")
    ap.add_argument("--steps", type=int, default=None,
                    help="server steps per run (default: sized from a probe to fill the budget)")
    ap.add_argument("--strategies", default="naig,naig-blind,hogwild,sync",
                    help="comma list (fresh-only may be added)")
    ap.add_argument("--lags", default="0,10,20,35", help="fixed lags, one per worker")
    ap.add_argument("--batch-size", type=int, default=None, help="sequences per worker minibatch "
                    "(default: the simulator's)")
    ap.add_argument("--lr", type=float, default=None, help="learning rate (default: the simulator's)")
    ap.add_argument("--seeds", type=int, default=1, help="seeds per strategy")
    ap.add_argument("--eval-every", type=int, default=None,
                    help="validation every this many steps (default: steps // 4; 0: only at the end)")
    ap.add_argument("--eval-batches", type=int, default=None,
                    help="validation batches (default: the simulator's)")
    ap.add_argument("--probe-steps", type=int, default=4, help="steps per probe run when sizing")
    ap.add_argument("--tf32", action="store_true", help="let fp32 matmuls use TF32 (off: strict fp32)")
    ap.add_argument("--sketch-model", default=None,
                    help="preset whose layout part 1 sketches (default: --model)")
    ap.add_argument("--sketch-vocab", type=int, default=GPT2_VOCAB,
                    help=f"vocabulary of the sketched layout (default {GPT2_VOCAB}, GPT-2's)")
    ap.add_argument("--sketch-repeats", type=int, default=20, help="timed sketch calls (median)")
    ap.add_argument("--reference-scalars", type=int, default=1_000_000,
                    help="scalars the Python reference loop checks (a prefix of every tensor)")
    ap.add_argument("--skip-sketch", action="store_true", help="skip part 1")
    ap.add_argument("--skip-monitor", action="store_true", help="skip part 3 (the monitor's kernel and step)")
    ap.add_argument("--monitor-models", default="124m,1b",
                    help=f"part 3's models, a comma list of {', '.join(MONITOR_MODELS)}")
    ap.add_argument("--monitor-rounds", type=int, default=7, help="part 3: interleaved rounds (median)")
    ap.add_argument("--monitor-steps", type=int, default=5, help="part 3: steps per variant and round")
    ap.add_argument("--monitor-batch", type=int, default=None,
                    help="part 3: examples per step (default 64 for an MLP, 8 sequences for a GPT)")
    ap.add_argument("--skip-simulate", action="store_true", help="skip part 2")
    ap.add_argument("--budget-seconds", type=float, default=480.0,
                    help="start no work that cannot finish within this many seconds of the start")
    return ap


# -- bookkeeping ---------------------------------------------------------------------------------


class _Log:
    """Timestamped lines to stdout and the log file."""

    def __init__(self, path: Path, start: float) -> None:
        self.fh = path.open("w", buffering=1)
        self.start = start

    def __call__(self, message: str) -> None:
        line = f"[{time.monotonic() - self.start:7.1f}s] {message}"
        print(line, flush=True)
        self.fh.write(line + "\n")

    def raw(self, text: str) -> None:
        """Lines as they are (the table), to stdout and the log."""
        print(text, flush=True)
        self.fh.write(text + "\n")


class _Clock:
    """The budget: seconds since the start, and what is left."""

    def __init__(self, budget: float) -> None:
        self.start = time.monotonic()
        self.budget = budget

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.budget - self.elapsed()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def _environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "naig": naig_version, "torch": torch.__version__, "numpy": np.__version__,
        "python": platform.python_version(), "platform": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        "git_commit": _git_commit(), "device": str(device), "cuda": torch.version.cuda,
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(device_name=torch.cuda.get_device_name(device),
                   capability=list(torch.cuda.get_device_capability(device)),
                   gpu_memory_gib=props.total_memory / 2**30, multiprocessors=props.multi_processor_count,
                   cudnn=torch.backends.cudnn.version())
    else:
        env.update(device_name=platform.processor() or "cpu")
    return env


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(json_ready(doc), indent=1, default=str) + "\n")
    tmp.replace(path)


# -- part 1: the sketch --------------------------------------------------------------------------


def sketch_layout(preset: str, vocab: int | None = None) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every parameter of a ``GPT`` preset, in ``named_parameters`` order.

    Args:
        preset: a name of ``naig.simulate.model.PRESETS``.
        vocab: vocabulary size replacing the preset's (None: the preset's own).

    Returns:
        The layout, built on the meta device (no memory is allocated).
    """
    cfg = get_preset(preset)
    if vocab is not None:
        cfg = dataclasses.replace(cfg, vocab=vocab)
    with torch.device("meta"):
        model = GPT(cfg)
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()]


def summation_bound(counts: np.ndarray, abs_sums: np.ndarray) -> np.ndarray:
    """Per bucket, the most two float64 sums of the same m terms in any two orders can differ.

    Args:
        counts: (14,) terms per bucket m_a.
        abs_sums: (14,) Σ|x_i| per bucket, computed in float64.

    Returns:
        (14,) 2·γ_{m−1}·Σ|x_i| / (1 − γ_{m−1}), γ_k = k·u / (1 − k·u), u = 2⁻⁵³.

    Example:
        >>> bound = summation_bound(np.array([1, 3]), np.array([2.0, 3.0]))
        >>> float(bound[0]), bool(0 < bound[1] < 1e-14)  # one term: exact; three: 2·γ_2·3
        (0.0, True)
    """
    k = np.maximum(np.asarray(counts, dtype=np.float64) - 1.0, 0.0)
    gamma = k * U / (1.0 - k * U)
    return 2.0 * gamma * np.asarray(abs_sums, dtype=np.float64) / (1.0 - gamma)


def compare_sketches(got: np.ndarray, ref: np.ndarray, counts: np.ndarray,
                     abs_sums: np.ndarray) -> dict[str, Any]:
    """A sketch against its reference, bucket by bucket, within ``summation_bound``.

    Args:
        got: (14,) the sketch under test.
        ref: (14,) the reference.
        counts: (14,) terms per bucket.
        abs_sums: (14,) Σ|x_i| per bucket.

    Returns:
        ``passed`` (every bucket within its bound), the largest absolute error, the largest error as a
        fraction of its bucket's bound (``max_err_over_bound``, ≤ 1 when passed) and of Σ|x_i|, and the
        most terms in a bucket.
    """
    diff = np.abs(np.asarray(got) - np.asarray(ref))
    bound = summation_bound(counts, abs_sums)
    over = np.where(bound > 0, diff / np.where(bound > 0, bound, 1.0), np.where(diff > 0, np.inf, 0.0))
    rel = np.where(abs_sums > 0, diff / np.where(abs_sums > 0, abs_sums, 1.0), 0.0)
    return {"passed": bool((diff <= bound).all()), "max_abs_err": float(diff.max()),
            "max_err_over_bound": float(over.max()), "max_err_over_sum_abs": float(rel.max()),
            "terms_per_bucket_max": int(np.max(counts))}


def _median_ms(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(max(1, repeats)):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return 1000.0 * statistics.median(times)


def sketch_part(args: argparse.Namespace, device: torch.device, clock: _Clock, log: _Log,
                record: dict[str, Any], workers: int) -> None:
    """Part 1: the device sketch against the CPU reference, fp32 and bf16, and its time per gradient.

    Fills ``record`` in place (status, layout, per-dtype comparison and timings).
    """
    seed = 0
    layout = sketch_layout(args.sketch_model or args.model, args.sketch_vocab)
    names = [n for n, _ in layout]
    sizes = [math.prod(s) for _, s in layout]
    n = sum(sizes)
    record.update(layout={"preset": args.sketch_model or args.model, "vocab": args.sketch_vocab,
                          "tensors": len(layout), "n_params": n}, sketch_seed=seed, values="N(0,1), seed 0",
                  tolerance=TOLERANCE_NOTE, dtypes={})
    log(f"part 1: sketch of {len(layout)} tensors, {n:,} parameters ({record['layout']['preset']}, "
        f"vocab {args.sketch_vocab}) on {device}")
    flat = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
    t0 = time.monotonic()
    hashes = [TensorHash.build(seed, name, 0, size) for name, size in zip(names, sizes, strict=True)]
    counts = sum(np.bincount(h.buckets, minlength=SKETCH_DIM) for h in hashes)
    log(f"  CPU hash arrays: {time.monotonic() - t0:.1f} s")
    t0 = time.monotonic()
    sk = TorchSketch.build(list(zip(names, sizes, strict=True)), seed, device)
    _sync(device)
    record["device_build_s"] = time.monotonic() - t0
    log(f"  TorchSketch.build on {device}: {record['device_build_s']:.1f} s")
    per_tensor = max(1, args.reference_scalars // len(layout))
    offsets = np.cumsum([0, *sizes])
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        if clock.left() <= 0:
            raise BudgetSpent(f"budget spent before the {dtype_name} sketch check")
        values = flat.to(dtype)
        exact = values.to(torch.float32).numpy()  # bf16 → fp32 is exact; the reference upcasts to float64
        t0 = time.monotonic()
        ref = np.zeros(SKETCH_DIM)
        abs_sums = np.zeros(SKETCH_DIM)
        for h, lo, hi in zip(hashes, offsets[:-1], offsets[1:], strict=True):
            x = exact[lo:hi].astype(np.float64)
            ref += sketch_tensor(x, h)
            abs_sums += np.bincount(h.buckets, weights=np.abs(x), minlength=SKETCH_DIM)
        ref_s = time.monotonic() - t0
        on_device = values.to(device)
        got = sk(on_device).cpu().numpy()
        full = compare_sketches(got, ref, counts, abs_sums)
        # the readable Python loop against the dispatcher's torch body on the device: a prefix of each tensor
        prefix_dev = {name: on_device[lo:lo + min(per_tensor, hi - lo)]
                      for name, lo, hi in zip(names, offsets[:-1], offsets[1:], strict=True)}
        prefix_cpu = {name: exact[lo:lo + min(per_tensor, hi - lo)]
                      for name, lo, hi in zip(names, offsets[:-1], offsets[1:], strict=True)}
        t1 = time.monotonic()
        loop = sketch_state_dict(prefix_cpu, seed, impl="reference")
        loop_s = time.monotonic() - t1
        disp = sketch_state_dict(prefix_dev, seed, impl="torch")
        p_hash = {name: TensorHash.build(seed, name, 0, len(x)).buckets for name, x in prefix_cpu.items()}
        p_counts = sum(np.bincount(p_hash[name], minlength=SKETCH_DIM) for name in prefix_cpu)
        p_abs = sum(np.bincount(p_hash[name], weights=np.abs(x.astype(np.float64)), minlength=SKETCH_DIM)
                    for name, x in prefix_cpu.items())
        prefix = compare_sketches(disp, loop, p_counts, p_abs)
        prefix["scalars"] = int(sum(len(x) for x in prefix_cpu.values()))
        rows = torch.stack([on_device] * workers) if workers > 1 else on_device.unsqueeze(0)
        one_ms = _median_ms(lambda x=on_device: sk(x), device, args.sketch_repeats)
        k_ms = _median_ms(lambda x=rows: sk(x), device, args.sketch_repeats)
        record["dtypes"][dtype_name] = {
            "full_vs_numpy": full, "prefix_vs_python_loop": prefix,
            "passed": full["passed"] and prefix["passed"],
            "ms_per_gradient": one_ms, "ms_per_gradient_in_k_rows": k_ms / workers, "k_rows": workers,
            "cpu_numpy_s": ref_s, "cpu_python_loop_s": loop_s,
        }
        log(f"  {dtype_name}: vs numpy {'pass' if full['passed'] else 'FAIL'} "
            f"(err {full['max_abs_err']:.3g} = "
            f"{full['max_err_over_bound']:.3g} of the bound); prefix of {prefix['scalars']:,} vs Python loop "
            f"{'pass' if prefix['passed'] else 'FAIL'}; {one_ms:.3f} ms/gradient, "
            f"{k_ms / workers:.3f} ms/gradient in {workers} rows")
        del on_device, rows, prefix_dev, values
    failed = [d for d, r in record["dtypes"].items() if not r["passed"]]
    if failed:
        raise AssertionError(f"the {device} sketch differs from the CPU reference beyond the float64 bound "
                             f"({', '.join(failed)})")


# -- part 3: the monitor ---------------------------------------------------------------------------


def payload_check(got: np.ndarray, ref: np.ndarray, n: int, abs_sum: float) -> dict[str, Any]:
    """The device payload [S x | ‖x‖² | count] against the CPU one (the C kernel), within float64 bounds.

    Both sum the same exact float64 terms in other orders, so every sketch coordinate and ‖x‖² differ by
    at most 2·γ_{n−1}·Σ|x_i| (resp. Σx_i²); the counts must be equal.

    Args:
        got: (16,) the device's payload (R = 1).
        ref: (16,) the CPU's.
        n: the values sketched.
        abs_sum: Σ|x_i| in float64.

    Example:
        >>> ref = np.r_[np.ones(14), 4.0, 0.0]
        >>> [payload_check(ref + np.r_[np.full(15, e), 0.0], ref, 10, 10.0)["passed"] for e in (1e-15, 1e-9)]
        [True, False]
    """
    bound = summation_bound(np.full(SKETCH_DIM + 1, n), np.r_[np.full(SKETCH_DIM, abs_sum), ref[SKETCH_DIM]])
    out = compare_sketches(got[:SKETCH_DIM + 1], ref[:SKETCH_DIM + 1], np.full(SKETCH_DIM + 1, n),
                           np.r_[np.full(SKETCH_DIM, abs_sum), ref[SKETCH_DIM]])
    out["bound_max"] = float(bound.max())
    out["counts_equal"] = bool(got[-1] == ref[-1])
    out["passed"] = out["passed"] and out["counts_equal"]
    return out


def _mlp(widths: tuple[int, ...], device: torch.device) -> torch.nn.Module:
    """Linear + GELU layers of ``widths``, their parameters created on ``device``."""
    layers: list[torch.nn.Module] = []
    with torch.device(device):
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
            layers += [torch.nn.Linear(a, b)] + ([torch.nn.GELU()] if i + 2 < len(widths) else [])
    return torch.nn.Sequential(*layers)


def _model(spec: tuple[int, ...] | str, device: torch.device) -> torch.nn.Module:
    """Part 3's model: an MLP of widths ``spec``, or the GPT preset named ``spec``, on ``device``."""
    if isinstance(spec, str):
        if device.type == "meta":
            with torch.device(device):
                return GPT(get_preset(spec))
        return GPT(get_preset(spec), generator=torch.Generator().manual_seed(0)).to(device)  # CPU init
    return _mlp(spec, device)


def _batch(spec: tuple[int, ...] | str, batch: int, device: torch.device, gen: torch.Generator,
           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One step's input (and targets for a GPT: ``batch`` sequences of the preset's context)."""
    if isinstance(spec, str):
        ctx = get_preset(spec).context
        idx = torch.randint(0, 256, (batch, ctx + 1), device=device, generator=gen)
        return idx[:, :-1], idx[:, 1:]
    return torch.randn(batch, spec[0], device=device, generator=gen), None


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
    return model(x).square().mean() if y is None else lm_loss(model(x), y)


def _kernel_check(name: str, widths: tuple[int, ...] | str, device: torch.device, args: argparse.Namespace,
                  log: _Log) -> dict[str, Any]:
    """The monitor's payload kernel on one flat gradient of the model's layout: check, ms, GB/s."""
    with torch.device("meta"):
        layout = [(n, p.numel()) for n, p in _model(widths, torch.device("meta")).named_parameters()]
    n = sum(size for _, size in layout)
    t0 = time.perf_counter()
    sk = MonitorSketch.build(layout, seed=0)
    out: dict[str, Any] = {"n_params": n, "build_s": time.perf_counter() - t0,
                           "held_bytes": sk.layout.nbytes()}
    flat = torch.randn(n, generator=torch.Generator().manual_seed(0))
    for dname, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        values = flat.to(dtype)
        on_device = values.to(device)
        got = sk.payload(on_device).cpu().numpy()
        body = "compiled" if compiled_available() and device.type == "cuda" else "numpy"  # the other body
        ref = sk.layout(values, body).numpy()
        check = payload_check(got, ref, n, float(values.to(torch.float64).abs().sum()))
        ms = _median_ms(lambda x=on_device: sk.payload(x), device, args.sketch_repeats)
        read_ms = _median_ms(lambda x=on_device: x.sum(), device, args.sketch_repeats)  # torch's one read
        gbps = n * values.element_size() / (ms / 1000) / 1e9
        out[dname] = {"check": check, "ms": ms, "gb_per_s": gbps, "hbm_share": gbps / (HBM_TBPS * 1000),
                      "read_ms": read_ms, "over_read": ms / read_ms}
        log(f"  monitor kernel {name} {dname}: {'pass' if check['passed'] else 'FAIL'} "
            f"(err {check['max_err_over_bound']:.2g} of the bound), {ms:.3f} ms, {gbps:.0f} GB/s = "
            f"{100 * gbps / (HBM_TBPS * 1000):.1f}% of {HBM_TBPS} TB/s; torch's sum of it {read_ms:.3f} ms "
            f"({ms / read_ms:.1f}x)")
        del on_device, values
    return out


def _one_rank_group(device: torch.device, out: Path) -> str:
    """A one-rank default process group for the DDP variants (NCCL on CUDA, gloo on CPU); its backend."""
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        store = out / "one-rank-store"
        store.unlink(missing_ok=True)
        dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=120))
    return dist.get_backend()


def _step_overhead(name: str, widths: tuple[int, ...] | str, device: torch.device, args: argparse.Namespace,
                   log: _Log) -> dict[str, Any]:
    """One GPU: SGD steps of the MLP plain, with ``Monitor.observe`` of its gradients, under one-rank DDP,
    and under one-rank DDP with ``MonitorHook`` (``log``), interleaved; every variant from the same init."""
    gen = torch.Generator(device=device).manual_seed(0)
    batch = args.monitor_batch or (8 if isinstance(widths, str) else 64)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # peak_gib: this model's four variants only
    backend = _one_rank_group(device, Path(args.out))
    variants: dict[str, tuple[torch.nn.Module, torch.optim.Optimizer, Monitor | None]] = {}
    for variant in ("plain", "observe", "ddp", "ddp+hook"):
        torch.manual_seed(0)
        model = _model(widths, device)
        monitor = Monitor(window=8) if variant in ("observe", "ddp+hook") else None
        if variant.startswith("ddp"):
            module = model
            model = DistributedDataParallel(module, device_ids=[device.index or 0] if device.type == "cuda"
                                            else None)
            if monitor is not None:
                MonitorHook(module, monitor=monitor).register(model)
                monitor = None  # the hook reads the buckets itself
        variants[variant] = (model, torch.optim.SGD(model.parameters(), lr=1e-4), monitor)

    def step(variant: str) -> None:
        model, opt, monitor = variants[variant]
        x, y = _batch(widths, batch, device, gen)
        opt.zero_grad()
        _loss(model, x, y).backward()
        if monitor is not None:
            monitor.observe({n: p.grad for n, p in model.named_parameters()})
        opt.step()

    for variant in variants:
        for _ in range(12):  # past the detectors' window (8) and their one-off calibration
            step(variant)
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.monitor_rounds):
        for variant in variants:
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(args.monitor_steps):
                step(variant)
            _sync(device)
            times[variant].append(1000 * (time.perf_counter() - t0) / args.monitor_steps)
    ms = {v: statistics.median(t) for v, t in times.items()}

    def paired(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(times[a], times[b], strict=True))

    out = {"n_params": sum(p.numel() for p in variants["plain"][0].parameters()), "batch": batch,
           "backend": backend, "ms": ms, "ms_plain": ms["plain"], "ms_observe": ms["observe"],
           "ratio": ms["observe"] / ms["plain"], "paired_ratio": paired("observe", "plain"),
           "ddp_ratio": ms["ddp+hook"] / ms["ddp"], "ddp_paired_ratio": paired("ddp+hook", "ddp")}
    if device.type == "cuda":
        out["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    log(f"  monitor step {name} ({out['n_params']:,} parameters, batch {batch}): plain {ms['plain']:.2f} ms, "
        f"observe {ms['observe']:.2f} ms, ratio {out['ratio']:.3f} (paired {out['paired_ratio']:.3f}); "
        f"one-rank DDP ({backend}) {ms['ddp']:.2f} ms, with MonitorHook {ms['ddp+hook']:.2f} ms, ratio "
        f"{out['ddp_ratio']:.3f} (paired {out['ddp_paired_ratio']:.3f})")
    return out


def monitor_part(args: argparse.Namespace, device: torch.device, clock: _Clock, log: _Log,
                 record: dict[str, Any]) -> None:
    """Part 3: the monitor's payload kernel (Triton on CUDA) against the C kernel, GB/s and share of HBM
    bandwidth, and the one-GPU step overhead of ``Monitor.observe``, per model of ``--monitor-models``.
    """
    names = [m.strip() for m in args.monitor_models.split(",") if m.strip()]
    record.update(hbm_tbps=HBM_TBPS, models={})
    log(f"part 3: the monitor's kernel and step overhead on {device}: {', '.join(names)}")
    try:
        for name in names:
            if clock.left() <= 0:
                raise BudgetSpent(f"budget spent before the monitor's {name}")
            widths = MONITOR_MODELS[name]
            record["models"][name] = {"kernel": _kernel_check(name, widths, device, args, log),
                                      "step": _step_overhead(name, widths, device, args, log)}
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    failed = [n for n, r in record["models"].items()
              if not all(r["kernel"][d]["check"]["passed"] for d in ("fp32", "bf16"))]
    if failed:
        raise AssertionError(f"the monitor's {device} payload differs from the C kernel's "
                             f"({', '.join(failed)})")


# -- part 2: simulate ----------------------------------------------------------------------------


def _config(args: argparse.Namespace, steps: int, **extra: Any) -> SimulateConfig:
    opts: dict[str, Any] = dict(model=args.model, device=args.device, lags=args.lag_list,
                                strategies=args.strategy_list, steps=steps, seeds=args.seeds,
                                batch_size=args.batch_size, eval_batches=args.eval_batches,
                                lr=None if args.lr is None else (args.lr,))
    opts.update(extra)
    return SimulateConfig.from_options(**{k: v for k, v in opts.items() if v is not None})


def _eval_every(args: argparse.Namespace, steps: int) -> int:
    return args.eval_every if args.eval_every is not None else max(1, steps // 4)


def _evaluations(every: int, steps: int) -> int:
    """Evaluations one run makes (``evaluation_points`` less the untrained one, which is per seed)."""
    return (len(range(every, steps, every)) if every else 0) + 1


def _gradients(strategy: str, lags: tuple[int, ...], steps: int) -> int:
    """Worker gradients one run computes at fixed lags (a lag-τ worker joins at step τ)."""
    if not STRATEGIES[strategy].uses_lags:
        return len(lags) * steps
    return sum(max(0, steps - t) for t in lags)


def size_steps(seconds: float, grad_s: float, eval_s: float, run_start_s: float, strategies: tuple[str, ...],
               lags: tuple[int, ...], seeds: int, evals: Callable[[int], int]) -> int:
    """The most steps per run whose estimated time fits ``seconds`` (0 if none does).

    Args:
        seconds: the time available for the runs.
        grad_s: seconds per worker gradient (the step time with every worker active ÷ K).
        eval_s: seconds per evaluation.
        run_start_s: seconds to start one run (θ_0, buffers).
        strategies: the rules to run; ``seeds`` runs each.
        lags: the fixed lags.
        evals: evaluations per run for a number of steps.

    Example:
        >>> size_steps(100.0, 0.1, 0.0, 0.0, ("sync",), (0, 0), 1, lambda s: 1)
        500
    """
    def cost(s: int) -> float:
        return seeds * sum(grad_s * _gradients(r, lags, s) + eval_s * evals(s) + run_start_s
                           for r in strategies)

    lo, hi = 0, 1
    while cost(hi) <= seconds and hi < 10**9:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cost(mid) <= seconds else (lo, mid)
    return lo


class _Watch:
    """The progress callback: per-step times, per-strategy peak memory, progress lines, the budget."""

    def __init__(self, device: torch.device, clock: _Clock, log: _Log, steps: int,
                 estimate: Callable[[str], float] | None = None) -> None:
        self.device, self.clock, self.log, self.steps = device, clock, log, steps
        self.estimate = estimate  # seconds one run of a strategy is expected to take, or None
        self.events: list[tuple[float, StepEvent]] = []
        self.peak: dict[str, int] = {}
        self.stopped: str | None = None
        self.run_key: tuple[str, int, float] | None = None
        self.step_s: dict[str, list[float]] = {}
        self.last_seconds = 0.0
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def __call__(self, event: StepEvent) -> None:
        now = time.monotonic()
        key = (event.strategy, event.seed, event.lr)
        new_run = key != self.run_key
        step = event.seconds - (0.0 if new_run else self.last_seconds)
        self.run_key, self.last_seconds = key, event.seconds
        self.events.append((now, event))
        self.step_s.setdefault(event.strategy, []).append(step)
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
            self.peak[event.strategy] = max(self.peak.get(event.strategy, 0), peak)
            torch.cuda.reset_peak_memory_stats(self.device)
        every = max(1, event.steps // 5)
        if event.step in (1, event.steps) or event.step % every == 0 or event.val_loss is not None:
            loss = "" if event.val_loss is None else f", val loss {event.val_loss:.4f}"
            self.log(f"  {event.strategy} seed {event.seed}: step {event.step}/{event.steps}, "
                     f"{event.seconds:.1f} s in steps{loss}")
        if self.clock.left() <= 0:
            self.stopped = (f"budget of {self.clock.budget:g} s spent during {event.strategy} "
                            f"seed {event.seed} at step {event.step}/{event.steps}")
            raise BudgetSpent(self.stopped)
        if new_run and self.estimate is not None:
            need = self.estimate(event.strategy) - event.seconds
            if need > self.clock.left():
                self.stopped = (f"budget: {event.strategy} seed {event.seed} needs ~{need:.0f} s, "
                                f"{self.clock.left():.0f} s left")
                raise BudgetSpent(self.stopped)


def _probe(args: argparse.Namespace, device: torch.device, clock: _Clock, log: _Log) -> dict[str, Any]:
    """Short runs with every worker from step 0: seconds per gradient, evaluation and run start."""
    names = tuple(n for n in ("naig", "hogwild") if n in args.strategy_list) or args.strategy_list[:2]
    steps = max(2, args.probe_steps)
    cfg = _config(args, steps, strategies=names, seeds=1, eval_every=0, warmup_theta0=True)
    log(f"  probe: {', '.join(names)}, {steps} steps each, every worker from step 0")
    watch = _Watch(device, clock, log, steps)
    t0 = time.monotonic()
    result = run_experiment(cfg, watch)
    if result is None or result.interrupted or watch.stopped:
        raise BudgetSpent(watch.stopped or "the probe was interrupted")
    k = len(args.lag_list)
    per_run: dict[str, dict[str, float]] = {}
    for name in names:
        marks = [(t, e) for t, e in watch.events if e.strategy == name]
        steps_s = watch.step_s[name]
        step = statistics.median(steps_s[1:]) if len(steps_s) > 1 else steps_s[0]
        gaps = [b[0] - a[0] for a, b in zip(marks[:-1], marks[1:], strict=True)]
        # the last step's callback comes after its evaluation
        eval_s = max(0.0, gaps[-1] - steps_s[-1]) if gaps else 0.0
        per_run[name] = {"step_s": step, "first_step_s": steps_s[0], "eval_s": eval_s}
    first_t = watch.events[0][0]
    setup_s = first_t - t0 - watch.step_s[names[0]][0]
    if len(names) > 1:
        last_a = max(t for t, e in watch.events if e.strategy == names[0])
        first_b = min(t for t, e in watch.events if e.strategy == names[1])
        run_start_s = max(0.0, first_b - last_a - watch.step_s[names[1]][0])
    else:
        run_start_s = setup_s
    step_s = max(r["step_s"] for r in per_run.values())
    out = {"strategies": list(names), "steps": steps, "wall_s": time.monotonic() - t0,
           "per_strategy": per_run,
           "setup_s": setup_s, "run_start_s": run_start_s, "grad_s": step_s / k,
           "eval_s": max(r["eval_s"] for r in per_run.values()),
           "peak_gib": {n: v / 2**30 for n, v in watch.peak.items()} or None}
    log(f"  probe: {step_s:.3f} s/step with {k} workers, evaluation {out['eval_s']:.2f} s, setup "
        f"{setup_s:.1f} s, run start {run_start_s:.1f} s")
    return out


def _gib(value: int | None) -> float | None:
    return None if value is None else value / 2**30


def simulate_part(args: argparse.Namespace, device: torch.device, clock: _Clock, log: _Log,
                  record: dict[str, Any], save: Callable[[], None]) -> None:
    """Part 2: ``run_experiment`` at the lags for the strategies; fills ``record`` in place."""
    out = Path(args.out)
    record.update(precision=AUTOCAST_NOTE, tf32=args.tf32, model=args.model, lags=list(args.lag_list),
                  strategies_planned=list(args.strategy_list))
    sizing: dict[str, Any] | None = None
    if args.steps is None:
        log("part 2: sizing the runs from a probe")
        sizing = _probe(args, device, clock, log)
        record["sizing"] = sizing
        save()
        available = clock.left() - sizing["setup_s"] - min(RESERVE_S, 0.1 * clock.budget)
        steps = size_steps(available / MARGIN, sizing["grad_s"], sizing["eval_s"], sizing["run_start_s"],
                           args.strategy_list, args.lag_list, args.seeds,
                           lambda s: _evaluations(_eval_every(args, s), s))
        sizing.update(available_s=available, margin=MARGIN, steps=steps)
        if steps < 1:
            raise BudgetSpent(f"budget: {available:.0f} s left fit no step of "
                              f"{len(args.strategy_list)} strategies")
        log(f"  sized: {steps} steps per run to fit {available:.0f} s (margin {MARGIN})")
    else:
        steps = args.steps
    cfg = _config(args, steps, eval_every=_eval_every(args, steps), log_dir=str(out / "simulate-csv"))
    rows, option = buffer_rows(cfg)
    n_params = sum(math.prod(s) for _, s in sketch_layout(args.model))
    record.update(steps=steps, config=cfg.to_dict(), n_params=n_params,
                  notes=list(cfg.warnings()),
                  memory_estimate={"parameter_buffers": rows, "buffers_gib": 4 * rows * n_params / 2**30,
                                   "set_by": option})
    if steps <= max(args.lag_list):
        record["notes"].append(f"steps ({steps}) <= the largest lag ({max(args.lag_list)}): that worker "
                               "never joins")
    for note in record["notes"]:
        log(f"  note: {note}")
    log(f"part 2: {args.model} ({n_params:,} parameters), lags {args.lags}, {steps} steps x "
        f"{len(args.strategy_list)} strategies x {args.seeds} seed(s), "
        f"fp32{' (TF32 matmuls)' if args.tf32 else ''}; "
        f"{rows} parameter-sized buffers = {record['memory_estimate']['buffers_gib']:.1f} GiB")

    def estimate(name: str) -> float:
        if sizing is not None:
            return MARGIN * (sizing["grad_s"] * _gradients(name, args.lag_list, steps)
                             + sizing["eval_s"] * _evaluations(cfg.eval_every, steps))
        done = [r for r in watch.step_s.values() if len(r) > 1]
        if not done:
            return 0.0  # nothing measured yet: only the hard deadline applies
        per_step = max(statistics.median(r[1:]) for r in done)
        return MARGIN * per_step * steps

    watch = _Watch(device, clock, log, steps, estimate)
    t0 = time.monotonic()
    try:
        result = run_experiment(cfg, watch)
    finally:
        _pack_csv(out)  # the CSVs of the runs that ran, also when one failed
    wall = time.monotonic() - t0
    if result is None:
        raise RuntimeError("run_experiment returned no result (a worker rank)")
    _write_json(out / "simulate.json", result.to_dict())
    record.update(result_file="simulate.json", wall_s=wall, interrupted=result.interrupted,
                  best_baseline=result.best_baseline, untrained_val_loss=result.untrained_val_loss,
                  peak_gib_overall=_gib(max(watch.peak.values())) if watch.peak else None)
    summaries = {s.strategy: s for s in result.summaries}
    table: dict[str, Any] = {}
    for name in args.strategy_list:
        runs = [r for r in result.runs if r.strategy == name]
        done = [r for r in runs if r.complete]
        finished = len(done) == args.seeds
        s = summaries.get(name)
        ms = s.ms_per_step if s is not None else None
        table[name] = {
            "finished": finished, "runs_finished": len(done),
            "final_val_loss": [r.final_val_loss for r in done],
            "final_val_loss_mean": s.val_loss_mean if s is not None and finished else None,
            "diverged_at": [r.diverged_at for r in done],
            "updates": [r.updates for r in done],
            "ms_per_step": ms, "steps_per_s": 1000.0 / ms if ms else None,
            "peak_gib": _gib(watch.peak.get(name)) if device.type == "cuda" else None,
        }
    record["per_strategy"] = table
    naig_ms = table.get("naig", {}).get("ms_per_step")
    hog_ms = table.get("hogwild", {}).get("ms_per_step")
    record["routing_overhead"] = {
        "naig_ms_per_step": naig_ms, "hogwild_ms_per_step": hog_ms,
        "ratio": naig_ms / hog_ms if naig_ms and hog_ms else None,
        "note": "naig ms/update / hogwild ms/update from the summaries: K gradients + combine + update, "
                "synchronised; hogwild's early steps have as many workers as naig's (both use the lags)"}
    missing = [n for n, r in table.items() if not r["finished"]]
    if missing:
        why = watch.stopped or ("interrupted" if result.interrupted else "runs missing")
        raise BudgetSpent(f"{why}; not finished: {', '.join(missing)}")


def _pack_csv(out: Path) -> None:
    """The per-run CSVs as one archive (the device returns at most 8 files)."""
    folder = out / "simulate-csv"
    if not folder.is_dir():
        return
    with tarfile.open(out / "simulate-csv.tar.gz", "w:gz") as tar:
        for path in sorted(folder.glob("*.csv")):
            tar.add(path, arcname=f"simulate-csv/{path.name}")
    shutil.rmtree(folder)


# -- the table -----------------------------------------------------------------------------------


def _fmt(value: float | None, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def _table(doc: dict[str, Any]) -> list[str]:
    env, sk, sim = doc["environment"], doc["sketch"], doc["simulate"]
    lines = [f"gpu_check: {env.get('device_name')} ({env['device']}), torch {env['torch']}, "
             f"{doc['elapsed_s']:.0f} s of {doc['budget_seconds']:g}, exit {doc['exit_code']}"]
    if sk["status"] == "skipped":
        lines.append("sketch: skipped")
    else:
        parts = [f"{d}: {'pass' if r['passed'] else 'FAIL'} "
                 f"(err {_fmt(r['full_vs_numpy']['max_err_over_bound'], '.2g')} of bound), "
                 f"{r['ms_per_gradient']:.3f} ms/grad"
                 for d, r in sk.get("dtypes", {}).items()]
        n = sk.get("layout", {}).get("n_params")
        lines.append(f"sketch {sk['status']}, n={_fmt(n, ',')}: " + "; ".join(parts))
    lines += _monitor_table(doc.get("monitor", {"status": "skipped"}))
    if sim["status"] == "skipped":
        lines.append("simulate: skipped")
        return lines
    lags = ",".join(map(str, sim.get("lags", [])))
    lines.append(f"simulate {sim['status']}: {sim.get('model')}, lags {lags}, "
                 f"{sim.get('steps', '-')} steps, fp32 (no bf16 autocast in naig simulate)"
                 f"{', TF32' if sim.get('tf32') else ''}")
    lines.append(f"  {'strategy':<12}{'final loss':>11}{'steps/s':>9}{'peak GiB':>10}  status")
    for name, r in sim.get("per_strategy", {}).items():
        loss = statistics.fmean(r["final_val_loss"]) if r["final_val_loss"] else None
        lines.append(f"  {name:<12}{_fmt(loss, '.4f'):>11}{_fmt(r['steps_per_s'], '.3f'):>9}"
                     f"{_fmt(r['peak_gib'], '.1f'):>10}  {'finished' if r['finished'] else 'not finished'}")
    ratio = sim.get("routing_overhead", {}).get("ratio")
    lines.append(f"  routing overhead naig/hogwild ms per step: {_fmt(ratio, '.3f')}")
    return lines


def _monitor_table(mon: dict[str, Any]) -> list[str]:
    if mon["status"] == "skipped":
        return ["monitor: skipped"]
    lines = [f"monitor {mon['status']}:"]
    for name, r in mon.get("models", {}).items():
        k, st = r["kernel"], r["step"]
        kern = "; ".join(f"{d} {'pass' if k[d]['check']['passed'] else 'FAIL'} {k[d]['ms']:.3f} ms "
                         f"{k[d]['gb_per_s']:.0f} GB/s ({100 * k[d]['hbm_share']:.1f}% HBM)"
                         for d in ("fp32", "bf16"))
        lines.append(f"  {name} ({k['n_params']:,}): kernel {kern}; step {st['ms_plain']:.2f} -> "
                     f"{st['ms_observe']:.2f} ms observe ({st['ratio']:.3f}x); one-rank DDP "
                     f"{st['ms']['ddp']:.2f} -> {st['ms']['ddp+hook']:.2f} ms MonitorHook "
                     f"({st['ddp_ratio']:.3f}x)")
    return lines


# -- main ----------------------------------------------------------------------------------------


def _run_part(name: str, record: dict[str, Any], body: Callable[[], None], log: _Log) -> None:
    record["status"] = "running"
    t0 = time.monotonic()
    try:
        body()
        record["status"] = "finished"
    except BudgetSpent as exc:
        record.update(status="stopped", reason=str(exc) or "budget spent")
    except (NaigError, AssertionError) as exc:
        record.update(status="failed", reason=str(exc))
    except Exception as exc:  # a device error must not lose what the other part measured
        first = str(exc).splitlines()[0] if str(exc) else ""
        record.update(status="failed", reason=f"{type(exc).__name__}: {first}")
        log(traceback.format_exc().rstrip())
    record["finished"] = record["status"] == "finished"
    record["seconds"] = time.monotonic() - t0
    if not record["finished"]:
        log(f"{name}: {record['status']}: {record['reason']}")


def main(argv: list[str] | None = None) -> int:
    """Parse options, run the parts within the budget, write the files, print the table.

    Returns:
        0 when every part that ran finished, 1 when one failed or did not finish (a usage error
        exits 2 before anything runs).
    """
    clock = _Clock(0.0)
    args = build_parser().parse_args(argv)
    clock.budget = args.budget_seconds
    if args.device == "cuda" and not torch.cuda.is_available():
        _usage("--device cuda: no CUDA GPU is available here; use --device cpu for the plumbing test")
    try:
        args.lag_list = parse_int_list(args.lags, "lags")
        args.strategy_list = tuple(s.strip() for s in args.strategies.split(",") if s.strip())
        for value, flag in ((args.steps, "--steps"), (args.seeds, "--seeds"),
                            (args.sketch_repeats, "--sketch-repeats"), (args.probe_steps, "--probe-steps"),
                            (args.reference_scalars, "--reference-scalars")):
            if value is not None and value < 1:
                _usage(f"{flag} {value}: use a positive int")
        if args.budget_seconds <= 0:
            _usage(f"--budget-seconds {args.budget_seconds:g}: use a positive number of seconds")
        if args.sketch_vocab < 1:
            _usage(f"--sketch-vocab {args.sketch_vocab}: use a positive int")
        unknown = [m for m in args.monitor_models.split(",") if m.strip() and m.strip() not in MONITOR_MODELS]
        if unknown:
            _usage(f"--monitor-models {unknown[0]}: use a comma list of {', '.join(MONITOR_MODELS)}")
        batch = 1 if args.monitor_batch is None else args.monitor_batch
        for value, flag in ((args.monitor_rounds, "--monitor-rounds"),
                            (args.monitor_steps, "--monitor-steps"), (batch, "--monitor-batch")):
            if value < 1:
                _usage(f"{flag} {value}: use a positive int")
        get_preset(args.sketch_model or args.model)
        _config(args, args.steps or max(args.lag_list) + 1, eval_every=args.eval_every)  # refuses bad options
    except UsageError as exc:
        _usage(str(exc))
    device = torch.device(args.device)
    if args.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _usage(f"--out {args.out}: cannot create it ({exc.strerror or exc})")
    log = _Log(out / "gpu_check.log", clock.start)
    doc: dict[str, Any] = {
        "schema": "naig-gpu-check/1",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", *sys.argv]) if argv is None else shlex.join(["main", *argv]),
        "options": {k: v for k, v in vars(args).items()}, "environment": _environment(device),
        "budget_seconds": args.budget_seconds, "elapsed_s": 0.0, "exit_code": None, "reason": None,
        "sketch": {"status": "skipped" if args.skip_sketch else "not started", "finished": False},
        "simulate": {"status": "skipped" if args.skip_simulate else "not started", "finished": False},
        "monitor": {"status": "skipped" if args.skip_monitor else "not started", "finished": False},
    }

    def save() -> None:
        doc["elapsed_s"] = clock.elapsed()
        _write_json(out / "gpu_check.json", doc)

    log(f"gpu_check on {doc['environment'].get('device_name')} ({device}), torch {torch.__version__}, "
        f"budget {args.budget_seconds:g} s; {doc['command']}")
    save()
    workers = len(args.lag_list)
    if not args.skip_sketch:
        _run_part("part 1 (sketch)", doc["sketch"],
                  lambda: sketch_part(args, device, clock, log, doc["sketch"], workers), log)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        save()
    if not args.skip_monitor:
        _run_part("part 3 (monitor)", doc["monitor"],
                  lambda: monitor_part(args, device, clock, log, doc["monitor"]), log)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        save()
    if not args.skip_simulate:
        if clock.left() <= 0:
            doc["simulate"].update(status="stopped",
                                   reason=f"budget of {args.budget_seconds:g} s spent before it started")
        else:
            _run_part("part 2 (simulate)", doc["simulate"],
                      lambda: simulate_part(args, device, clock, log, doc["simulate"], save), log)
        save()
    parts = (("part 1 (sketch)", "sketch"), ("part 3 (monitor)", "monitor"),
             ("part 2 (simulate)", "simulate"))
    bad = [(name, doc[key]) for name, key in parts if doc[key]["status"] not in ("finished", "skipped")]
    doc["exit_code"] = 1 if bad else 0
    doc["reason"] = "; ".join(f"{name} {r['status']}: {r.get('reason')}" for name, r in bad) or None
    save()
    log.raw("\n".join(_table(doc)))
    save()
    if bad:
        sys.stderr.write(f"gpu_check.py: {doc['reason']}\n")
    return doc["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
