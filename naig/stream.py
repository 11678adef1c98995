"""Stream safetensors files chunk by chunk, bounded in memory (SPEC §3.2, §5).

Files are opened with ``safetensors.safe_open`` (read-only memory maps) and
reopened per batch of work, so the pages a batch touches are unmapped when it
is done: resident memory is bounded by the chunk size, not by model size or
the number of files. Pickle formats are refused without being opened.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from naig.errors import DataError, UsageError

__all__ = [
    "FLOAT_DTYPES",
    "TensorInfo",
    "FileInfo",
    "Piece",
    "inspect_file",
    "expand_inputs",
    "plan_tensors",
    "batches",
    "read_pieces",
]

FLOAT_DTYPES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
_NUMPY_DTYPES = {"F64", "F32", "F16"}  # read without torch; the others need torch
_PICKLE_SUFFIXES = {".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle"}
_CONVERT = (
    'convert it once with: python -c "import torch; from safetensors.torch import save_file; '
    "save_file(torch.load('{p}', weights_only=True), '{s}')\""
)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a file: name, safetensors dtype string (e.g. ``"BF16"``) and shape."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        """Number of scalars (1 for a 0-d tensor)."""
        return math.prod(self.shape)


@dataclass(frozen=True)
class FileInfo:
    """A validated safetensors file: its tensors (in file order), metadata and size in bytes."""

    path: Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    nbytes: int


@dataclass(frozen=True)
class Piece:
    """A contiguous flat range ``[start, stop)`` of one tensor, read as one slice."""

    tensor: TensorInfo
    start: int
    stop: int
    index: tuple[slice, ...]  # the safetensors slice that yields exactly this range


def _sniff(path: Path) -> None:
    with open(path, "rb") as fh:
        head = fh.read(64)
    if head.startswith(b"version https://git-lfs"):
        raise DataError(f"{path}: is a git-lfs pointer, not the data; run `git lfs pull` first")
    if head[:2] == b"PK" or head[:1] == b"\x80":
        fix = _CONVERT.format(p=path, s=path.with_suffix(".safetensors"))
        raise DataError(f"{path}: is a pickle/zip file, not safetensors (never loaded); {fix}")


def inspect_file(path: str | os.PathLike[str]) -> FileInfo:
    """Validate a safetensors file and read its header (not its data).

    Args:
        path: path to a ``.safetensors`` file.

    Returns:
        ``FileInfo`` with every tensor's dtype and shape and the file's metadata.

    Raises:
        DataError: missing file, a directory, a pickle format (``.pt``, ``.bin``,
            ``.ckpt``: refused with a conversion command), a git-lfs pointer, or an
            empty, truncated, oversized-header or otherwise invalid file.
    """
    from safetensors import safe_open

    p = Path(path)
    if p.suffix.lower() in _PICKLE_SUFFIXES:
        fix = _CONVERT.format(p=p, s=p.with_suffix(".safetensors"))
        raise DataError(f"{p}: pickle formats are never loaded (unsafe); {fix}")
    if not p.exists():
        raise DataError(f"{p}: no such file; check the path")
    if not p.is_file():
        raise DataError(f"{p}: not a regular file; pass a .safetensors file or a directory")
    _sniff(p)
    try:
        with safe_open(str(p), framework="numpy") as f:
            tensors = {}
            for name in f.keys():
                sl = f.get_slice(name)
                tensors[name] = TensorInfo(name, sl.get_dtype(), tuple(sl.get_shape()))
            meta = dict(f.metadata() or {})
    except Exception as exc:  # SafetensorError and friends: one line, no traceback
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(
            f"{p}: not a valid safetensors file ({reason}); re-save it with safetensors.torch.save_file"
        ) from None
    return FileInfo(p, tensors, meta, p.stat().st_size)


def expand_inputs(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Expand directory arguments into their ``*.safetensors`` files, sorted.

    Raises:
        DataError: a directory with no ``*.safetensors`` file, or a missing path.
    """
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(p.glob("*.safetensors"))
            if not found:
                raise DataError(f"{p}: directory has no *.safetensors files; pass files instead")
            out.extend(found)
        else:
            out.append(p)
    return out


def _mismatch(ref: FileInfo, other: FileInfo, names: list[str], pattern: re.Pattern | None) -> str | None:
    theirs = [n for n in other.tensors if pattern is None or pattern.search(n)]
    missing = [n for n in names if n not in other.tensors]
    if missing:
        return f"{other.path}: tensor {missing[0]!r} of the reference {ref.path.name} is missing"
    extra = [n for n in theirs if n not in ref.tensors]
    if extra:
        return f"{other.path}: tensor {extra[0]!r} is not in the reference {ref.path.name}"
    for n in names:
        a, b = ref.tensors[n].shape, other.tensors[n].shape
        if a != b:
            return f"{other.path}: tensor {n!r} has shape {list(b)}, expected {list(a)}"
    return None


