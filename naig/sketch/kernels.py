"""Chunk kernels of the streaming sketch: a compiled fast path and a numpy path.

Both implement one contract (docs/design.md §5, §6), checked equal in float64 by the tests:

- ``hash_codes(key, start, m)`` → uint8 codes, ``code_i = a_i | (sign_bit_i << 7)``
  for flat indices ``start .. start+m−1`` of a tensor whose key is ``key``.
  Computed once per chunk of a tensor and reused for every file.
- ``accumulate(codes, ref, x, out)`` adds, in float64, ``S x`` to ``out[0:14]``,
  ⟨x, ref⟩ to ``out[14]``, ‖x‖² to ``out[15]``, ‖x − ref‖² to ``out[16]`` and
  Σ (x − ref)⁴ to ``out[17]``. ``ref`` and ``x`` are float32/float64 arrays or the raw
  stored bits of any dtype in ``DTYPES`` (bf16, fp16, every fp8), upcast exactly.
- ``accumulate_files(keys, m, rows, out)`` is ``accumulate`` of one piece for several
  files read from open file descriptors, row 0 the reference; the compiled path streams
  the piece in cached blocks and gives the same sums bit for bit.
- ``decode(raw, dtype)`` is that exact upcast to float64.

The compiled path (``naig/sketch/_kernel.c``) is built at install time when a C compiler
is available; set ``NAIG_PURE_NUMPY=1`` to force the numpy path, ``NAIG_KERNEL_ISA=portable``,
``avx2`` or ``avx512`` to cap its vector bodies (same sums bit for bit but for NaN signs; tests and
benchmarks).
The compiled path sums in four interleaved lanes, numpy in its own (pairwise) order: they
agree to rounding (about 1e-16 relative on a chunk, 1e-13 on sums over 10⁸ scalars, where the
four lanes' sequential sums are the less accurate), and
each is reproducible bit for bit.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from naig.sketch.core import MASK, SKETCH_DIM, bucket_of, index_hashes

__all__ = [
    "STATS",
    "HAVE_COMPILED",
    "compiled_isa",
    "DTYPES",
    "ITEMSIZE",
    "hash_codes",
    "accumulate",
    "accumulate_files",
    "decode",
    "new_stats",
]

STATS = SKETCH_DIM + 4  # 14 sketch coordinates, ⟨x, ref⟩, ‖x‖², ‖x − ref‖², Σ (x − ref)⁴
DTYPES = {  # safetensors dtype → kernel code (the order of the enum in _kernel.c)
    "F64": 0,
    "F32": 1,
    "F16": 2,
    "BF16": 3,
    "F8_E4M3": 4,  # torch.float8_e4m3fn
    "F8_E5M2": 5,
    "F8_E4M3FNUZ": 6,
    "F8_E5M2FNUZ": 7,
    "F8_E8M0": 8,  # torch.float8_e8m0fnu (MX scales)
}
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2} | {k: 1 for k in DTYPES if k.startswith("F8")}
_SIGN = np.uint8(128)
_MAX_KEYS = 64  # sketch seeds one compiled accumulate_files pass takes (MAX_R in _kernel.c)
_NUMPY_BLOCK = 1 << 20  # scalars the numpy accumulate_files holds per file at a time
_TYPED = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}

try:
    if os.environ.get("NAIG_PURE_NUMPY") == "1":
        raise ImportError("pure numpy path requested")
    from naig.sketch import _kernel  # type: ignore[attr-defined]

    HAVE_COMPILED = True
except ImportError:
    _kernel = None
    HAVE_COMPILED = False


def compiled_isa() -> str | None:
    """The C kernel's vector bodies in use: ``"avx512-ifma"``, ``"avx512"``, ``"avx2"`` or
    ``"portable"`` (the CPU's best, or fewer where ``NAIG_KERNEL_ISA`` caps them); None when the
    kernel is not available (``HAVE_COMPILED`` false). Both the audit's and the monitor's sketch run
    on these bodies."""
    return _kernel.isa() if _kernel is not None else None


def new_stats(rows: int) -> np.ndarray:
    """Zeroed accumulator of shape (rows, STATS), float64."""
    return np.zeros((rows, STATS))


def _fp8_table(dtype: str) -> np.ndarray:
    """float64 value of each of the 256 bit patterns of an 8-bit float (NaN where none).

    e4m3fn: bias 7, S.1111.111 is NaN, no inf; e5m2: bias 15, IEEE inf/NaN; the fnuz
    variants (bias 8 / 16): 0x80 is the only NaN, no inf and no −0; e8m0: 2^(b − 127),
    0xFF NaN. Exponent 0 holds subnormals m · 2^(1 − bias − mbits).
    """
    b = np.arange(256)
    if dtype == "F8_E8M0":
        return np.where(b == 255, np.nan, np.ldexp(1.0, b - 127))
    formats = {"F8_E4M3": (4, 7), "F8_E5M2": (5, 15), "F8_E4M3FNUZ": (4, 8), "F8_E5M2FNUZ": (5, 16)}
    ebits, bias = formats[dtype]  # exponent bits and bias
    mbits = 7 - ebits
    e, m = (b >> mbits) & ((1 << ebits) - 1), b & ((1 << mbits) - 1)
    mag = np.where(e == 0, np.ldexp(m.astype(float), 1 - bias - mbits),
                   np.ldexp((m | (1 << mbits)).astype(float), e - bias - mbits))
    v = np.where(b & 128, -mag, mag)
    top = (1 << ebits) - 1
    if dtype == "F8_E5M2":
        v = np.where(e == top, np.where(m == 0, np.copysign(np.inf, v), np.nan), v)
    elif dtype == "F8_E4M3":
        v = np.where((e == top) & (m == 7), np.nan, v)
    else:
        v = np.where(b == 128, np.nan, v)
    return v


_FP8 = {k: _fp8_table(k) for k in DTYPES if k.startswith("F8")}


def _raw(a: np.ndarray, dtype: str | None) -> tuple[np.ndarray, str]:
    """(the array's bytes, its safetensors dtype); ``dtype`` names the format of raw bits."""
    if dtype is None:
        if a.dtype not in _TYPED:
            raise ValueError(f"accumulate: {a.dtype} needs its safetensors dtype (e.g. 'BF16')")
        dtype = _TYPED[a.dtype]
    if dtype not in DTYPES:
        raise ValueError(f"accumulate: unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    if not a.flags.c_contiguous or a.ndim != 1:
        raise ValueError(f"accumulate: expected contiguous 1-D arrays, got shape {a.shape}")
    return a.view(np.uint8), dtype


def decode(raw: np.ndarray, dtype: str | None = None, compiled: bool | None = None) -> np.ndarray:
    """Exact float64 values of stored scalars.

    Args:
        raw: contiguous 1-D array: float32/float64/float16 values, or the raw bits
            (any integer dtype, e.g. uint16 for bf16, uint8 for fp8) of ``dtype``.
        dtype: safetensors dtype of ``raw`` (``"BF16"``, ``"F8_E4M3FNUZ"``, ...);
            None for a float32/float64/float16 array.
        compiled: force (True) or avoid (False) the compiled path.

    Returns:
        float64 array of shape (m,).

    Example:
        >>> bits = np.array([0x3FC0, 0xC000], dtype=np.uint16)  # bfloat16 1.5 and -2
        >>> decode(bits, "BF16").tolist()
        [1.5, -2.0]
    """
    b, dtype = _raw(raw, dtype)
    if compiled if compiled is not None else HAVE_COMPILED:
        out = np.empty(b.size // ITEMSIZE[dtype])
        _kernel.decode(b, DTYPES[dtype], out)
        return out
    return _decode_numpy(b, dtype)


def _decode_numpy(b: np.ndarray, dtype: str) -> np.ndarray:
    if dtype in _FP8:
        return _FP8[dtype][b]
    if dtype == "BF16":
        b = (b.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.uint8)
    typed = b.view({"F64": np.float64, "F32": np.float32, "BF16": np.float32, "F16": np.float16}[dtype])
    with np.errstate(invalid="ignore"):  # signalling NaN patterns become quiet NaNs
        return typed.astype(np.float64)


def _hash_codes_numpy(key: int, start: int, m: int) -> np.ndarray:
    h = index_hashes(key, start, start + m)  # (m,) uint64
    codes = bucket_of(h).astype(np.uint8)
    codes |= (h & np.uint64(1)).astype(np.uint8) << np.uint8(7)
    return codes


def hash_codes(key: int, start: int, m: int, compiled: bool | None = None) -> np.ndarray:
    """Sketch codes of flat indices ``start .. start+m−1``.

    Args:
        key: the tensor key ``naig.sketch.tensor_key(seed, name)``.
        start: first flat (row-major) index of the chunk.
        m: chunk length.
        compiled: force (True) or avoid (False) the compiled path; default: use it if built.

    Returns:
        uint8 array of shape (m,): bucket in the low 4 bits, sign bit in bit 7.
    """
    key &= MASK  # both paths wrap the key to 64 bits
    if compiled if compiled is not None else HAVE_COMPILED:
        out = np.empty(m, dtype=np.uint8)
        _kernel.hash_codes(key, start, out)
        return out
    return _hash_codes_numpy(key, start, m)


def _accumulate_numpy(codes: Sequence[np.ndarray], r64: np.ndarray, x64: np.ndarray, out: np.ndarray) -> None:
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf inputs are flagged by the caller
        diff = x64 - r64
        d2 = diff * diff
        stats = (x64 @ r64, x64 @ x64, diff @ diff, d2 @ d2)
    for c, row in zip(codes, out, strict=True):
        signed = np.where(c & _SIGN, -x64, x64)
        row[:SKETCH_DIM] += np.bincount(c & np.uint8(15), weights=signed, minlength=SKETCH_DIM)
        row[SKETCH_DIM:] += stats


def _check_inputs(codes: Sequence[np.ndarray], m: int, out: np.ndarray) -> None:
    """The compiled path reads raw buffers: dtypes, lengths and contiguity must be exact."""
    ok = (
        len(codes) >= 1
        and all(c.dtype == np.uint8 and c.shape == (m,) and c.flags.c_contiguous for c in codes)
        and out.dtype == np.float64
        and out.shape == (len(codes), STATS)
        and out.flags.c_contiguous
        and out.flags.writeable
    )
    if not ok:
        got = ", ".join(f"{c.dtype}{c.shape}" for c in codes)
        raise ValueError(
            f"accumulate: expected contiguous uint8 codes (m,) per seed for m = {m} scalars and a writable "
            f"float64 out ({STATS},) or (R, {STATS}); got codes {got}, out {out.dtype}{out.shape}"
        )


def accumulate(
    codes: np.ndarray | Sequence[np.ndarray],
    ref: np.ndarray,
    x: np.ndarray,
    out: np.ndarray,
    compiled: bool | None = None,
    *,
    ref_dtype: str | None = None,
    x_dtype: str | None = None,
) -> None:
    """Fused pass over one chunk; see the module docstring for the contract.

    Args:
        codes: (m,) uint8 from ``hash_codes``, or a sequence of R such arrays (R sketch
            seeds sharing one read of ``x``).
        ref: (m,) the reference chunk: float32/float64/float16 values, or raw bits of
            ``ref_dtype`` (contiguous).
        x: (m,) the file's chunk, likewise (its dtype may differ from ``ref``'s).
        out: (STATS,) float64 for one code array, (R, STATS) for R; updated in place.
            Every row gets the same ⟨x, ref⟩, ‖x‖², ‖x − ref‖², Σ (x − ref)⁴.
        compiled: force (True) or avoid (False) the compiled path.
        ref_dtype: safetensors dtype of raw ``ref`` bits (e.g. ``"BF16"``); None for a
            float array.
        x_dtype: likewise for ``x``.

    Raises:
        ValueError: for codes that are not contiguous uint8 of length m, arrays of other
            lengths or layouts, an unknown dtype or a wrong ``out``.

    Example:
        >>> x = np.array([1.0, -2.0, 0.5], dtype=np.float32)
        >>> out = np.zeros(STATS)
        >>> accumulate(hash_codes(7, 0, 3), x, x, out)
        >>> out[SKETCH_DIM:].tolist()  # ⟨x, x⟩, ‖x‖², ‖x − x‖², Σ (x − x)⁴
        [5.25, 5.25, 0.0, 0.0]
    """
    codes = [codes] if isinstance(codes, np.ndarray) else list(codes)
    rb, rt = _raw(ref, ref_dtype)
    xb, xt = _raw(x, x_dtype)
    m = xb.size // ITEMSIZE[xt]
    if xb.size != m * ITEMSIZE[xt] or rb.size != m * ITEMSIZE[rt]:
        got = f"ref holds {rb.size / ITEMSIZE[rt]:g} scalars, x {xb.size / ITEMSIZE[xt]:g}"
        raise ValueError(f"accumulate: expected ref and x of the same length; {got}")
    rows = out[None] if out.ndim == 1 else out
    _check_inputs(codes, m, rows)
    if compiled if compiled is not None else HAVE_COMPILED:
        _kernel.accumulate(tuple(codes), rb, DTYPES[rt], xb, DTYPES[xt], rows)
    else:
        _accumulate_numpy(codes, _decode_numpy(rb, rt), _decode_numpy(xb, xt), rows)


def _read_numpy(fd: int, offset: int, n: int) -> np.ndarray | None:
    """``n`` bytes of an open file at ``offset``; None when the file ends first."""
    out = np.empty(n, np.uint8)
    got = 0
    while got < n:
        k = os.preadv(fd, [out[got:]], offset + got)
        if k == 0:
            return None
        got += k
    return out


def _accumulate_files_numpy(keys: Sequence[int], m: int, rows: Sequence[tuple[int, int, str]],
                            out: np.ndarray) -> int:
    """Blocks of ``_NUMPY_BLOCK`` scalars, each file in turn (memory: a few blocks)."""
    for base in range(0, m, _NUMPY_BLOCK):
        n = min(_NUMPY_BLOCK, m - base)
        codes = [_hash_codes_numpy(k, base, n) for k in keys]
        r64 = None
        for f, (fd, off, t) in enumerate(rows):
            raw = _read_numpy(fd, off + base * ITEMSIZE[t], n * ITEMSIZE[t])
            if raw is None:
                return f
            x64 = _decode_numpy(raw, t)
            r64 = x64 if r64 is None else r64
            _accumulate_numpy(codes, r64, x64, out[f])
    return -1


def accumulate_files(
    keys: Sequence[int],
    m: int,
    rows: Sequence[tuple[int, int, str]],
    out: np.ndarray,
    compiled: bool | None = None,
) -> int:
    """``accumulate`` of one piece of ``m`` scalars for several files, read from open files.

    Row 0 is the reference, scored against itself; row f ≥ 1 is file f against it. The
    compiled path streams the piece in blocks that stay in cache: each block's codes are
    hashed once and its reference bytes read once, then every file's bytes are read into one
    reused buffer (memory is a few blocks, whatever the piece, model or file count). Its sums
    equal ``accumulate`` on the whole piece in memory, bit for bit; the numpy path reads
    blocks of 2²⁰ scalars, one file at a time, and agrees to rounding (see the module docstring).

    Args:
        keys: R sketch keys, each ``tensor_key(seed, name) + start`` for a piece that starts
            at flat index ``start`` (``hash_codes(key, start, m)`` = codes of key + start).
        m: scalars in the piece.
        rows: F ≥ 1 ``(fd, byte offset of the piece, safetensors dtype)``; fds open for reading.
        out: (F, R, STATS) float64, C-contiguous; updated in place.
        compiled: force (True) or avoid (False) the compiled path.

    Returns:
        −1, or the first row whose file ended before the piece did (nothing is valid then).

    Raises:
        ValueError: a wrong ``out``, no keys or rows, or an unknown dtype.
        OSError: a read failed.

    Example:
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> path = tmp.name + "/x.bin"
        >>> np.array([1.0, -2.0, 0.5], np.float32).tofile(path)
        >>> fd = os.open(path, os.O_RDONLY)
        >>> out = np.zeros((2, 1, STATS))  # the file as reference, and again as a worker
        >>> accumulate_files([7], 3, [(fd, 0, "F32"), (fd, 0, "F32")], out)
        -1
        >>> out[1, 0, SKETCH_DIM:].tolist()  # ⟨x, r⟩, ‖x‖², ‖x − r‖², Σ (x − r)⁴
        [5.25, 5.25, 0.0, 0.0]
        >>> os.close(fd)
        >>> tmp.cleanup()
    """
    shape = (len(rows), len(keys), STATS)
    if not (keys and rows and out.shape == shape and out.dtype == np.float64 and out.flags.c_contiguous
            and out.flags.writeable):
        raise ValueError(f"accumulate_files: expected >= 1 keys and rows and a writable C-contiguous float64 "
                         f"out {shape}; got {out.dtype}{out.shape}")
    if unknown := [t for _, _, t in rows if t not in DTYPES]:
        known = ", ".join(DTYPES)
        raise ValueError(f"accumulate_files: unknown dtype {unknown[0]!r}; expected one of {known}")
    keys = [k & MASK for k in keys]
    if not (compiled if compiled is not None else HAVE_COMPILED):
        return _accumulate_files_numpy(keys, m, rows, out)
    coded = tuple((fd, off, DTYPES[t]) for fd, off, t in rows)
    if len(keys) <= _MAX_KEYS:
        return _kernel.accumulate_files(tuple(keys), m, coded, out)
    for a in range(0, len(keys), _MAX_KEYS):  # seeds are independent: one pass per group of them
        part = np.zeros((len(rows), len(keys[a : a + _MAX_KEYS]), STATS))
        if (bad := _kernel.accumulate_files(tuple(keys[a : a + _MAX_KEYS]), m, coded, part)) >= 0:
            return bad
        out[:, a : a + _MAX_KEYS] += part
    return -1
