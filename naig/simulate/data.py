"""Real text for the simulated training: bytes, split 90/10 or 80/10/10, sampled by seeded generators.

The default corpus is the ``.py`` files of the running Python's standard library
(``sysconfig.get_paths()["stdlib"]``), sorted recursively by relative path and
concatenated; nothing is ever downloaded.

Example:
    >>> import torch
    >>> data = ByteData.from_bytes(bytes(range(256)) * 10)
    >>> x, y = data.batch("train", 2, 8, torch.Generator().manual_seed(0))
    >>> x.shape, bool((x[:, 1:] == y[:, :-1]).all())
    (torch.Size([2, 8]), True)
"""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from naig.errors import DataError, UsageError
from naig.io import missing_reason

__all__ = ["SPLITS", "SPLITS_WITH_TEST", "stdlib_bytes", "load_bytes", "ByteData"]

SPLITS = (0.9, 0.1)  # train, validation
SPLITS_WITH_TEST = (0.8, 0.1, 0.1)  # train, validation, test (learning-rate tuning)


def stdlib_bytes(limit: int) -> bytes:
    """The first ``limit`` bytes of the stdlib's ``.py`` files, sorted recursively, concatenated."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = bytearray()
    for path in sorted(_stdlib_py_files(root), key=lambda p: p.relative_to(root).as_posix()):
        if len(out) >= limit:
            break
        try:
            out += path.read_bytes()
        except OSError:
            continue  # unreadable file (permissions): skip it
    return bytes(out[:limit])


_NOT_STDLIB = {"site-packages", "dist-packages", "__pycache__"}


def _stdlib_py_files(root: Path) -> list[Path]:
    """Every ``.py`` file under ``root``, skipping installed third-party packages."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in _NOT_STDLIB]  # prune in place
        found += [Path(folder) / f for f in files if f.endswith(".py")]
    return found


def load_bytes(path: str | Path | None, limit: int) -> bytes:
    """The corpus: the first ``limit`` bytes of ``path``, or of the stdlib when ``path`` is None.

    Raises:
        UsageError: if ``limit`` is not positive.
        DataError: if the file is missing or the corpus is too small to train on.
    """
    if limit <= 0:
        raise UsageError("must be positive, e.g. 2000000", field="data_bytes", value=limit)
    if path is None:
        return stdlib_bytes(limit)
    p = Path(path)
    if p.is_dir():
        raise DataError("is a directory; pass one text file, e.g. corpus.txt (concatenate "
                        "several files into one first)", field="data", value=str(p))
    if not p.exists():
        raise DataError(f"{missing_reason(p)}; pass an existing text file", field="data", value=str(p))
    if not p.is_file():
        raise DataError("is not a regular file (a pipe or a device); pass a text file", field="data",
                        value=str(p))
    limit = min(limit, p.stat().st_size)  # never ask read() for more than the file holds
    _check_memory(limit)
    try:
        with p.open("rb") as fh:
            raw = fh.read(limit)
    except OSError as exc:
        raise DataError(f"cannot be read ({exc.strerror or exc}); pass a readable text file", field="data",
                        value=str(p)) from None
    if not raw:
        raise DataError("is empty; pass a text file with at least a few KB of text", field="data",
                        value=str(p))
    return raw


BYTES_PER_BYTE = 9  # the text as bytes, then as int64 tensors (train, validation, test)


def _check_memory(size: int) -> None:
    """Refuse, before reading, a corpus whose tensors would not fit in memory (field ``data_bytes``)."""
    from naig.arrivals.engine import available_bytes

    need, free = BYTES_PER_BYTE * size, available_bytes()
    if free is not None and need > free:
        raise UsageError(f"the text of {size:,} bytes needs {need / 2**30:,.1f} GiB as tensors, more than "
                         f"the {free / 2**30:,.1f} GiB available; use a smaller `data_bytes`",
                         field="data_bytes", value=size)


@dataclass(frozen=True)
class ByteData:
    """A byte corpus split in order into train, validation and (optionally) test tensors.

    Without a test split the cut is 90/10 (train/validation); with one, 80/10/10, so that a
    learning rate chosen on validation is reported on data it never saw.

    Attributes:
        train: (N_train,) int64 bytes.
        val: (N_val,) int64 bytes.
        test: (N_test,) int64 bytes; empty without a test split.
    """

    train: Tensor
    val: Tensor
    test: Tensor

    @classmethod
    def from_bytes(cls, raw: bytes, device: str | torch.device = "cpu", test: bool = False) -> ByteData:
        """Split ``raw`` 90/10 (or 80/10/10 with ``test``) into tensors on ``device``."""
        data = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(device, torch.long)
        fractions = SPLITS_WITH_TEST if test else SPLITS
        cuts = [int(len(raw) * sum(fractions[:i + 1])) for i in range(len(fractions) - 1)]
        parts = list(data.tensor_split(cuts))
        return cls(*parts, *([data[:0]] if not test else []))

    def check(self, context: int) -> None:
        """Raise ``DataError`` unless every split in use holds more than ``context + 1`` bytes."""
        used = [self.train, self.val] + ([self.test] if len(self.test) else [])
        if min(len(p) for p in used) <= context + 1:
            raise DataError(
                f"corpus too small ({sum(len(p) for p in used)} bytes) for context "
                f"{context}; pass a larger `data` file or `data_bytes`"
            )

    def batch(self, split: str, batch: int, context: int,
              generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Random windows: inputs (B, T) and next-byte targets (B, T), int64.

        Args:
            split: ``"train"``, ``"val"`` or ``"test"``.
            batch: B windows.
            context: T bytes per window.
            generator: seeded generator on the data's device (the only randomness).
        """
        data = getattr(self, split)
        start = torch.randint(0, len(data) - context - 1, (batch, 1),
                              generator=generator, device=data.device)
        idx = start + torch.arange(context + 1, device=data.device)  # (B, T+1)
        window = data[idx]
        return window[:, :-1], window[:, 1:]