def plan_tensors(
    ref: FileInfo, others: Sequence[FileInfo], keys: str | None = None, intersect: bool = False
) -> tuple[list[TensorInfo], dict[str, int]]:
    """Choose the tensors to stream: float tensors common to all files, in reference order.

    Args:
        ref: the reference file.
        others: worker files.
        keys: optional regex; only tensor names it matches (``re.search``) are used.
        intersect: use the tensors every file has with the same shape instead of
            failing on a mismatch.

    Returns:
        ``(tensors, skipped)`` where ``skipped`` counts tensors left out by reason
        (``"int/bool"``, ``"not common"``, ``"--keys"``).

    Raises:
        UsageError: an invalid ``--keys`` regex.
        DataError: a name/shape mismatch without ``intersect``, or no float tensor left.
    """
    try:
        pattern = re.compile(keys) if keys else None
    except re.error as exc:
        raise UsageError(f"--keys {keys!r} is not a valid regular expression ({exc})") from None
    skipped = {"int/bool": 0, "not common": 0, "--keys": 0}
    names = [n for n in ref.tensors if pattern is None or pattern.search(n)]
    skipped["--keys"] = len(ref.tensors) - len(names)
    if intersect:
        common = [
            n
            for n in names
            if all(o.tensors.get(n) and o.tensors[n].shape == ref.tensors[n].shape for o in others)
        ]
        skipped["not common"], names = len(names) - len(common), common
    else:
        for other in others:
            msg = _mismatch(ref, other, names, pattern)
            if msg:
                raise DataError(f"{msg}; pass --intersect to use only the common tensors")
    floats = [ref.tensors[n] for n in names if _is_float(ref, others, n)]
    skipped["int/bool"] = len(names) - len(floats)
    if not floats:
        raise DataError(f"{ref.path}: no floating-point tensor to audit (after --keys/--intersect)")
    return floats, skipped


def _is_float(ref: FileInfo, others: Sequence[FileInfo], name: str) -> bool:
    return all(f.tensors[name].dtype in FLOAT_DTYPES for f in (ref, *others))


def _pieces(t: TensorInfo, chunk: int) -> Iterator[Piece]:
    if t.numel <= chunk or not t.shape:
        yield Piece(t, 0, t.numel, tuple(slice(0, d) for d in t.shape))
        return
    j = next(j for j in range(len(t.shape)) if math.prod(t.shape[j + 1 :]) <= chunk)
    inner = math.prod(t.shape[j + 1 :])  # scalars per step along axis j
    block = max(1, chunk // inner)
    rest = tuple(slice(0, d) for d in t.shape[j + 1 :])
    for outer in np.ndindex(*t.shape[:j]):
        base = int(np.ravel_multi_index(outer, t.shape[:j])) * t.shape[j] * inner if j else 0
        for b in range(0, t.shape[j], block):
            e = min(b + block, t.shape[j])
            idx = tuple(slice(o, o + 1) for o in outer) + (slice(b, e),) + rest
            yield Piece(t, base + b * inner, base + e * inner, idx)


def batches(tensors: Sequence[TensorInfo], chunk: int) -> Iterator[list[Piece]]:
    """Group tensors into batches of pieces of at most ``chunk`` scalars each.

    Small tensors share a batch; a tensor larger than ``chunk`` is split into
    contiguous row ranges (at least one innermost row per piece).
    """
    batch: list[Piece] = []
    size = 0
    for t in tensors:
        for piece in _pieces(t, chunk):
            n = piece.stop - piece.start
            if batch and size + n > chunk:
                yield batch
                batch, size = [], 0
            batch.append(piece)
            size += n
    if batch:
        yield batch


def read_pieces(path: Path, pieces: Sequence[Piece], dtypes: dict[str, str]) -> Iterator[np.ndarray]:
    """Read pieces of one file in a single open; yields flat float32/float64 arrays.

    F64 stays float64; F32/F16/BF16/F8 become float32 (an exact upcast). The
    file is closed (its pages unmapped) when the generator finishes.

    Args:
        path: the safetensors file.
        pieces: pieces to read, in order.
        dtypes: {tensor name: safetensors dtype in this file}.
    """
    from safetensors import safe_open

    need_torch = any(dtypes[p.tensor.name] not in _NUMPY_DTYPES for p in pieces)
    with safe_open(str(path), framework="pt" if need_torch else "numpy") as f:
        for p in pieces:
            x = f.get_slice(p.tensor.name)[p.index] if p.tensor.shape else f.get_tensor(p.tensor.name)
            yield _to_numpy(x).reshape(-1)


def _to_numpy(x: object) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x if x.dtype in (np.float32, np.float64) else x.astype(np.float32)
    import torch

    assert isinstance(x, torch.Tensor)
    return (x if x.dtype == torch.float64 else x.to(torch.float32)).numpy()
