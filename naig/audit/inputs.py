"""What the audit reads: single safetensors files and sharded checkpoints (docs/design.md §6).

A sharded checkpoint, as model repositories ship it, is a folder with
``model-00001-of-00002.safetensors``, ``model-00002-of-00002.safetensors`` and
``model.safetensors.index.json`` (``{"metadata": {...}, "weight_map": {tensor: shard}}``).
It is **one** checkpoint, as reference or as worker, named either by its index file or
by the folder that holds it. The rule that tells folders apart: a folder holding a
``*.safetensors.index.json`` is one checkpoint; any other folder means every
``*.safetensors`` in it (one worker each; its sub-folders too when ``recursive``).

The audit reads a checkpoint's tensors from the shards that hold them (``stream.locate``);
a file truncated or replaced while the audit runs is refused in one line naming it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from naig.audit.stream import FileInfo, TensorInfo, inspect_file
from naig.errors import DataError, UsageError

__all__ = ["INDEX_SUFFIX", "find_index", "expand_inputs", "inspect_input", "inspect_index"]

INDEX_SUFFIX = ".safetensors.index.json"


def find_index(folder: Path) -> Path | None:
    """The ``*.safetensors.index.json`` of a folder, if it holds one.

    Raises:
        DataError: the folder holds several index files (name the one to use).
    """
    found = sorted(p for p in folder.glob("*" + INDEX_SUFFIX) if p.is_file())
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise DataError(f"{folder}: holds {len(found)} checkpoint indexes ({names}); pass one index file")
    return found[0] if found else None


def _walk(folder: Path, recursive: bool) -> list[Path]:
    """A folder's inputs: its index file, or its ``*.safetensors`` (and sub-folders'), sorted by name."""
    index = find_index(folder)
    if index is not None:
        return [index]
    out: list[Path] = []
    for p in sorted(folder.iterdir()):
        if p.is_file() and p.name.endswith(".safetensors"):
            out.append(p)
        elif recursive and p.is_dir() and not p.is_symlink():
            out.extend(_walk(p, True))
    return out


def _has_subfolders(folder: Path) -> bool:
    return any(p.is_dir() for p in folder.iterdir())


def expand_inputs(paths: Sequence[str | os.PathLike[str]], recursive: bool = False) -> list[Path]:
    """Expand folder arguments into the inputs they hold.

    Args:
        paths: files, index files or folders, in the order given.
        recursive: also walk sub-folders (depth first, sorted by name); a sub-folder
            holding an index is one checkpoint and is not entered.

    Returns:
        Paths in argument order: a folder holding a ``*.safetensors.index.json`` becomes
        that index (one checkpoint); any other folder becomes its ``*.safetensors`` files,
        sorted. Other paths pass through unchecked (``inspect_input`` validates them).

    Raises:
        UsageError: ``recursive`` with no folder among ``paths`` (it would do nothing).
        DataError: a folder with nothing to audit (the message says when ``recursive``
            would find files in its sub-folders).
    """
    if recursive and not any(Path(raw).is_dir() for raw in paths):
        raise UsageError("walks folders, and no input is a folder; drop it or pass a folder",
                         field="recursive", value=True)
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if not p.is_dir():
            out.append(p)
            continue
        found = _walk(p, recursive)
        if not found:
            deeper = not recursive and _has_subfolders(p)
            hint = "pass `recursive` to look in its sub-folders" if deeper else "pass files instead"
            raise DataError(f"{p}: directory has no *.safetensors files; {hint}")
        out.extend(found)
    return out


def _load_index(index: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The ``weight_map`` and the ``metadata`` (as strings) of an index file, validated."""
    try:
        doc = json.loads(index.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested thousands deep
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"{index}: not a readable checkpoint index ({reason}); it must be JSON") from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise DataError(f"{index}: has no \"weight_map\" of tensor names to shard files; "
                        "it is not a sharded safetensors checkpoint index")
    outside = next((v for v in weight_map.values() if v in ("", ".", "..") or Path(v).name != v), None)
    if outside is not None:  # "../x" or "/abs/x" would read a file outside the checkpoint's folder
        raise DataError(f"{index}: shard {outside!r} is not a file name in the index's folder; a checkpoint "
                        "index names its shards beside it")
    meta = doc.get("metadata")
    return weight_map, {str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else {}


def _common_metadata(shards: list[FileInfo]) -> dict[str, str]:
    """Metadata every shard carries with the same value (lag, step, format, ...)."""
    first = shards[0].metadata
    return {k: v for k, v in first.items() if all(s.metadata.get(k) == v for s in shards[1:])}


def inspect_index(index: str | os.PathLike[str]) -> FileInfo:
    """Validate a sharded checkpoint and read its shards' headers (not their data).

    Args:
        index: a ``*.safetensors.index.json`` file.

    Returns:
        One ``FileInfo`` for the whole checkpoint: ``path`` is the index, ``tensors``
        are those of the ``weight_map`` in shard order (shards sorted by name, file order
        within a shard), ``shards`` maps each tensor to its file, ``metadata`` is the
        index's ``metadata`` plus what every shard's metadata agrees on, ``nbytes`` the
        shards' total size.

    Raises:
        DataError: an unreadable index, a missing or invalid shard, or a tensor the index
            lists that its shard does not hold.
    """
    index = Path(index)
    weight_map, index_meta = _load_index(index)
    names = sorted(set(weight_map.values()))
    shards = {n: inspect_file(index.parent / n) for n in names}
    tensors: dict[str, TensorInfo] = {}
    where: dict[str, Path] = {}
    for shard_name, info in shards.items():
        for t in info.tensors.values():
            if weight_map.get(t.name) == shard_name:
                tensors[t.name], where[t.name] = t, info.path
    missing = next((n for n in weight_map if n not in tensors), None)
    if missing is not None:
        raise DataError(f"{index}: tensor {missing!r} is listed in shard {weight_map[missing]} "
                        "but that file does not hold it; the checkpoint is incomplete")
    meta = {**_common_metadata(list(shards.values())), **index_meta}
    nbytes = sum(s.nbytes for s in shards.values())
    return FileInfo(index, tensors, dict(sorted(meta.items())), nbytes, shards=where)


def inspect_input(path: str | os.PathLike[str]) -> FileInfo:
    """A single ``.safetensors`` file, an index file, or a folder holding an index, as one ``FileInfo``.

    Raises:
        DataError: see ``inspect_file`` and ``inspect_index``; a folder without an index.
    """
    p = Path(path)
    if p.is_dir():
        index = find_index(p)
        if index is None:
            raise DataError(f"{p}: is a folder without a *{INDEX_SUFFIX}, not one checkpoint; "
                            "pass a file or a sharded checkpoint")
        p = index
    return inspect_index(p) if p.name.endswith(INDEX_SUFFIX) else inspect_file(p)
