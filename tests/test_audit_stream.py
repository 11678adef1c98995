"""Streaming reader: validation, planning, chunking (docs/design.md §6)."""

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from naig.audit.inputs import expand_inputs
from naig.audit.stream import RawReader, batches, inspect_file, locate, plan_tensors, read_pieces
from naig.errors import DataError, UsageError


def test_pieces_cover_every_tensor_exactly(tmp_path):
    t = {
        "a": torch.arange(3 * 5 * 7, dtype=torch.float32).reshape(3, 5, 7),
        "b": torch.arange(11, dtype=torch.float32),
        "c": torch.tensor(2.5),
    }
    save_file(t, tmp_path / "x.safetensors")
    info = inspect_file(tmp_path / "x.safetensors")
    plan, _ = plan_tensors(info, [])
    for chunk in (1, 4, 6, 36, 1000):
        got = {n: [] for n in t}
        for batch in batches(plan, chunk):
            assert sum(p.stop - p.start for p in batch) <= max(chunk, 7)
            for p, x in zip(batch, read_pieces(info.path, batch), strict=True):
                assert x.size == p.stop - p.start
                got[p.tensor.name].append((p.start, x))
        for n, parts in got.items():
            flat = np.concatenate([x for _, x in sorted(parts, key=lambda q: q[0])])
            np.testing.assert_array_equal(flat, t[n].reshape(-1).numpy())


FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)


@pytest.mark.parametrize(
    "dt", (torch.float64, torch.float32, torch.bfloat16, torch.float16, *FLOAT8, torch.float8_e8m0fnu)
)
def test_every_float_dtype_is_planned_and_read_exactly(tmp_path, dt):
    x = torch.tensor([1.5, -0.375, 3.0, 1e-3, 448.0, 0.0, 2.0**-9, -96.0])
    if dt == torch.float8_e8m0fnu:  # unsigned powers of two
        x = torch.tensor([1.0, 0.5, 2.0**-127, 2.0**127, 64.0])
    save_file({"x": x.to(dt)}, tmp_path / "lp.safetensors")
    info = inspect_file(tmp_path / "lp.safetensors")
    plan, skipped = plan_tensors(info, [])
    assert [t.name for t in plan] == ["x"] and skipped["other dtype"] == 0
    (batch,) = batches(plan, 100)
    (got,) = read_pieces(info.path, batch)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, x.to(dt).to(torch.float64).numpy())


def test_offsets_of_mixed_dtypes_and_ints(tmp_path):
    """Data located through safe_open's order and sizes, whatever dtypes come before a tensor."""
    g = torch.Generator().manual_seed(0)
    t = {
        "a16": torch.randn(7, generator=g).half(),
        "b_int": torch.arange(5, dtype=torch.int64),
        "c_mask": torch.tensor([True, False, True]),
        "d32": torch.randn(3, 11, generator=g),
        "e8": torch.randn(9, generator=g).to(torch.float8_e4m3fnuz),
        "f64": torch.randn(4, generator=g).double(),
        "gbf": torch.randn(13, generator=g).bfloat16(),
    }
    save_file(t, tmp_path / "m.safetensors")
    info = inspect_file(tmp_path / "m.safetensors")
    where = locate(info)
    assert set(where) == set(t)
    plan, _ = plan_tensors(info, [])
    for batch in batches(plan, 5):
        for p, x in zip(batch, read_pieces(info.path, batch), strict=True):
            want = t[p.tensor.name].reshape(-1)[p.start : p.stop].to(torch.float64).numpy()
            np.testing.assert_array_equal(x, want)


