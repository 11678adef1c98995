"""The readable reference of the sketch S : R^n → R^14, signed hashing (docs/design.md §5).

A state dict {name: tensor} is sketched tensor by tensor and the results summed;
S is linear. With 64-bit unsigned wrap-around arithmetic:

    key = splitmix64(seed XOR fnv1a64(name))
    h_i = splitmix64(key + i)              # i: row-major flat index
    a_i = (h_i >> 32) mod 14               # g2 coordinate
    s_i = +1 if (h_i & 1) == 0 else −1
    (S x)_a = Σ_{i : a_i = a} s_i x_i      # accumulated in float64

Notes:
    Guarantees (CountSketch, Charikar et al. 2002): for fixed x, y and a
    uniformly random hash, E[⟨Sx, Sy⟩] = ⟨x, y⟩ and
    Var[⟨Sx, Sx⟩] ≤ 2‖x‖⁴ / 14. S depends only on (seed, name, index), so the
    same seed sketches every file and every step consistently. Because S is
    linear, S(x − y) = Sx − Sy: drifts may be sketched file by file. The hash
    arrays of a tensor depend only on (seed, name, numel); compute them once
    per tensor (``TensorHash``) and reuse them for every file.

Example:
    >>> import numpy as np
    >>> w = np.arange(10, dtype=np.float32).reshape(2, 5)
    >>> b = np.array([1.5, -2.0, 0.25], dtype=np.float32)
    >>> sketch_reference({"w": w, "b": b}, seed=0).tolist()[:3]
    [4.5, 0.0, -6.0]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from naig.errors import check_seed

__all__ = [
    "check_seed",
    "SKETCH_DIM",
    "MASK",
    "splitmix64",
    "splitmix64_array",
    "fnv1a64",
    "tensor_key",
    "TensorHash",
    "index_hashes",
    "bucket_of",
    "sketch_reference",
    "sketch_tensor",
]

SKETCH_DIM = 14  # g2 coordinates: the sketch's number of buckets
MASK = (1 << 64) - 1  # 64-bit unsigned wrap-around


_FNV_OFFSET, _FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3
_U = np.uint64


def splitmix64(x: int) -> int:
    """splitmix64 of one 64-bit integer (reference path; Python ints masked to 64 bits)."""
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def splitmix64_array(x: np.ndarray) -> np.ndarray:
    """splitmix64 of a uint64 array, elementwise, wrapping mod 2^64 (fast path)."""
    z = x + _U(0x9E3779B97F4A7C15)
    z ^= z >> _U(30)
    z *= _U(0xBF58476D1CE4E5B9)
    z ^= z >> _U(27)
    z *= _U(0x94D049BB133111EB)
    z ^= z >> _U(31)
    return z


def fnv1a64(name: str) -> int:
    """FNV-1a 64-bit hash of the UTF-8 bytes of ``name``."""
    h = _FNV_OFFSET
    for byte in name.encode("utf-8"):
        h = ((h ^ byte) * _FNV_PRIME) & MASK
    return h


def tensor_key(seed: int, name: str) -> int:
    """key = splitmix64(seed XOR fnv1a64(name)); ``seed`` is taken mod 2^64."""
    return splitmix64((seed & MASK) ^ fnv1a64(name))


@dataclass(frozen=True)
class TensorHash:
    """The hash arrays of one tensor (or of a flat index range of it).

    Attributes:
        buckets: (m,) intp array, a_i ∈ [0, 14).
        signs: (m,) float64 array of ±1, s_i.
    """

    buckets: np.ndarray
    signs: np.ndarray

    @classmethod
    def build(cls, seed: int, name: str, start: int, stop: int) -> TensorHash:
        """Hash arrays for flat indices ``start <= i < stop`` of tensor ``name``."""
        h = index_hashes(tensor_key(seed, name), start, stop)  # (m,) uint64
        buckets = bucket_of(h).astype(np.intp)
        signs = 1.0 - 2.0 * (h & _U(1)).astype(np.float64)
        return cls(buckets, signs)


def index_hashes(key: int, start: int, stop: int) -> np.ndarray:
    """h_i = splitmix64(key + i) for flat indices ``start <= i < stop``: (m,) uint64."""
    idx = np.arange(start, stop, dtype=np.uint64)
    idx += _U(key & MASK)
    return splitmix64_array(idx)


def bucket_of(h: np.ndarray) -> np.ndarray:
    """a_i = (h_i >> 32) mod 14, the g2 coordinate of each hash: (m,) uint64."""
    return (h >> _U(32)) % _U(SKETCH_DIM)


def sketch_reference(state: Mapping[str, np.ndarray], seed: int = 0) -> np.ndarray:
    """Readable reference path: a Python loop over every scalar (use on small inputs).

    Args:
        state: {name: array}; arrays of any float dtype numpy can upcast exactly.
        seed: sketch seed (uint64).

    Returns:
        float64 array of shape (14,).
    """
    out = [0.0] * SKETCH_DIM
    for name, x in state.items():
        key = tensor_key(seed, name)
        for i, v in enumerate(np.asarray(x).reshape(-1).tolist()):
            h = splitmix64((key + i) & MASK)
            out[(h >> 32) % SKETCH_DIM] += -float(v) if h & 1 else float(v)
    return np.array(out)


def sketch_tensor(x: np.ndarray, hashes: TensorHash) -> np.ndarray:
    """Fast vectorised sketch of one flat tensor (or chunk) with precomputed hashes.

    Args:
        x: array of shape (m,) (any shape with m elements, row-major), float dtype.
        hashes: the ``TensorHash`` for exactly these m flat indices.

    Returns:
        float64 array of shape (14,): Σ s_i x_i per bucket, accumulated in float64.
    """
    w = hashes.signs * np.asarray(x, dtype=np.float64).reshape(-1)  # exact upcast
    return np.bincount(hashes.buckets, weights=w, minlength=SKETCH_DIM)
