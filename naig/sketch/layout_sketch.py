"""The sketch of tensors in place, hash codes computed while reading (docs/design.md §5).

``LayoutSketch`` is the monitor's sketch: R blocks of the project's 14-bucket CountSketch
(block r with seed ``seed + r``) over a flat layout of named tensors, computed in one read of
the values together with their float64 ‖x‖² and their number of non-finite entries:

    payload = [ S_1 x | … | S_R x | ‖x‖² | non-finite count ]      (14·R + 2 float64)

Nothing of the size of the tensors is stored: a layout is its *segments*, rows
``(offset, length, start, tensor)`` saying that the ``length`` values at ``offset`` of the flat
input are the flat indices ``start … start + length − 1`` of tensor ``tensor`` (whose hash key,
``naig.sketch.core.tensor_key(seed + r, name)``, is computed once per tensor and block). The
hash h_i = splitmix64(key + i) of every value is recomputed where it is read, so the codes,
buckets and signs are exactly those of ``naig.sketch.core``. Building a layout is one pass
over the parameter names (FNV-1a and splitmix64 per name); its memory is O(tensors × R + segments).
Entries of the input that no segment covers (FSDP's padding) are not read.

Bodies, chosen per call (``impl="auto"``):

- ``"compiled"``: the C kernel (``_kernel.c``, ``monitor_sketch``) on CPU tensors by address,
  no copy for contiguous tensors of float64/32/16, bfloat16 or any fp8 (a non-contiguous tensor
  is copied once into a contiguous one of its own dtype); one thread, the GIL released. On CPUs
  with AVX-512 the hash is computed in the loop that sums (AVX-512 IFMA where present), else in
  a pass of 1,024 codes before the sums; every body gives the same float64 sums bit for bit, NaN
  signs aside (``NAIG_KERNEL_ISA=portable|avx2|avx512`` caps them, for tests and benchmarks).
- ``"triton"``: a Triton kernel (``naig.sketch.triton_sketch``) for CUDA tensors when triton
  is importable: block partial sums in float64 registers, then one small float64 reduction.
- ``"torch"``: hashes computed with int64 torch ops on the tensor's device in chunks of
  ``CHUNK`` values (any device; the fallback on CUDA without triton).
- ``"numpy"``: uint64 numpy hashes in chunks (CPU without the C kernel, or
  ``NAIG_PURE_NUMPY=1``).

Every body sums in float64 (each value is converted exactly); they differ only in the order of
the float64 additions, so they agree within the bound of docs/design.md §5 (|error| ≤ γ_n Σ|x_i|
per bucket, γ_n ≈ n·2⁻⁵³ for sequential lanes). Chunked bodies hold at most ``CHUNK`` values'
temporaries (never a float64 copy of the whole tensor).

Example:
    >>> import torch
    >>> sk = LayoutSketch.build([("w", 10), ("b", 3)], seed=0)
    >>> x = torch.cat([torch.arange(10.0), torch.tensor([1.5, -2.0, 0.25])])
    >>> sk(x)[:3].tolist(), sk(x)[14].item()
    ([4.5, 0.0, -6.0], 291.3125)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from naig.errors import UsageError, warn_caller
from naig.sketch.core import MASK, SKETCH_DIM, bucket_of, check_seed, splitmix64_array, tensor_key

__all__ = ["CHUNK", "FALLBACK", "GROUP_VALUES", "IMPLS", "LayoutSketch", "compiled_available",
           "triton_available"]

CHUNK = 1 << 16  # values per chunk of the torch and numpy bodies (bounded temporaries)
IMPLS = ("auto", "compiled", "triton", "torch", "numpy")
GROUP_VALUES = 1 << 26
"""The most values ``of_tensors`` concatenates for one Triton launch (256 MiB of float32, one dtype
per run): the transient copy stays bounded whatever the model's size."""

_PURE = os.environ.get("NAIG_PURE_NUMPY") == "1"
try:
    if _PURE:
        raise ImportError("pure numpy path requested")
    from naig.sketch import _kernel  # type: ignore[attr-defined]

    _KERNEL = _kernel if hasattr(_kernel, "monitor_sketch") else None
except ImportError:
    _KERNEL = None