def test_unaligned_tensor_data_is_read(tmp_path):
    """A valid file whose float32 data starts at an odd offset (other writers do not pad)."""
    import json
    import struct

    a = np.array([1.5, -2.25, 3.0], dtype=np.float16)  # 6 bytes
    b = np.arange(5, dtype=np.float32) / 3
    header = json.dumps({"a": {"dtype": "F16", "shape": [3], "data_offsets": [0, 6]},
                         "b": {"dtype": "F32", "shape": [5], "data_offsets": [6, 26]}}).encode()
    header += b" " * (1 - len(header) % 2)  # odd length: the data section starts at an odd offset
    p = tmp_path / "odd.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header + a.tobytes() + b.tobytes())
    info = inspect_file(p)
    assert locate(info)["b"].offset % 4 != 0
    plan, _ = plan_tensors(info, [])
    (batch,) = batches(plan, 100)
    got = dict(zip([q.tensor.name for q in batch], read_pieces(p, batch), strict=True))
    np.testing.assert_array_equal(got["a"], a.astype(np.float64))
    np.testing.assert_array_equal(got["b"], b.astype(np.float64))


def test_raw_reader_refuses_a_file_changed_since_located(tmp_path):
    p = tmp_path / "x.safetensors"
    save_file({"w": torch.ones(4)}, p)
    where = locate(inspect_file(p))["w"]
    save_file({"w": torch.ones(8)}, p)  # rewritten with another size
    with RawReader() as r, pytest.raises(DataError, match="x.safetensors: truncated or changed"):
        r.view(where, 0, 4)


def test_keys_filter_and_bad_regex(tmp_path):
    save_file({"enc.w": torch.ones(3), "dec.w": torch.ones(3)}, tmp_path / "x.safetensors")
    info = inspect_file(tmp_path / "x.safetensors")
    plan, skipped = plan_tensors(info, [info], keys="^enc")
    assert [t.name for t in plan] == ["enc.w"] and skipped["keys"] == 1
    with pytest.raises(UsageError, match="keys='\\(': not a valid regular expression"):
        plan_tensors(info, [info], keys="(")
    with pytest.raises(UsageError, match="keys='nothing': matches no floating-point tensor"):
        plan_tensors(info, [info], keys="nothing")


def test_mismatch_and_intersect(tmp_path):
    save_file({"a": torch.ones(3), "b": torch.ones(2)}, tmp_path / "r.safetensors")
    save_file({"a": torch.ones(3), "b": torch.ones(5)}, tmp_path / "s.safetensors")
    save_file({"a": torch.ones(3)}, tmp_path / "m.safetensors")
    r, s, m = (inspect_file(tmp_path / f"{n}.safetensors") for n in "rsm")
    with pytest.raises(DataError, match=r"shape \[5\], expected \[2\].*`intersect`"):
        plan_tensors(r, [s])
    with pytest.raises(DataError, match="'b'.*missing.*`intersect`"):
        plan_tensors(r, [m])
    with pytest.raises(DataError, match="'b' is not in the reference"):
        plan_tensors(m, [r])
    plan, skipped = plan_tensors(r, [s, m], intersect=True)
    assert [t.name for t in plan] == ["a"] and skipped["not common"] == 1


