"""Chunk kernels of the streaming sketch: a compiled fast path and a numpy path.

Both implement one contract (docs/design.md §5, §6), checked equal in float64 by the tests:

- ``hash_codes(key, start, m)`` → uint8 codes, ``code_i = a_i | (sign_bit_i << 7)``
  for flat indices ``start .. start+m−1`` of a tensor whose key is ``key``.
  Computed once per chunk of a tensor and reused for every file.
- ``accumulate(codes, ref, x, out)`` adds, in float64, ``S x`` to ``out[0:14]``,
  ⟨x, ref⟩ to ``out[14]``, ‖x‖² to ``out[15]`` and ‖x − ref‖² to ``out[16]``.

The compiled path (``naig/_kernel.c``) is built at install time when a C compiler
is available; set ``NAIG_PURE_NUMPY=1`` to force the numpy path.
"""

from __future__ import annotations

import os

import numpy as np

from naig.sketch.core import MASK, SKETCH_DIM, bucket_of, index_hashes

__all__ = ["STATS", "HAVE_COMPILED", "hash_codes", "accumulate", "new_stats"]

STATS = SKETCH_DIM + 3  # 14 sketch coordinates, ⟨x, ref⟩, ‖x‖², ‖x − ref‖²
_SIGN = np.uint8(128)

try:
    if os.environ.get("NAIG_PURE_NUMPY") == "1":
        raise ImportError("pure numpy path requested")
    from naig.sketch import _kernel  # type: ignore[attr-defined]

    HAVE_COMPILED = True
except ImportError:
    _kernel = None
    HAVE_COMPILED = False


def new_stats(rows: int) -> np.ndarray:
    """Zeroed accumulator of shape (rows, 17), float64."""
    return np.zeros((rows, STATS))


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


def _accumulate_numpy(codes: np.ndarray, ref: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    x64 = x.astype(np.float64, copy=False)
    signed = np.where(codes & _SIGN, -x64, x64)
    out[:SKETCH_DIM] += np.bincount(codes & np.uint8(15), weights=signed, minlength=SKETCH_DIM)
    r64 = ref.astype(np.float64, copy=False)
    diff = x64 - r64
    out[SKETCH_DIM:] += (x64 @ r64, x64 @ x64, diff @ diff)


def _check_inputs(codes: np.ndarray, ref: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """The compiled path reads raw buffers: dtypes, lengths and contiguity must be exact."""
    ok = (
        codes.dtype == np.uint8
        and ref.dtype == x.dtype
        and ref.dtype in (np.float32, np.float64)
        and codes.shape == ref.shape == x.shape == (codes.size,)
        and out.dtype == np.float64
        and out.shape == (STATS,)
        and all(a.flags.c_contiguous for a in (codes, ref, x, out))
        and out.flags.writeable
    )
    if not ok:
        raise ValueError(
            f"accumulate: expected contiguous uint8 codes (m,), float32/float64 ref and x (m,) of one "
            f"dtype and a writable float64 out ({STATS},); got codes {codes.dtype}{codes.shape}, "
            f"ref {ref.dtype}{ref.shape}, x {x.dtype}{x.shape}, out {out.dtype}{out.shape}"
        )


def accumulate(
    codes: np.ndarray, ref: np.ndarray, x: np.ndarray, out: np.ndarray, compiled: bool | None = None
) -> None:
    """Fused pass over one chunk; see the module docstring for the contract.

    Args:
        codes: (m,) uint8 from ``hash_codes``.
        ref: (m,) float32 or float64, the reference chunk (contiguous).
        x: (m,) same dtype as ``ref``, the file's chunk.
        out: (17,) float64, updated in place.
        compiled: force (True) or avoid (False) the compiled path.

    Raises:
        ValueError: unless codes is uint8, ref and x share a float32/float64 dtype and
            length, out is float64 of length 17, and all are C-contiguous 1-D arrays.
    """
    _check_inputs(codes, ref, x, out)
    if compiled if compiled is not None else HAVE_COMPILED:
        _kernel.accumulate(codes, ref, x, out)
    else:
        _accumulate_numpy(codes, ref, x, out)
