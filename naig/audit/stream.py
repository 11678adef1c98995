"""Stream safetensors files chunk by chunk, bounded in memory (docs/design.md §6).

Files are opened with ``safetensors.safe_open`` (read-only memory maps) and
reopened per batch of work, so the pages a batch touches are unmapped when it
is done: resident memory is bounded by the chunk size, not by model size or
the number of files. Pickle formats are refused without being opened.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from naig.errors import DataError, UsageError

__all__ = [
    "FLOAT_DTYPES",
    "TensorInfo",
    "FileInfo",
    "Piece",
    "inspect_file",
    "plan_tensors",
    "batches",
    "read_pieces",
    "needs_torch",
]

FLOAT_DTYPES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
_NUMPY_DTYPES = {"F64", "F32", "F16"}  # read without torch; the others need torch
_PICKLE_SUFFIXES = {".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle"}
_CONVERT = (
    "convert it once, in a session you trust: load it with torch.load and weights_only=True, "
    "then write it with safetensors.torch.save_file(state_dict, '{s}')"
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
    """A validated safetensors file, or a sharded checkpoint read as one (docs/design.md §6).

    ``path`` is the file, or the checkpoint's ``*.safetensors.index.json``; ``tensors``
    are in reading order (file order; shard by shard for a checkpoint); ``nbytes`` is
    the size on disk of all its files; ``shards`` maps each tensor of a sharded
    checkpoint to the shard file that holds it (empty for a single file).
    """

    path: Path
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    nbytes: int
    shards: dict[str, Path] = field(default_factory=dict)

    def file_of(self, name: str) -> Path:
        """The file that holds tensor ``name``."""
        return self.shards.get(name, self.path)


@dataclass(frozen=True)
class Piece:
    """A contiguous flat range ``[start, stop)`` of one tensor, read as one slice."""

    tensor: TensorInfo
    start: int
    stop: int
    index: tuple[slice, ...]  # the safetensors slice that yields exactly this range


def _convert_hint(p: Path) -> str:
    target = p.with_suffix(".safetensors")
    if target == p:
        target = p.with_name(p.stem + ".converted.safetensors")
    return _CONVERT.format(s=target)


def _sniff(path: Path) -> None:
    """Recognise git-lfs pointers and pickle/zip files before safetensors parses them.

    A safetensors file is an 8-byte little-endian header length followed by a JSON
    header that starts with ``{``; only files without that ``{`` are sniffed.
    """
    with open(path, "rb") as fh:
        head = fh.read(64)
    if head[8:9] == b"{":
        return
    if head.startswith(b"version https://git-lfs"):
        raise DataError(f"{path}: is a git-lfs pointer, not the data; run `git lfs pull` first")
    if head[:4] == b"PK\x03\x04" or head[:1] == b"\x80":
        raise DataError(
            f"{path}: is a pickle/zip file, not safetensors (never loaded); {_convert_hint(path)}"
        )


_MAX_HEADER = 100_000_000  # safetensors' own limit on the JSON header, in bytes


def _data_end(header: bytes) -> int:
    """End offset of the last tensor's data (relative to the data section) in a JSON header."""
    entries = json.loads(header)
    return max((int(v["data_offsets"][1]) for k, v in entries.items() if k != "__metadata__"), default=0)


def _truncation(p: Path) -> str | None:
    """Say how a file is cut short, when it is (None: it is broken in another way)."""
    size = p.stat().st_size
    with open(p, "rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else 0
        header = fh.read(n) if 0 < n <= _MAX_HEADER else b""
    if size < 8:
        return "is empty (0 bytes)" if size == 0 else f"is truncated ({size} bytes, not even a header length)"
    if n > _MAX_HEADER:
        return None
    if 8 + n > size:
        return f"is truncated inside its header ({size:,} bytes; the header alone needs {8 + n:,})"
    try:
        need = 8 + n + _data_end(header)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None
    return f"is truncated ({size:,} bytes; its header describes {need:,})" if need > size else None


def _invalid(p: Path, exc: Exception) -> DataError:
    """The one-line error for a file safetensors refused."""
    cut = _truncation(p)
    if cut:
        return DataError(f"{p}: {cut}: the file is incomplete (an interrupted write, copy or download); "
                         "write or copy it again")
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return DataError(f"{p}: not a valid safetensors file ({reason}); "
                     "re-save it with safetensors.torch.save_file")


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
        raise DataError(f"{p}: pickle formats are never loaded (unsafe); {_convert_hint(p)}")
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
            meta = dict(sorted((f.metadata() or {}).items()))  # the file order is not stable
    except Exception as exc:  # SafetensorError and friends: one line, no traceback
        raise _invalid(p, exc) from None
    return FileInfo(p, tensors, meta, p.stat().st_size)


_INT_BOOL = re.compile(r"^(I|U)\d+$|^BOOL$")


def _skip_reason(dtype: str) -> str | None:
    """Why a tensor of this safetensors dtype is not audited (None: it is)."""
    if dtype in FLOAT_DTYPES:
        return None
    return "int/bool" if _INT_BOOL.match(dtype) else "other dtype"


def _auditable(info: FileInfo, pattern: re.Pattern | None) -> dict[str, TensorInfo]:
    """Float tensors of a file whose names match ``pattern``, in file order."""
    return {
        n: t
        for n, t in info.tensors.items()
        if _skip_reason(t.dtype) is None and (pattern is None or pattern.search(n))
    }


def _prefixes(names: Sequence[str]) -> list[str]:
    """Dotted prefixes (``module.``, ``model.``, ``module._orig_mod.``) that every name carries."""
    first = next(iter(names), "").split(".")
    cands = [".".join(first[:depth]) + "." for depth in range(1, min(4, len(first)))]
    return [p for p in cands if all(n.startswith(p) for n in names)]


def _prefix_hint(mine: dict, theirs: dict) -> str:
    """When two sets of names match once a common prefix is stripped, say which prefix."""
    for p in _prefixes(list(theirs)):
        if any(n[len(p):] in mine for n in theirs):
            return f"; its names carry the prefix {p!r} that the reference's lack: strip it before saving"
    for p in _prefixes(list(mine)):
        if any(n[len(p):] in theirs for n in mine):
            return f"; the reference's names carry the prefix {p!r} that its names lack: strip it"
    return ""


def _disjoint(mine: dict, other: FileInfo, theirs: dict) -> str | None:
    """Why a file has no tensor in common with the reference, or None when it has some."""
    if not any(n in other.tensors for n in mine):
        return f"{other.path} shares no tensor name with it{_prefix_hint(mine, other.tensors)}"
    same = [n for n in mine if n in theirs]
    if not same:
        return f"{other.path} holds its tensors in other dtypes"
    if not any(theirs[n].shape == mine[n].shape for n in same):
        return f"{other.path} has {len(same)} of its names, each with another shape"
    return None


def _nothing_common(ref: FileInfo, theirs: list[tuple[FileInfo, dict]], mine: dict) -> DataError:
    why = [w for o, t in theirs if (w := _disjoint(mine, o, t))]
    detail = "; ".join(why[:3]) + (f"; and {len(why) - 3} more files" if len(why) > 3 else "")
    return DataError(f"no floating-point tensor is common to the reference {ref.path} and every worker "
                     f"(same name and shape): {detail or 'no tensor is in every file'}")


def _check_overlap(ref: FileInfo, mine: dict, other: FileInfo) -> None:
    if not any(n in other.tensors for n in mine):
        hint = _prefix_hint(mine, other.tensors) or "; compare files of the same model"
        raise DataError(f"{other.path}: shares no tensor name with the reference {ref.path.name}{hint}")


def _mismatch(ref: FileInfo, mine: dict, other: FileInfo, theirs: dict) -> str | None:
    for n in mine:
        if n not in theirs:
            why = f"has dtype {other.tensors[n].dtype}" if n in other.tensors else "is missing"
            return f"{other.path}: tensor {n!r} of the reference {ref.path.name} {why}"
        if mine[n].shape != theirs[n].shape:
            got, want = list(theirs[n].shape), list(mine[n].shape)
            return f"{other.path}: tensor {n!r} has shape {got}, expected {want}"
    extra = next((n for n in theirs if n not in mine), None)
    return (
        None if extra is None else f"{other.path}: tensor {extra!r} is not in the reference {ref.path.name}"
    )


def _compile(keys: str | None) -> re.Pattern | None:
    try:
        return re.compile(keys) if keys else None
    except re.error as exc:
        raise UsageError(f"not a valid regular expression ({exc})", field="keys", value=keys) from None


def _count_skipped(ref: FileInfo, pattern: re.Pattern | None) -> dict[str, int]:
    skipped = {"int/bool": 0, "other dtype": 0, "not common": 0, "keys": 0}
    for n, t in ref.tensors.items():
        reason = _skip_reason(t.dtype) or ("keys" if pattern and not pattern.search(n) else None)
        if reason:
            skipped[reason] += 1
    return skipped


def plan_tensors(
    ref: FileInfo, others: Sequence[FileInfo], keys: str | None = None, intersect: bool = False
) -> tuple[list[TensorInfo], dict[str, int]]:
    """Choose the tensors to stream: float tensors common to all files, in reference order.

    Int/bool tensors (and other non-float dtypes such as complex) are skipped and
    counted in every file; only floating-point tensors are compared by name and shape.

    Args:
        ref: the reference file.
        others: worker files.
        keys: optional regex; only tensor names it matches (``re.search``) are used.
        intersect: use the tensors every file has with the same shape instead of
            failing on a mismatch.

    Returns:
        ``(tensors, skipped)`` where ``skipped`` counts the reference's tensors left
        out by reason (``"int/bool"``, ``"other dtype"``, ``"not common"``, and ``"keys"``:
        left out by the ``keys`` filter).

    Raises:
        UsageError: an invalid ``keys`` regex, or one that matches no float tensor.
        DataError: a name/shape mismatch without ``intersect``, or no float tensor left.
    """
    pattern = _compile(keys)
    skipped = _count_skipped(ref, pattern)
    mine = _auditable(ref, pattern)
    if not mine:
        if pattern is not None and _auditable(ref, None):
            raise UsageError(f"matches no floating-point tensor of {ref.path}", field="keys", value=keys)
        dtypes = sorted({t.dtype for t in ref.tensors.values()})
        raise DataError(f"{ref.path}: has no floating-point tensor to audit (dtypes: {dtypes})")
    theirs = [(o, _auditable(o, pattern)) for o in others]
    if intersect:
        common = [n for n in mine if all(n in t and t[n].shape == mine[n].shape for _, t in theirs)]
        skipped["not common"] = len(mine) - len(common)
        if not common:
            raise _nothing_common(ref, theirs, mine)
        return [mine[n] for n in common], skipped
    for other, t in theirs:
        _check_overlap(ref, mine, other)
        msg = _mismatch(ref, mine, other, t)
        if msg:
            raise DataError(f"{msg}; pass `intersect` to use only the common tensors")
    return list(mine.values()), skipped


def _pieces(t: TensorInfo, chunk: int) -> Iterator[Piece]:
    if t.numel == 0:  # an empty tensor contributes nothing
        return
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
    contiguous flat ranges along its outermost axis whose inner block fits the chunk
    (for a 1-D tensor, ranges of ``chunk`` elements). Empty tensors yield nothing.
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


def needs_torch(tensors: Sequence[TensorInfo], files: Sequence[FileInfo]) -> bool:
    """True when some file stores one of ``tensors`` in a dtype numpy cannot read (bf16, fp8)."""
    return any(f.tensors[t.name].dtype not in _NUMPY_DTYPES for f in files for t in tensors)


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