def test_expand_inputs_sorted_and_empty_dir(tmp_path):
    for n in ("b", "a"):
        save_file({"x": torch.ones(1)}, tmp_path / f"{n}.safetensors")
    assert [p.name for p in expand_inputs([tmp_path])] == ["a.safetensors", "b.safetensors"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no \\*.safetensors"):
        expand_inputs([tmp_path / "empty"])


def test_int_bool_and_other_dtypes_skipped_in_any_file(tmp_path):
    save_file(
        {
            "w": torch.ones(3),
            "n": torch.ones(3, dtype=torch.int64),
            "c": torch.ones(2, dtype=torch.complex64),
        },
        tmp_path / "x.safetensors",
    )
    save_file({"w": torch.ones(3), "extra_mask": torch.ones(2, dtype=torch.bool)}, tmp_path / "y.safetensors")
    info, other = inspect_file(tmp_path / "x.safetensors"), inspect_file(tmp_path / "y.safetensors")
    plan, skipped = plan_tensors(info, [other])  # int/bool present in one file only: still skipped
    assert [t.name for t in plan] == ["w"]
    assert skipped["int/bool"] == 1 and skipped["other dtype"] == 1


def test_float_in_reference_but_int_in_worker_is_named(tmp_path):
    save_file({"w": torch.ones(3)}, tmp_path / "r.safetensors")
    save_file({"w": torch.ones(3, dtype=torch.int32)}, tmp_path / "i.safetensors")
    r, i = inspect_file(tmp_path / "r.safetensors"), inspect_file(tmp_path / "i.safetensors")
    with pytest.raises(DataError, match="i.safetensors: tensor 'w' has dtype I32 here, a float dtype in the "
                                        "reference r.safetensors"):
        plan_tensors(r, [i])


def test_int_in_reference_but_float_in_worker_is_named(tmp_path):
    save_file({"w": torch.ones(3, dtype=torch.int8), "b": torch.ones(2)}, tmp_path / "r.safetensors")
    save_file({"w": torch.ones(3), "b": torch.ones(2)}, tmp_path / "f.safetensors")
    r, f = inspect_file(tmp_path / "r.safetensors"), inspect_file(tmp_path / "f.safetensors")
    with pytest.raises(DataError, match="f.safetensors: tensor 'w' has dtype I8 in the reference "
                                        "r.safetensors, a float dtype here"):
        plan_tensors(r, [f])


def test_no_float_tensor_names_the_reference(tmp_path):
    save_file({"n": torch.ones(3, dtype=torch.int64)}, tmp_path / "r.safetensors")
    r = inspect_file(tmp_path / "r.safetensors")
    with pytest.raises(DataError, match="r.safetensors: has no floating-point tensor"):
        plan_tensors(r, [r])


def test_empty_tensor_contributes_nothing(tmp_path):
    save_file({"e": torch.ones(0, 5), "w": torch.ones(4)}, tmp_path / "x.safetensors")
    info = inspect_file(tmp_path / "x.safetensors")
    plan, _ = plan_tensors(info, [info])
    assert [p.tensor.name for b in batches(plan, 100) for p in b] == ["w"]


def test_valid_file_whose_header_length_looks_like_pickle(tmp_path):
    """The 8-byte header length may start with 0x80; only a missing '{' means not safetensors."""
    p = tmp_path / "x.safetensors"
    for pad in range(256):
        save_file({"w" * (1 + pad): torch.ones(2)}, p)
        if p.read_bytes()[:1] == b"\x80":
            break
    assert p.read_bytes()[:1] == b"\x80"
    assert list(inspect_file(p).tensors) == ["w" * (1 + pad)]


def test_nothing_in_common_names_the_files_and_the_prefix(tmp_path):
    plain = {"layer.weight": torch.ones(2, 3), "layer.bias": torch.ones(3)}
    save_file(plain, tmp_path / "r.safetensors")
    save_file({"module." + k: v for k, v in plain.items()}, tmp_path / "ddp.safetensors")
    save_file({"model." + k: v for k, v in plain.items()}, tmp_path / "hf.safetensors")
    save_file({"other": torch.ones(3)}, tmp_path / "o.safetensors")
    save_file({"layer.weight": torch.ones(3, 2), "layer.bias": torch.ones(2)}, tmp_path / "t.safetensors")
    r, ddp, hf, o, t = (inspect_file(tmp_path / f"{n}.safetensors") for n in ("r", "ddp", "hf", "o", "t"))
    with pytest.raises(DataError) as err:
        plan_tensors(r, [ddp, o, t], intersect=True)
    msg = str(err.value)
    assert msg.startswith(f"no floating-point tensor is common to the reference {r.path} and every worker")
    assert f"{ddp.path} shares no tensor name with it; its names carry the prefix 'module.'" in msg
    assert f"{o.path} shares no tensor name with it" in msg and f"{t.path} has 2 of its names" in msg
    with pytest.raises(DataError, match=r"hf.safetensors: shares no tensor name .* prefix 'model.'"):
        plan_tensors(r, [hf])  # without intersect, too
    with pytest.raises(DataError, match=r"the reference's names carry the prefix 'module.' that its names"):
        plan_tensors(ddp, [r])
    with pytest.raises(DataError, match="o.safetensors: shares no tensor name .*compare files of the same"):
        plan_tensors(r, [o])
