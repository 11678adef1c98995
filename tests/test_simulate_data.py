"""Corpus loading and seeded batches (naig.data)."""

import sysconfig
from pathlib import Path

import pytest
import torch

from naig.errors import DataError, UsageError
from naig.simulate.data import ByteData, load_bytes, stdlib_bytes


def test_stdlib_bytes_are_the_sorted_py_files() -> None:
    raw = stdlib_bytes(50_000)
    root = Path(sysconfig.get_paths()["stdlib"])
    first = sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix())[0]
    assert len(raw) == 50_000
    assert raw.startswith(first.read_bytes()[:1000])
    assert stdlib_bytes(50_000) == raw


def test_load_bytes_from_file(tmp_path: Path) -> None:
    f = tmp_path / "t.txt"
    f.write_bytes(b"hello world" * 10)
    assert load_bytes(f, 5) == b"hello"
    with pytest.raises(DataError, match="no such file"):
        load_bytes(tmp_path / "missing.txt", 10)
    with pytest.raises(UsageError, match="data_bytes=0"):
        load_bytes(None, 0)
    with pytest.raises(DataError, match="is a directory; pass one text file"):
        load_bytes(tmp_path, 10)


def test_split_is_90_10() -> None:
    data = ByteData.from_bytes(bytes(range(100)) * 10)
    assert (len(data.train), len(data.val)) == (900, 100)
    assert data.train.dtype == torch.long and int(data.val[0]) == 0


def test_batches_are_seeded_and_shifted() -> None:
    data = ByteData.from_bytes(stdlib_bytes(20_000))
    x1, y1 = data.batch("train", 4, 16, torch.Generator().manual_seed(0))
    x2, y2 = data.batch("train", 4, 16, torch.Generator().manual_seed(0))
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert x1.shape == y1.shape == (4, 16)
    assert torch.equal(x1[:, 1:], y1[:, :-1])


def test_too_small_corpus_is_a_data_error() -> None:
    with pytest.raises(DataError, match="too small"):
        ByteData.from_bytes(b"x" * 50).check(64)
