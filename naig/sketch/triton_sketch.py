"""The monitor's sketch on CUDA: one Triton kernel, one read of the gradient (docs/design.md §5).

``sketch_payload(x, segments, keys, blocks)`` computes the payload of
``naig.sketch.layout_sketch.LayoutSketch`` for a CUDA tensor ``x``:

    [ S_1 x | … | S_R x | ‖x‖² | non-finite count ]      (14·R + 2,) float64

Kernel: G programs (a few per streaming multiprocessor) share the layout's chunks of ``BLOCK``
values; chunk c of segment p goes to program (first_p + c) mod G (first_p: the chunks of the
segments before p), so small tensors spread over the programs. Each program reads its chunks
once, recomputes h_i = splitmix64(key + i) in uint64 registers (bucket (h >> 32) mod 14, sign
h & 1: the codes of ``naig.sketch.core``), converts each value exactly to float64 and adds it,
signed, into a (BLOCK, 16) float64 register accumulator (a select per bucket), with v² and the
non-finite flag into (BLOCK,) accumulators. At the end each program reduces its accumulators
to one row of G × (16·R + 2) float64 partial sums; one float64 ``torch.sum`` over the G rows
gives the payload. R = 1 (the default) has its own kernel with fourteen (BLOCK,) accumulators, one
per bucket, instead of the (BLOCK, 16) tile: the tile measured 29-60x slower than torch's own read
of the same gradient on an H200 (docs/results/gpu-h200.md). For R > 1 blocks the program loops
over the blocks on the chunk it holds (one read from memory). The summation order depends only on
the layout and G, so a step is reproducible on one device.

Runs under ``TRITON_INTERPRET=1`` (numpy) too, which is how the tests check it on a CPU
against ``naig.sketch.core``.

Example:
    (needs triton; see tests/test_sketch_triton_sketch.py)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from naig.errors import UsageError
from naig.sketch.core import SKETCH_DIM

try:  # optional: ``pip install 'naig[triton]'`` (CUDA builds of torch ship it)
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None

__all__ = ["BLOCK", "Plan", "launch_plan", "sketch_payload"]

BLOCK = 256  # values per chunk: a (BLOCK, 16) float64 accumulator is 16 registers per thread
_WARPS = 8
_COLS = 16  # the 14 buckets padded to a power of two


if triton is not None:

    @triton.jit
    def _splitmix(z):
        z = z + 0x9E3779B97F4A7C15
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB
        return z ^ (z >> 31)


    @triton.jit
    def _payload_kernel(x_ptr, seg_ptr, first_ptr, keys_ptr, part_ptr, n_seg, n_prog, key_col, n_keys,
                        RG: tl.constexpr, BLOCK: tl.constexpr, COLS: tl.constexpr):
        """RG ≤ 4 blocks (key columns key_col … key_col + RG − 1) of this program's chunks."""
        pid = tl.program_id(0)
        lane = tl.arange(0, BLOCK)
        cols = tl.arange(0, COLS)
        sq = tl.zeros([BLOCK], dtype=tl.float64)
        bad = tl.zeros([BLOCK], dtype=tl.float64)
        acc0 = tl.zeros([BLOCK, COLS], dtype=tl.float64)
        acc1 = tl.zeros([BLOCK, COLS], dtype=tl.float64)
        acc2 = tl.zeros([BLOCK, COLS], dtype=tl.float64)
        acc3 = tl.zeros([BLOCK, COLS], dtype=tl.float64)
        for p in range(n_seg):
            off = tl.load(seg_ptr + 4 * p)
            length = tl.load(seg_ptr + 4 * p + 1)
            start = tl.load(seg_ptr + 4 * p + 2).to(tl.uint64)
            row = tl.load(seg_ptr + 4 * p + 3)
            first = tl.load(first_ptr + p)
            n_chunks = (length + BLOCK - 1) // BLOCK
            c0 = (pid - first % n_prog + n_prog) % n_prog
            k0 = tl.load(keys_ptr + row * n_keys + key_col).to(tl.uint64, bitcast=True) + start
            k1 = k0
            k2 = k0
            k3 = k0
            if RG > 1:
                k1 = tl.load(keys_ptr + row * n_keys + key_col + 1).to(tl.uint64, bitcast=True) + start
            if RG > 2:
                k2 = tl.load(keys_ptr + row * n_keys + key_col + 2).to(tl.uint64, bitcast=True) + start
            if RG > 3:
                k3 = tl.load(keys_ptr + row * n_keys + key_col + 3).to(tl.uint64, bitcast=True) + start
            for c in range(c0, n_chunks, n_prog):
                idx = lane.to(tl.int64) + c * BLOCK
                mask = idx < length
                v = tl.load(x_ptr + off + idx, mask=mask, other=0.0).to(tl.float64)
                sq += v * v
                bad += tl.where((v - v) != 0.0, 1.0, 0.0)  # v − v is NaN exactly for NaN and ±inf
                i = idx.to(tl.uint64)
                acc0 += _hit(k0 + i, v, cols)
                if RG > 1:
                    acc1 += _hit(k1 + i, v, cols)
                if RG > 2:
                    acc2 += _hit(k2 + i, v, cols)
                if RG > 3:
                    acc3 += _hit(k3 + i, v, cols)
        base = part_ptr + pid.to(tl.int64) * (RG * COLS + 2)
        tl.store(base + cols, tl.sum(acc0, axis=0))
        if RG > 1:
            tl.store(base + COLS + cols, tl.sum(acc1, axis=0))
        if RG > 2:
            tl.store(base + 2 * COLS + cols, tl.sum(acc2, axis=0))
        if RG > 3:
            tl.store(base + 3 * COLS + cols, tl.sum(acc3, axis=0))
        tl.store(base + RG * COLS, tl.sum(sq, axis=0))
        tl.store(base + RG * COLS + 1, tl.sum(bad, axis=0))


    @triton.jit
    def _one_block_kernel(x_ptr, seg_ptr, first_ptr, keys_ptr, part_ptr, n_seg, n_prog, n_keys,
                          BLOCK: tl.constexpr):
        """R = 1 (the default): fourteen (BLOCK,) float64 accumulators, one per bucket, so each value
        costs a select and an add per bucket in registers (no (BLOCK, 16) tile to lay out)."""
        pid = tl.program_id(0)
        lane = tl.arange(0, BLOCK)
        sq = tl.zeros([BLOCK], dtype=tl.float64)
        bad = tl.zeros([BLOCK], dtype=tl.float64)
        a0 = tl.zeros([BLOCK], dtype=tl.float64)
        a1 = tl.zeros([BLOCK], dtype=tl.float64)
        a2 = tl.zeros([BLOCK], dtype=tl.float64)
        a3 = tl.zeros([BLOCK], dtype=tl.float64)
        a4 = tl.zeros([BLOCK], dtype=tl.float64)
        a5 = tl.zeros([BLOCK], dtype=tl.float64)
        a6 = tl.zeros([BLOCK], dtype=tl.float64)
        a7 = tl.zeros([BLOCK], dtype=tl.float64)
        a8 = tl.zeros([BLOCK], dtype=tl.float64)
        a9 = tl.zeros([BLOCK], dtype=tl.float64)
        a10 = tl.zeros([BLOCK], dtype=tl.float64)
        a11 = tl.zeros([BLOCK], dtype=tl.float64)
        a12 = tl.zeros([BLOCK], dtype=tl.float64)
        a13 = tl.zeros([BLOCK], dtype=tl.float64)
        for p in range(n_seg):
            off = tl.load(seg_ptr + 4 * p)
            length = tl.load(seg_ptr + 4 * p + 1)
            start = tl.load(seg_ptr + 4 * p + 2).to(tl.uint64)
            row = tl.load(seg_ptr + 4 * p + 3)
            first = tl.load(first_ptr + p)
            n_chunks = (length + BLOCK - 1) // BLOCK
            c0 = (pid - first % n_prog + n_prog) % n_prog
            k0 = tl.load(keys_ptr + row * n_keys).to(tl.uint64, bitcast=True) + start
            for c in range(c0, n_chunks, n_prog):
                idx = lane.to(tl.int64) + c * BLOCK
                v = tl.load(x_ptr + off + idx, mask=idx < length, other=0.0).to(tl.float64)
                sq += v * v
                bad += tl.where((v - v) != 0.0, 1.0, 0.0)  # v − v is NaN exactly for NaN and ±inf
                h = _splitmix(k0 + idx.to(tl.uint64))
                b = ((h >> 32).to(tl.uint32) % 14).to(tl.int32)
                s = tl.where((h & 1) == 1, -v, v)
                a0 += tl.where(b == 0, s, 0.0)
                a1 += tl.where(b == 1, s, 0.0)
                a2 += tl.where(b == 2, s, 0.0)
                a3 += tl.where(b == 3, s, 0.0)
                a4 += tl.where(b == 4, s, 0.0)
                a5 += tl.where(b == 5, s, 0.0)
                a6 += tl.where(b == 6, s, 0.0)
                a7 += tl.where(b == 7, s, 0.0)
                a8 += tl.where(b == 8, s, 0.0)
                a9 += tl.where(b == 9, s, 0.0)
                a10 += tl.where(b == 10, s, 0.0)
                a11 += tl.where(b == 11, s, 0.0)
                a12 += tl.where(b == 12, s, 0.0)
                a13 += tl.where(b == 13, s, 0.0)
        base = part_ptr + pid.to(tl.int64) * 16
        tl.store(base + 0, tl.sum(a0, axis=0))
        tl.store(base + 1, tl.sum(a1, axis=0))
        tl.store(base + 2, tl.sum(a2, axis=0))
        tl.store(base + 3, tl.sum(a3, axis=0))
        tl.store(base + 4, tl.sum(a4, axis=0))
        tl.store(base + 5, tl.sum(a5, axis=0))
        tl.store(base + 6, tl.sum(a6, axis=0))
        tl.store(base + 7, tl.sum(a7, axis=0))
        tl.store(base + 8, tl.sum(a8, axis=0))
        tl.store(base + 9, tl.sum(a9, axis=0))
        tl.store(base + 10, tl.sum(a10, axis=0))
        tl.store(base + 11, tl.sum(a11, axis=0))
        tl.store(base + 12, tl.sum(a12, axis=0))
        tl.store(base + 13, tl.sum(a13, axis=0))
        tl.store(base + 14, tl.sum(sq, axis=0))
        tl.store(base + 15, tl.sum(bad, axis=0))


    @triton.jit
    def _hit(z, v, cols):
        """(BLOCK, COLS): v_i signed by h_i & 1 in column (h_i >> 32) mod 14, h = splitmix64(z)."""
        h = _splitmix(z)
        bucket = ((h >> 32).to(tl.uint32) % 14).to(tl.int32)  # 32-bit modulo: a 64-bit one is a call
        signed = tl.where((h & 1) == 1, -v, v)
        return tl.where(bucket[:, None] == cols[None, :], signed[:, None], 0.0)