_CODES = {torch.float64: 0, torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}
for _name, _code in (("float8_e4m3fn", 4), ("float8_e5m2", 5), ("float8_e4m3fnuz", 6), ("float8_e5m2fnuz", 7),
                     ("float8_e8m0fnu", 8)):
    if hasattr(torch, _name):
        _CODES[getattr(torch, _name)] = _code


FALLBACK = {
    "numpy": ("naig's C sketch kernel is not built, so CPU gradients are sketched with numpy, about 10x "
              "slower (reinstall naig where a C compiler is available, which builds it; "
              "NAIG_PURE_NUMPY=1 asks for numpy and silences this)"),
    "torch": ("triton is not importable, so CUDA gradients are sketched with torch's index_add_, far below "
              "memory speed (pip install 'naig[triton]')"),
}
"""The one-line warning given once per process when ``auto`` falls back to a slower body than the
device has (``FALLBACK[body]``): nothing about the results changes, only the speed."""
_WARNED: set[str] = set()


def _fallback(body: str) -> str:
    """Warn once per process that ``auto`` chose ``body`` for want of the faster one (not for numpy
    when ``NAIG_PURE_NUMPY=1`` asks for it, read now)."""
    asked = body == "numpy" and os.environ.get("NAIG_PURE_NUMPY") == "1"
    if body not in _WARNED and not asked:
        _WARNED.add(body)
        warn_caller(FALLBACK[body])
    return body


def compiled_available() -> bool:
    """Whether the C kernel's ``monitor_sketch`` is built and not disabled by ``NAIG_PURE_NUMPY=1``."""
    return _KERNEL is not None


