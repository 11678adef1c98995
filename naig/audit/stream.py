"""Stream safetensors files chunk by chunk, bounded in memory (docs/design.md §6).

Files are validated with ``safetensors.safe_open``; the audit then reads the stored
bits of each piece with positional reads (``RawReader``) from files closed after each
batch of work, so resident memory is bounded by the chunk size, not by model size or the
number of files. Pickle formats are refused without being opened.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from naig.errors import DataError, UsageError
from naig.io import missing_reason
from naig.sketch.kernels import DTYPES, ITEMSIZE

__all__ = [
    "FLOAT_DTYPES",
    "TensorInfo",
    "FileInfo",
    "Piece",
    "inspect_file",
    "plan_tensors",
    "batches",
    "TensorData",
    "locate",
    "RawReader",
    "read_pieces",
]

FLOAT_DTYPES = set(DTYPES)  # every float dtype the sketch kernels read: F64 … F8_E4M3FNUZ, F8_E8M0
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
        return "is empty (0 bytes)"  # (1 to 7 bytes: ``_invalid`` says it may be another kind of file)
    if n > _MAX_HEADER:
        return None
    if 8 + n > size:
        return f"is truncated inside its header ({size:,} bytes; the header alone needs {8 + n:,})"
    try:
        need = 8 + n + _data_end(header)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
        return None  # a header nested too deeply (hostile) is refused as invalid, not measured
    return f"is truncated ({size:,} bytes; its header describes {need:,})" if need > size else None


def _invalid(p: Path, exc: Exception) -> DataError:
    """The one-line error for a file safetensors refused."""
    size = p.stat().st_size
    if 0 < size < 8:  # too short to tell a cut-short safetensors file from another kind of file
        return DataError(f"{p}: has {size} bytes, fewer than the 8 of a safetensors file's header length: "
                         "an incomplete file (an interrupted write, copy or download) or not a safetensors "
                         "file; write or copy it again")
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
        raise DataError(f"{p}: {missing_reason(p)}; check the path")
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
    if not other.tensors:
        return f"{other.path} holds no tensor"
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
    if not other.tensors:
        raise DataError(f"{other.path}: holds no tensor (an empty safetensors file); save the worker's "
                        "gradient or weights into it")
    if not any(n in other.tensors for n in mine):
        hint = _prefix_hint(mine, other.tensors) or "; compare files of the same model"
        raise DataError(f"{other.path}: shares no tensor name with the reference {ref.path.name}{hint}")


def _mismatch(ref: FileInfo, mine: dict, other: FileInfo, theirs: dict) -> str | None:
    for n in mine:
        if n not in theirs:
            if n in other.tensors:  # there, but not a floating-point tensor
                return (f"{other.path}: tensor {n!r} has dtype {other.tensors[n].dtype} here, a float dtype "
                        f"in the reference {ref.path.name}")
            return f"{other.path}: tensor {n!r} of the reference {ref.path.name} is missing"
        if mine[n].shape != theirs[n].shape:
            got, want = list(theirs[n].shape), list(mine[n].shape)
            return f"{other.path}: tensor {n!r} has shape {got}, expected {want}"
    extra = next((n for n in theirs if n not in mine), None)
    if extra is None:
        return None
    if extra in ref.tensors:  # there, but not a floating-point tensor
        return (f"{other.path}: tensor {extra!r} has dtype {ref.tensors[extra].dtype} in the reference "
                f"{ref.path.name}, a float dtype here")
    return f"{other.path}: tensor {extra!r} is not in the reference {ref.path.name}"


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
        if not ref.tensors:
            raise DataError(f"{ref.path}: holds no tensor (an empty safetensors file); pass a reference "
                            "holding the float tensors to audit")
        dtypes = ", ".join(sorted({t.dtype for t in ref.tensors.values()}))
        raise DataError(f"{ref.path}: has no floating-point tensor to audit (its dtypes: {dtypes}); pass "
                        "gradients or weights saved as float tensors")
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


# Bits per scalar of every dtype safetensors stores (its Dtype::bitsize): a tensor's stored size
# is numel × bits / 8. Used to locate tensor data, so int/bool/complex/sub-byte entries count too.
_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "I16": 16, "U16": 16, "I32": 32, "U32": 32, "I64": 64, "U64": 64,
         "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6} | {k: 8 * v for k, v in ITEMSIZE.items()}


@dataclass(frozen=True)
class TensorData:
    """Where the stored bytes of one tensor are: file, absolute byte offset, dtype, file size."""

    path: Path
    offset: int  # byte offset of the tensor's first scalar in the file
    dtype: str  # safetensors dtype string, e.g. "BF16"
    file_size: int  # size of the file the offset was derived for (a changed file is refused)
    file_id: tuple[int, int, int] = (0, 0, 0)  # (device, inode, mtime ns) then; (0, 0, 0): not checked


def locate(info: FileInfo) -> dict[str, TensorData]:
    """Byte offsets of the tensors of a file (or of each shard of a checkpoint), derived from
    what ``safe_open`` validated.

    On open, safetensors checks that the tensors, in the order ``offset_keys()`` gives,
    tile the data section without gaps, each taking numel × bits / 8 bytes, and end
    exactly at the end of the file. So the data section starts at the file size minus
    the sum of the tensor sizes, and each tensor where the ones before it end. No header
    is parsed here.

    Args:
        info: a file validated by ``inspect_file``, or a checkpoint by ``inspect_input``
            (its tensors are located in the shard files that hold them).

    Returns:
        {tensor name: ``TensorData``} for every tensor of the file (of every shard).

    Raises:
        DataError: the file no longer opens (it changed since ``inspect_file``), or it
            holds a dtype this table does not know (its size is then unknown).
    """
    if not info.shards:
        return _locate_file(info.path)
    by_shard: dict[Path, list[str]] = {}
    for n in info.tensors:
        by_shard.setdefault(info.file_of(n), []).append(n)
    out: dict[str, TensorData] = {}
    for path, names in by_shard.items():
        here = _locate_file(path)
        # only the tensors the index places in this shard: another shard may hold a stale or tied
        # copy under the same name, which the index does not point to
        out.update({n: here[n] for n in names if n in here})
    return out


def _locate_file(path: Path) -> dict[str, TensorData]:
    layout, st = _layout(path)
    unknown = next((f"tensor {n!r} has dtype {dt}" for n, dt, _ in layout if dt not in _BITS), None)
    if unknown:
        raise DataError(f"{path}: {unknown}, unknown to this naig, so no tensor can be located; "
                        "upgrade naig")
    pos = st.st_size - sum(numel * _BITS[dt] // 8 for _, dt, numel in layout)
    out = {}
    for n, dt, numel in layout:
        out[n] = TensorData(path, pos, dt, st.st_size, _file_version(st))
        pos += numel * _BITS[dt] // 8
    return out


def _file_version(st: os.stat_result) -> tuple[int, int, int]:
    """What tells one version of a file from another: device, inode and modification time."""
    return st.st_dev, st.st_ino, st.st_mtime_ns


def _layout(path: Path) -> tuple[list[tuple[str, str, int]], os.stat_result]:
    """([(name, dtype, numel)] in offset order, the file's stat), through ``safe_open``.

    The file is stat'ed before and after it is read: a layout is only returned for a file
    that did not change in between.
    """
    from safetensors import safe_open

    try:
        before = path.stat()
        with safe_open(str(path), framework="numpy") as f:
            slices = [(n, f.get_slice(n)) for n in f.offset_keys()]
            layout = [(n, sl.get_dtype(), math.prod(sl.get_shape())) for n, sl in slices]
        after = path.stat()
        if (_file_version(before), before.st_size) != (_file_version(after), after.st_size):
            raise OSError("it changed while its header was read")
        return layout, after
    except Exception as exc:  # SafetensorError, OSError: one line
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"{path}: could not be read again ({why}); was it changed?") from None


def _changed(where: TensorData, now: int | None = None) -> DataError:
    sizes = "" if now is None else f" ({where.file_size} bytes, now {now})"
    return DataError(f"{where.path}: truncated or changed while being audited{sizes}; make sure nothing "
                     "is still writing it, then run again")


class RawReader:
    """The stored bytes of tensor pieces, read with positional reads (``os.preadv``) from files
    opened once and closed by ``close()``. Use as a context manager; threads may share one.

    Positional reads instead of memory maps: a file truncated while the audit reads it gives a
    short read, reported in one line, where a memory map would kill the process with SIGBUS.
    A file is opened once and read through that descriptor, so a file replaced by a rename
    mid-audit is audited as it was when opened; ``check_unchanged`` catches one rewritten in
    place (its modification time moves). The bytes land in a fresh uint8 buffer (no
    conversion: the kernels decode the stored bits).

    Example:
        >>> import tempfile, torch
        >>> from safetensors.torch import save_file
        >>> tmp = tempfile.TemporaryDirectory()
        >>> path = tmp.name + "/x.safetensors"
        >>> save_file({"w": torch.tensor([1.5, -2.0], dtype=torch.bfloat16)}, path)
        >>> where = locate(inspect_file(path))["w"]
        >>> with RawReader() as r:
        ...     r.view(where, 0, 2).view(np.uint16).tolist()  # the stored bfloat16 bits
        [16320, 49152]
        >>> tmp.cleanup()
    """

    def __init__(self) -> None:
        self._fds: dict[Path, tuple[int, TensorData]] = {}  # path → (fd, where it was located)
        self._lock = threading.Lock()

    def view(self, where: TensorData, start: int, stop: int) -> np.ndarray:
        """uint8 array of the stored bytes of flat scalars ``start .. stop−1`` of a tensor.

        Raises:
            DataError: the file changed since its offsets were derived, or it was cut
                while being read.
        """
        fd = self.fd(where)
        size = ITEMSIZE[where.dtype]
        out = np.empty((stop - start) * size, np.uint8)
        got = os.preadv(fd, [out], where.offset + start * size) if out.size else 0
        if got != out.size:
            raise _changed(where, os.fstat(fd).st_size)
        return out

    def fd(self, where: TensorData) -> int:
        """The open file descriptor of a tensor's file (opened, and checked, once).

        Raises:
            DataError: the file changed since its offsets were derived (size, or identity
                when ``where`` records one), or the process may open no more files.
        """
        with self._lock:
            entry = self._fds.get(where.path)
            if entry is None:
                entry = self._fds[where.path] = (self._open(where), where)
            return entry[0]

    def short_read(self, where: TensorData) -> DataError:
        """The error for a tensor whose file ended before its bytes did."""
        return _changed(where, os.fstat(self.fd(where)).st_size)

    def check_unchanged(self) -> None:
        """Raise ``DataError`` for a file rewritten in place since it was located (the audit
        calls this after its last read: the numbers could mix two versions of the file)."""
        with self._lock:
            for fd, where in self._fds.values():
                st = os.fstat(fd)
                if where.file_id != (0, 0, 0) and _file_version(st) != where.file_id:
                    raise _changed(where)

    def _open(self, where: TensorData) -> int:
        try:
            fd = os.open(where.path, os.O_RDONLY)
        except OSError as exc:
            if exc.errno == errno.EMFILE:
                raise DataError(f"{where.path}: cannot be opened: this process may open no more files "
                                f"({len(self._fds)} open); raise the limit (ulimit -n) or audit fewer files "
                                "at once") from None
            raise DataError(f"{where.path}: cannot be opened ({exc.strerror})") from None
        st = os.fstat(fd)
        if st.st_size != where.file_size or where.file_id not in ((0, 0, 0), _file_version(st)):
            os.close(fd)
            raise _changed(where, st.st_size if st.st_size != where.file_size else None)
        return fd

    def close(self) -> None:
        """Close every file."""
        with self._lock:
            for fd, _ in self._fds.values():
                os.close(fd)
            self._fds.clear()

    def __enter__(self) -> RawReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_pieces(path: str | os.PathLike[str], pieces: Sequence[Piece]) -> Iterator[np.ndarray]:
    """Read pieces of one file; yields flat float64 arrays (an exact upcast of every dtype).

    The audit reads the stored bits directly (``RawReader`` and the sketch kernels); this
    is the readable form of the same read, for tests and tools.

    Args:
        path: a safetensors file.
        pieces: pieces to read, in order.

    Raises:
        DataError: as ``inspect_file``, or a tensor the file does not hold.
    """
    from naig.sketch.kernels import decode

    where = locate(inspect_file(path))
    with RawReader() as r:
        for p in pieces:
            w = where.get(p.tensor.name)
            if w is None:
                raise DataError(f"{path}: has no tensor {p.tensor.name!r} of a readable dtype")
            yield decode(r.view(w, p.start, p.stop), w.dtype)