@dataclass(frozen=True)
class Plan:
    """A layout's tables on one device (built once per layout and device; O(segments + tensors·R)).

    Attributes:
        segments: (P, 4) int64 rows (offset, length, start, tensor).
        first: (P,) int64, each segment's first chunk among all chunks.
        keys: (T, R) int64, the bits of the uint64 keys.
        programs: G, the programs of a launch.
        blocks: R.
    """

    segments: Tensor
    first: Tensor
    keys: Tensor
    programs: int
    blocks: int

    @classmethod
    def build(cls, segments: np.ndarray, keys: np.ndarray, device: torch.device) -> Plan:
        """The tables of ``LayoutSketch.segments`` and ``LayoutSketch.keys`` on ``device``."""
        programs, first = launch_plan(segments, device)
        return cls(torch.from_numpy(np.ascontiguousarray(segments, dtype=np.int64)).to(device),
                   torch.from_numpy(first).to(device),
                   torch.from_numpy(np.ascontiguousarray(keys).view(np.int64)).to(device),
                   programs, int(keys.shape[1]))


def sketch_payload(x: Tensor, plan: Plan) -> Tensor:
    """The payload [S_1 x | … | S_R x | ‖x‖² | non-finite count] of a flat tensor, on its device.

    Args:
        x: (n,) contiguous float tensor (float64/32/16 or bfloat16) on CUDA (or CPU under
            ``TRITON_INTERPRET=1``).
        plan: the layout's ``Plan`` on x's device. Groups of four blocks share one read; R > 4
            reads x once per group.

    Returns:
        (14·R + 2,) float64 on x's device (no host synchronisation).
    """
    if triton is None:
        raise UsageError("triton is not importable (pip install 'naig[triton]')", field="impl",
                         value="triton")
    r = plan.blocks
    out = torch.zeros(SKETCH_DIM * r + 2, dtype=torch.float64, device=x.device)
    n_seg = plan.segments.shape[0]
    if n_seg == 0:
        return out
    if r == 1:
        part = torch.empty(plan.programs, SKETCH_DIM + 2, dtype=torch.float64, device=x.device)
        _one_block_kernel[(plan.programs,)](x, plan.segments, plan.first, plan.keys, part, n_seg,
                                            plan.programs, r, BLOCK=BLOCK, num_warps=_WARPS)
        return part.sum(dim=0)
    for col in range(0, r, 4):
        rg = min(4, r - col)
        part = torch.empty(plan.programs, rg * _COLS + 2, dtype=torch.float64, device=x.device)
        _payload_kernel[(plan.programs,)](x, plan.segments, plan.first, plan.keys, part, n_seg, plan.programs,
                                          col, r, RG=rg, BLOCK=BLOCK, COLS=_COLS, num_warps=_WARPS)
        total = part.sum(dim=0)
        buckets = total[:rg * _COLS].reshape(rg, _COLS)[:, :SKETCH_DIM]
        out[col * SKETCH_DIM:(col + rg) * SKETCH_DIM] = buckets.reshape(-1)
        if col == 0:
            out[-2:] = total[-2:]
    return out


def launch_plan(segments: np.ndarray, device: torch.device) -> tuple[int, np.ndarray]:
    """(G programs, (P,) int64 index of each segment's first chunk) for a layout.

    G is 4 programs per streaming multiprocessor on CUDA (8 under the interpreter), at most the
    number of chunks.
    """
    chunks = -(-segments[:, 1] // BLOCK) if len(segments) else np.zeros(0, dtype=np.int64)
    first = np.concatenate([[0], np.cumsum(chunks)])[:-1].astype(np.int64)
    total = int(chunks.sum())
    if os.environ.get("TRITON_INTERPRET") == "1" or device.type != "cuda":
        cap = 8
    else:
        cap = 4 * torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(cap, total)), first