@lru_cache(maxsize=1)
def triton_available() -> bool:
    """Whether triton imports (the CUDA body; CUDA builds of torch ship it); checked once."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True, eq=False)
class LayoutSketch:
    """R sketch blocks over a flat layout given by its segments (see the module).

    Attributes:
        names: the tensors' names (they key the hashes), one per tensor.
        keys: (T, R) uint64, ``tensor_key(seed + r, names[t])``.
        segments: (P, 4) int64 rows (offset, length, start, tensor), non-empty, in input order.
        numel: n, the length of the flat input.
        seed: block 0's seed.
    """

    names: tuple[str, ...]
    keys: np.ndarray
    segments: np.ndarray
    numel: int
    seed: int
    _cache: dict = field(default_factory=dict, repr=False)  # per-address pieces, per-device tables

    @classmethod
    def build(cls, named_sizes: Sequence[tuple[str, int]], seed: int = 0, blocks: int = 1) -> LayoutSketch:
        """The sketch of tensors laid out one after another, whole (a DDP bucket, a state dict).

        Args:
            named_sizes: ``(name, numel)`` per tensor, in flat-layout order.
            seed: block 0's seed; block r uses ``seed + r`` (uint64).
            blocks: R ≥ 1.

        Raises:
            UsageError: a bad seed (``seed + blocks − 1`` included), ``blocks`` < 1 or a negative size.
        """
        names = tuple(str(n) for n, _ in named_sizes)
        sizes = np.array([int(s) for _, s in named_sizes], dtype=np.int64)
        if (sizes < 0).any():
            raise UsageError("tensor sizes must be >= 0", field="named_sizes")
        offsets = np.concatenate([[0], np.cumsum(sizes)])[:-1]
        rows = np.stack([offsets, sizes, np.zeros_like(sizes), np.arange(len(sizes))], axis=1)
        return cls.from_segments(names, rows, int(sizes.sum()), seed, blocks)

    @classmethod
    def from_segments(cls, names: Sequence[str], segments: np.ndarray, numel: int, seed: int = 0,
                      blocks: int = 1) -> LayoutSketch:
        """The sketch of any layout of tensor pieces (FSDP's reduce-scatter input, a shard).

        Args:
            names: the tensors' names.
            segments: (P, 4) integer rows (offset, length, start, tensor); empty rows are dropped.
            numel: the flat input's length (every segment must lie inside it).
            seed: block 0's seed.
            blocks: R ≥ 1.

        Raises:
            UsageError: a bad seed or ``blocks``, or a segment outside the input or naming no tensor.
        """
        r = _check_blocks(blocks)
        check_seed(seed)
        check_seed(seed + r - 1, field="seed")
        seg = np.asarray(segments, dtype=np.int64).reshape(-1, 4)
        seg = seg[seg[:, 1] > 0]
        if ((seg < 0).any() or (seg[:, 0] + seg[:, 1] > numel).any()
                or (seg[:, 3] >= len(names)).any()):
            raise UsageError(f"segments must lie inside the input of {numel} values and name one of "
                             f"{len(names)} tensors", field="segments")
        keys = np.array([[tensor_key(seed + b, n) for b in range(r)] for n in names],
                        dtype=np.uint64).reshape(len(names), r)
        return cls(tuple(names), keys, np.ascontiguousarray(seg), int(numel), int(seed))

    @property
    def blocks(self) -> int:
        """R, the number of 14-bucket blocks."""
        return int(self.keys.shape[1])

    @property
    def dim(self) -> int:
        """m = 14·R."""
        return SKETCH_DIM * self.blocks

    def nbytes(self) -> int:
        """Bytes this sketch holds (keys, segments and per-device tables), independent of n."""
        tables = sum(p.nbytes for p in self._cache.values() if isinstance(p, np.ndarray))
        return int(self.keys.nbytes + self.segments.nbytes + tables)

    def __call__(self, x: Tensor, impl: str = "auto") -> Tensor:
        """The payload [S_1 x | … | S_R x | ‖x‖² | non-finite count] of a flat input.

        Args:
            x: (n,) (or any shape with n values, row-major) float tensor on any device.
            impl: a body of ``IMPLS`` (``auto``: compiled on CPU, triton on CUDA, else torch/numpy).

        Returns:
            (14·R + 2,) float64 on ``x``'s device.

        Raises:
            UsageError: for a wrong length, a non-float tensor, an unknown or unavailable ``impl``.
        """
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise UsageError("expected a float tensor", field="x")
        if x.numel() != self.numel:
            raise UsageError(f"expected {self.numel} values, got {x.numel()}", field="x")
        x = x.detach()
        if not x.is_contiguous():
            x = x.contiguous()  # the one copy: a strided view is gathered into its own dtype
        body = self._body(x, impl)
        return body(x.reshape(-1))

    def of_tensors(self, tensors: Sequence[Tensor], impl: str = "auto") -> Tensor:
        """The payload of the flat concatenation of ``tensors``.

        For a sketch from ``build``: tensor t of the layout is ``tensors[t]`` (any shape, its numel
        as laid out). The C body reads each tensor where it lies. The Triton body (CUDA) copies runs
        of consecutive non-empty tensors of one dtype, at most ``GROUP_VALUES`` values each, into one
        buffer per run (``torch.cat``: a bounded transient copy) and launches once per run: a Python
        launch per tensor costs tens of microseconds, more than the sketch of most tensors. The numpy
        and torch bodies sketch tensor by tensor and add the payloads.

        Args:
            tensors: T float tensors on one device, in layout order.
            impl: as for ``__call__``.

        Returns:
            (14·R + 2,) float64 on the tensors' device.

        Raises:
            UsageError: a count or size that differs from the layout, or as for ``__call__``.
        """
        if len(tensors) != len(self.names) or not all(isinstance(t, Tensor) and t.is_floating_point()
                                                       for t in tensors):
            raise UsageError(f"expected the layout's {len(self.names)} float tensors", field="tensors")
        if (self.segments[:, 2] != 0).any() or len(np.unique(self.segments[:, 3])) != len(self.segments):
            raise UsageError("of_tensors needs a layout of whole tensors (LayoutSketch.build)",
                             field="tensors")
        # reshape(-1) copies a tensor it cannot view flat, but returns a strided view as it is (a 1-D slice
        # g[::3], a column, an expanded 0-stride tensor): those are gathered here (the one copy, in their
        # dtype), since the C kernel reads numel() values from data_ptr()
        flat = [f if (f := t.detach().reshape(-1)).is_contiguous() else f.contiguous() for t in tensors]
        if any(t.numel() != int(n) for t, n in zip(flat, self._sizes(), strict=True)):
            raise UsageError("a tensor's size differs from the layout's", field="tensors")
        if impl in ("auto", "compiled") and _KERNEL is not None and all(
                t.device.type == "cpu" and t.dtype in _CODES for t in flat):
            pieces = np.array([[t.data_ptr(), _CODES[t.dtype], t.numel(), 0, i]
                               for i, t in enumerate(flat) if t.numel()], dtype=np.int64).reshape(-1, 5)
            out = np.zeros(self.dim + 2)
            _KERNEL.monitor_sketch(pieces, self.keys, self.blocks, out)  # flat keeps the tensors alive
            return torch.from_numpy(out)
        on_cuda = bool(flat) and flat[0].device.type == "cuda"
        if impl == "triton" or (impl == "auto" and on_cuda and triton_available()):
            return self._triton_groups(flat, impl)
        out = None
        for i, t in enumerate(flat):
            if t.numel() == 0:
                continue
            part = self._sub((i,), [t.numel()])(t, impl)
            out = part if out is None else out + part
        return out if out is not None else torch.zeros(self.dim + 2, dtype=torch.float64)

    def _triton_groups(self, flat: list[Tensor], impl: str) -> Tensor:
        """``of_tensors`` on the Triton body: the non-empty tensors, in order, in runs of one dtype and at
        most ``GROUP_VALUES`` values, each run concatenated (``torch.cat``) and sketched in one launch; a
        launch per tensor costs more than the sketch (docs/results/gpu-h200.md)."""
        out = torch.zeros(self.dim + 2, dtype=torch.float64, device=flat[0].device if flat else None)
        for run in _runs([t.numel() for t in flat], [t.dtype for t in flat], GROUP_VALUES):
            sub = self._sub(run, [flat[t].numel() for t in run])
            out += sub(flat[run[0]] if len(run) == 1 else torch.cat([flat[t] for t in run]), impl)
        return out

    def _sub(self, tensors: tuple[int, ...], sizes: Sequence[int]) -> LayoutSketch:
        """The layout of these whole tensors of ``build``'s layout laid one after another (cached)."""
        sub = self._cache.get(("sub", tensors))
        if sub is None:
            n = np.array(sizes, dtype=np.int64)
            segments = np.stack([np.cumsum(n) - n, n, np.zeros_like(n), np.arange(len(n))], 1)
            sub = LayoutSketch(tuple(self.names[t] for t in tensors), self.keys[list(tensors)], segments,
                               int(n.sum()), self.seed)
            self._cache[("sub", tensors)] = sub
        return sub

    def _sizes(self) -> np.ndarray:
        sizes = np.zeros(len(self.names), dtype=np.int64)
        np.add.at(sizes, self.segments[:, 3], self.segments[:, 1])
        return sizes

    def _body(self, x: Tensor, impl: str):  # noqa: ANN202 (a bound method)
        if impl not in IMPLS:
            raise UsageError(f"use one of {', '.join(IMPLS)}", field="impl", value=impl)
        if impl == "auto":
            if x.device.type == "cpu":
                impl = "compiled" if _KERNEL is not None and x.dtype in _CODES else (
                    "numpy" if _KERNEL is not None or x.dtype not in _CODES else _fallback("numpy"))
            elif x.device.type == "cuda":
                impl = "triton" if triton_available() else _fallback("torch")
            else:
                impl = "torch"
        if impl == "compiled" and (_KERNEL is None or x.device.type != "cpu" or x.dtype not in _CODES):
            raise UsageError("the C kernel is not built (or NAIG_PURE_NUMPY=1), or x is not a CPU tensor of "
                             "a float dtype it reads", field="impl", value=impl)
        if impl == "triton" and not triton_available():
            raise UsageError("triton is not importable (pip install triton)", field="impl", value=impl)
        if impl == "numpy" and x.device.type != "cpu":
            raise UsageError("the numpy body reads CPU tensors only", field="impl", value=impl)
        return {"compiled": self._compiled, "triton": self._triton, "torch": self._torch,
                "numpy": self._numpy}[impl]

    def _compiled(self, x: Tensor) -> Tensor:
        key = ("pieces", x.data_ptr(), x.dtype)
        pieces = self._cache.get(key)
        if pieces is None:
            for k in [k for k in self._cache if k[0] == "pieces"]:
                del self._cache[k]  # one address at a time (a DDP bucket keeps its buffer)
            pieces = np.empty((len(self.segments), 5), dtype=np.int64)
            pieces[:, 0] = x.data_ptr() + self.segments[:, 0] * x.element_size()
            pieces[:, 1] = _CODES[x.dtype]
            pieces[:, 2:] = self.segments[:, 1:]
            self._cache[key] = pieces
        out = np.zeros(self.dim + 2)
        _KERNEL.monitor_sketch(pieces, self.keys, self.blocks, out)
        return torch.from_numpy(out)

    def _triton(self, x: Tensor) -> Tensor:
        from naig.sketch.triton_sketch import Plan, sketch_payload

        key = ("triton", x.device)
        if key not in self._cache:
            self._cache[key] = Plan.build(self.segments, self.keys, x.device)
        return sketch_payload(x, self._cache[key])

    def _numpy(self, x: Tensor) -> Tensor:
        out = np.zeros(self.dim + 2)
        for xs, key_row, start in self._chunks(x):
            v = xs.to(torch.float64).numpy()
            for r in range(self.blocks):
                h = _np_hashes(int(self.keys[key_row, r]), start, v.size)
                w = np.where(h & np.uint64(1), -v, v)
                out[r * SKETCH_DIM:(r + 1) * SKETCH_DIM] += np.bincount(
                    bucket_of(h).astype(np.intp), weights=w, minlength=SKETCH_DIM)
            out[-2] += float(v @ v)
            out[-1] += float(np.count_nonzero(~np.isfinite(v)))
        return torch.from_numpy(out)

    def _torch(self, x: Tensor) -> Tensor:
        out = torch.zeros(self.dim + 2, dtype=torch.float64, device=x.device)
        for xs, key_row, start in self._chunks(x):
            v = xs.to(torch.float64)
            for r in range(self.blocks):
                bucket, negative = _torch_codes(int(self.keys[key_row, r]), start, v.numel(), x.device)
                part = out[r * SKETCH_DIM:(r + 1) * SKETCH_DIM]
                part.index_add_(0, bucket, torch.where(negative, -v, v))
            out[-2] += torch.dot(v, v)
            out[-1] += (~torch.isfinite(v)).sum()
        return out

    def _chunks(self, x: Tensor):  # noqa: ANN202 (a generator of (values, tensor, start))
        for off, length, start, row in self.segments.tolist():
            for base in range(0, length, CHUNK):
                n = min(CHUNK, length - base)
                yield x[off + base:off + base + n], row, start + base


def _runs(sizes: Sequence[int], kinds: Sequence[object], cap: int) -> list[tuple[int, ...]]:
    """Runs of the indices of non-empty entries, in order: one kind (dtype) per run, sizes summing to
    at most ``cap`` (a larger entry is a run of its own); empty entries are left out.

    Example:
        >>> _runs([3, 0, 4, 9, 2, 2, 1], "aaaaaab", 8)
        [(0, 2), (3,), (4, 5), (6,)]
    """
    runs: list[tuple[int, ...]] = []
    run: list[int] = []
    total = 0
    for k, (n, kind) in enumerate(zip(sizes, kinds, strict=True)):
        if n == 0:
            continue
        if run and (total + n > cap or kinds[run[0]] != kind):
            runs.append(tuple(run))
            run, total = [], 0
        run.append(k)
        total += n
    if run:
        runs.append(tuple(run))
    return runs


def _check_blocks(blocks: object) -> int:
    if isinstance(blocks, bool) or not isinstance(blocks, int | np.integer) or blocks < 1:
        raise UsageError("must be an int >= 1 (the sketch has 14 floats per block)", field="blocks",
                         value=blocks)
    return int(blocks)


def _np_hashes(key: int, start: int, n: int) -> np.ndarray:
    idx = np.arange(n, dtype=np.uint64)
    idx += np.uint64((key + start) & MASK)
    return splitmix64_array(idx)


def _signed(c: int) -> int:
    """A uint64 constant as the int64 with the same bits."""
    c &= MASK
    return c - (1 << 64) if c >= 1 << 63 else c


_M1, _M2, _M3 = _signed(0x9E3779B97F4A7C15), _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def _torch_codes(key: int, start: int, n: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """(bucket (n,) int64, sign bit (n,) bool) of flat indices start … start + n − 1, in int64 torch ops.

    int64 addition and multiplication wrap mod 2^64 like uint64; right shifts are masked to be
    logical. Checked against ``naig.sketch.core`` by the tests.
    """
    z = torch.arange(n, dtype=torch.int64, device=device) + _signed(key + start + _M1)
    z = (z ^ ((z >> 30) & ((1 << 34) - 1))) * _M2
    z = (z ^ ((z >> 27) & ((1 << 37) - 1))) * _M3
    z = z ^ ((z >> 31) & ((1 << 33) - 1))
    return ((z >> 32) & 0xFFFFFFFF) % SKETCH_DIM, (z & 1).bool()

