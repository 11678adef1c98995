"""Compiled and numpy chunk kernels agree with the reference sketch in float64, for every dtype."""

import os

import numpy as np
import pytest
import torch

from naig.sketch import TensorHash, kernels, sketch_reference, tensor_key
from naig.sketch.kernels import DTYPES, STATS, accumulate, decode, hash_codes

paths = [False] + ([True] if kernels.HAVE_COMPILED else [])
TORCH = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
    "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
    "F8_E8M0": torch.float8_e8m0fnu,
}
BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def stored(values: torch.Tensor, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(raw stored bits as a numpy array, exact float64 values) of ``values`` cast to ``dtype``."""
    t = values.to(TORCH[dtype])
    raw = t.view(BITS[t.element_size()]).numpy()
    return raw, t.to(torch.float64).numpy()


def exact_stats(x: np.ndarray, r: np.ndarray) -> list[float]:
    d = x - r
    return [x @ r, x @ x, d @ d, (d * d) @ (d * d)]


def test_dtype_table_covers_torch():
    assert set(TORCH) == set(DTYPES)


@pytest.mark.parametrize("compiled", paths)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_decode_every_bit_pattern_like_torch(compiled, dtype):
    size = torch.empty(0, dtype=TORCH[dtype]).element_size()
    n = 256 ** min(size, 2)
    bits = np.arange(n, dtype=np.uint64).astype({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[size])
    if size > 2:  # f32/f64: every 16-bit pattern in the top bits, plus random patterns
        rng = np.random.default_rng(0)
        top = bits.astype(np.uint64) << np.uint64(8 * size - 16)
        bits = np.concatenate([top, rng.integers(0, 2 ** (8 * size - 1), 5000, dtype=np.uint64)])
        bits = bits.astype({4: np.uint32, 8: np.uint64}[size])
    want = torch.from_numpy(bits.view({1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}[size]).copy())
    want = want.view(TORCH[dtype]).to(torch.float64).numpy()
    got = decode(bits, dtype, compiled=compiled)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok], want[ok])
    np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(want[ok]))  # -0.0 stays -0.0


@pytest.mark.parametrize("compiled", paths)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("m", [0, 1, 3, 1001])
def test_every_dtype_equals_the_float64_reference(compiled, dtype, m):
    g = torch.Generator().manual_seed(m)
    base = torch.randn(m, generator=g, dtype=torch.float64) * 4
    if dtype == "F8_E8M0":  # unsigned powers of two
        base = base.abs() + 0.5
    x_raw, x64 = stored(base, dtype)
    r_raw, r64 = stored(base.flip(0), dtype)
    key = tensor_key(5, "t")
    out = np.zeros(STATS)
    accumulate(hash_codes(key, 0, m, compiled=compiled), r_raw, x_raw, out, compiled=compiled,
               ref_dtype=dtype, x_dtype=dtype)
    np.testing.assert_allclose(out[:14], sketch_reference({"t": x64}, seed=5), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out[14:], exact_stats(x64, r64), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("compiled", paths)
@pytest.mark.parametrize(
    "rdt,xdt", [("F64", "BF16"), ("BF16", "F32"), ("F16", "F8_E5M2FNUZ"), ("F32", "F8_E4M3")]
)
def test_mixed_dtype_pairs(compiled, rdt, xdt):
    g = torch.Generator().manual_seed(1)
    base = torch.randn(517, generator=g, dtype=torch.float64)
    r_raw, r64 = stored(base, rdt)
    x_raw, x64 = stored(base * 1.1 + 0.01, xdt)
    out = np.zeros(STATS)
    accumulate(hash_codes(tensor_key(0, "t"), 0, 517, compiled=compiled), r_raw, x_raw, out,
               compiled=compiled, ref_dtype=rdt, x_dtype=xdt)
    np.testing.assert_allclose(out[:14], sketch_reference({"t": x64}, seed=0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out[14:], exact_stats(x64, r64), rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(not kernels.HAVE_COMPILED, reason="compiled kernel not built")
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_compiled_sum_order_does_not_depend_on_the_dtype(dtype):
    """Stored bits and their float64 upcast give bit-identical sums (one order for every dtype)."""
    g = torch.Generator().manual_seed(2)
    base = torch.randn(100_003, generator=g, dtype=torch.float64)
    if dtype == "F8_E8M0":
        base = base.abs() + 0.25
    x_raw, x64 = stored(base, dtype)
    r_raw, r64 = stored(base.flip(0), dtype)
    codes = hash_codes(99, 7, x64.size)
    a, b = np.zeros(STATS), np.zeros(STATS)
    accumulate(codes, r_raw, x_raw, a, ref_dtype=dtype, x_dtype=dtype)
    accumulate(codes, r64, x64, b)
    np.testing.assert_array_equal(a, b)
    own, up = np.zeros(STATS), np.zeros(STATS)  # a chunk against itself (the reference's row)
    accumulate(codes, x_raw, x_raw, own, ref_dtype=dtype, x_dtype=dtype)
    accumulate(codes, x64, x64, up)
    np.testing.assert_array_equal(own, up)


@pytest.mark.parametrize("compiled", paths)
@pytest.mark.parametrize("dtype", [d for d in DTYPES if d not in ("F32", "F64")])
def test_every_bit_pattern_through_the_fused_pass(compiled, dtype):
    """Each 8- and 16-bit pattern read in place gives the sums of its exact float64 value."""
    size = torch.empty(0, dtype=TORCH[dtype]).element_size()
    bits = np.arange(256**size, dtype=np.uint16 if size == 2 else np.uint8)
    values = decode(bits, dtype, compiled=False)
    finite = bits[~np.isnan(values)]
    x = np.random.default_rng(4).permutation(finite)
    r = np.roll(x, 5)
    codes = hash_codes(3, 0, x.size, compiled=compiled)
    got, want = np.zeros(STATS), np.zeros(STATS)
    accumulate(codes, r, x, got, compiled=compiled, ref_dtype=dtype, x_dtype=dtype)
    accumulate(codes, decode(r, dtype), decode(x, dtype), want, compiled=compiled)
    np.testing.assert_array_equal(got, want)
    own, own64 = np.zeros(STATS), np.zeros(STATS)  # the reference's own row
    accumulate(codes, x, x, own, compiled=compiled, ref_dtype=dtype, x_dtype=dtype)
    x64 = decode(x, dtype)
    accumulate(codes, x64, x64, own64, compiled=compiled)
    np.testing.assert_array_equal(own, own64)
    for b in bits[np.isnan(values)][:64]:  # NaN patterns poison the sums they enter
        out = np.zeros(STATS)
        accumulate(np.zeros(8, np.uint8), np.zeros(8, bits.dtype), np.full(8, b), out, compiled=compiled,
                   ref_dtype=dtype, x_dtype=dtype)
        assert np.isnan(out[0]) and np.isnan(out[15]), (dtype, hex(b))


@pytest.mark.parametrize("compiled", paths)
def test_several_seeds_in_one_pass_equal_one_pass_each(compiled):
    rng = np.random.default_rng(3)
    x, r = rng.normal(size=(2, 1027)).astype(np.float32)
    codes = [hash_codes(tensor_key(s, "w"), 0, x.size, compiled=compiled) for s in range(3)]
    many = np.zeros((3, STATS))
    accumulate(codes, r, x, many, compiled=compiled)
    for s in range(3):
        one = np.zeros(STATS)
        accumulate(codes[s], r, x, one, compiled=compiled)
        np.testing.assert_array_equal(many[s], one)


@pytest.mark.parametrize("compiled", paths)
def test_codes_match_tensor_hash_at_offsets(compiled):
    key = tensor_key(0, "w")
    h = TensorHash.build(0, "w", 1000, 1500)
    codes = hash_codes(key, 1000, 500, compiled=compiled)
    np.testing.assert_array_equal(codes & 15, h.buckets)
    np.testing.assert_array_equal(np.where(codes & 128, -1.0, 1.0), h.signs)


@pytest.mark.skipif(not kernels.HAVE_COMPILED, reason="compiled kernel not built")
def test_compiled_equals_numpy_on_large_chunk():
    rng = np.random.default_rng(1)
    x, r = rng.normal(size=(2, 100_003)).astype(np.float32)
    codes = hash_codes(99, 7, x.size)
    np.testing.assert_array_equal(codes, hash_codes(99, 7, x.size, compiled=False))
    a, b = np.zeros(STATS), np.zeros(STATS)
    accumulate(codes, r, x, a, compiled=True)
    accumulate(codes, r, x, b, compiled=False)
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("compiled", paths)
def test_empty_chunk_and_negative_key(compiled):
    out = np.zeros(STATS)
    accumulate(
        np.zeros(0, np.uint8), np.zeros(0, np.float32), np.zeros(0, np.float32), out, compiled=compiled
    )
    assert not out.any()
    np.testing.assert_array_equal(hash_codes(-1, 0, 5, compiled=compiled), hash_codes(2**64 - 1, 0, 5))


@pytest.mark.parametrize(
    "codes,ref,x,out,kw",
    [
        (np.zeros(4, np.uint16), np.zeros(4), np.zeros(4), np.zeros(STATS), {}),
        (np.zeros(4, np.uint8), np.zeros(4, np.int32), np.zeros(4, np.int32), np.zeros(STATS), {}),
        (np.zeros(4, np.uint8), np.zeros(4), np.zeros(4), np.zeros(STATS, np.int64), {}),
        (np.zeros(4, np.uint8), np.zeros(8)[::2], np.zeros(4), np.zeros(STATS), {}),
        (np.zeros(4, np.uint8), np.zeros(4), np.zeros(5), np.zeros(STATS), {}),
        (np.zeros(4, np.uint8), np.zeros(4), np.zeros(4), np.zeros(STATS + 1), {}),
        (np.zeros(4, np.uint8), np.zeros(4), np.zeros(4), np.zeros((2, STATS)), {}),
        (np.zeros(4, np.uint8), np.zeros(4), np.zeros(4, np.uint8), np.zeros(STATS), {"x_dtype": "I8"}),
        (np.zeros(4, np.uint8), np.zeros(4), np.zeros(3, np.uint8), np.zeros(STATS), {"x_dtype": "F16"}),
    ],
)
def test_wrong_dtypes_or_layouts_are_refused(codes, ref, x, out, kw):
    for compiled in paths:
        with pytest.raises(ValueError, match="accumulate: "):
            accumulate(codes, ref, x, out, compiled=compiled, **kw)


@pytest.fixture
def files(tmp_path):
    """``files(dtypes, m)``: one file per dtype holding ``m`` scalars after a 3-byte header (odd
    offsets), as rows (fd, 3, dtype); closed after the test."""
    fds = []

    def make(dtypes: list[str], m: int) -> list[tuple[int, int, str]]:
        rows = []
        for f, dtype in enumerate(dtypes):
            base = torch.randn(m, generator=torch.Generator().manual_seed(f), dtype=torch.float64) * 3
            raw, _ = stored(base.abs() + 0.5 if dtype == "F8_E8M0" else base, dtype)
            path = tmp_path / f"{len(fds)}.bin"
            path.write_bytes(b"hdr" + raw.tobytes())
            fds.append(os.open(path, os.O_RDONLY))
            rows.append((fds[-1], 3, dtype))
        return rows

    yield make
    for fd in fds:
        os.close(fd)


def _in_memory(rows: list[tuple[int, int, str]], keys: list[int], m: int, compiled: bool) -> np.ndarray:
    """``accumulate`` of each row's whole piece against row 0's, with the same codes."""
    codes = [hash_codes(k, 0, m, compiled=compiled) for k in keys]
    raw = [np.frombuffer(os.pread(fd, m * kernels.ITEMSIZE[t], off), np.uint8) for fd, off, t in rows]
    want = np.zeros((len(rows), len(keys), STATS))
    for f, (b, (_, _, t)) in enumerate(zip(raw, rows, strict=True)):
        accumulate(codes, raw[0], b, want[f], compiled=compiled, ref_dtype=rows[0][2], x_dtype=t)
    return want


@pytest.mark.parametrize("compiled", paths)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("m,R", [(0, 1), (5, 1), (70001, 1), (40000, 3), (100, 130)])
def test_accumulate_files_equals_accumulate_in_memory(files, compiled, dtype, m, R):
    """Pieces longer than the kernel's file block (32768 scalars) are summed block by block,
    the reference decoded once per block and files of one dtype taken two at a time: the
    compiled sums are those of one pass in memory, bit for bit; the numpy path likewise."""
    rows = files([dtype] * 4, m)  # the reference, then two files summed together and one alone
    keys = [tensor_key(s, "w") + 11 for s in range(R)]
    got = np.zeros((4, R, STATS))
    assert kernels.accumulate_files(keys, m, rows, got, compiled=compiled) == -1
    np.testing.assert_array_equal(got, _in_memory(rows, keys, m, compiled))
    np.testing.assert_array_equal(got[0, :, 14], got[0, :, 15])  # the reference against itself
    assert not got[0, :, 16:].any()


@pytest.mark.parametrize("compiled", paths)
def test_accumulate_files_mixed_dtypes(files, compiled):
    rows = files(["BF16", "F32", "F8_E4M3", "F64", "F16"], 33000)
    got = np.zeros((5, 2, STATS))
    assert kernels.accumulate_files([1, 2], 33000, rows, got, compiled=compiled) == -1
    np.testing.assert_array_equal(got, _in_memory(rows, [1, 2], 33000, compiled))


@pytest.mark.parametrize("compiled", paths)
def test_accumulate_files_over_a_million_scalars(files, compiled):
    """Longer than the numpy path's block (2²⁰ scalars): the paths agree with one pass in
    memory, the compiled one bit for bit, the numpy one to rounding."""
    m = (1 << 20) + 13
    rows = files(["F32", "BF16", "F32"], m)
    got = np.zeros((3, 1, STATS))
    assert kernels.accumulate_files([5], m, rows, got, compiled=compiled) == -1
    want = _in_memory(rows, [5], m, compiled)
    if compiled:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("compiled", paths)
def test_accumulate_files_reports_the_row_that_ends_early(files, compiled):
    rows = files(["F32", "F32", "F32"], 40000)
    out = np.zeros((3, 1, STATS))
    assert kernels.accumulate_files([1], 40001, rows, out, compiled=compiled) == 0  # every file is short
    fd, off, t = rows[2]
    rows[2] = (fd, off + 8, t)  # the last row starts two scalars later: it alone ends early
    assert kernels.accumulate_files([1], 40000, rows, out, compiled=compiled) == 2


@pytest.mark.parametrize("compiled", paths)
def test_accumulate_files_refuses_wrong_arguments(files, compiled):
    rows = files(["F32", "F32"], 8)
    wrong = [([], rows, np.zeros((2, 0, STATS))), ([1], [], np.zeros((0, 1, STATS))),
             ([1], rows, np.zeros((2, 2, STATS))), ([1], rows, np.zeros((2, 1, STATS), np.float32)),
             ([1], [(rows[0][0], 0, "I8")], np.zeros((1, 1, STATS)))]
    for keys, rs, out in wrong:
        with pytest.raises(ValueError, match="accumulate_files: "):
            kernels.accumulate_files(keys, 8, rs, out, compiled=compiled)


@pytest.mark.parametrize("compiled", paths)
@pytest.mark.parametrize("dtype", [d for d in DTYPES if d not in ("F32", "F64")])
def test_every_bit_pattern_through_accumulate_files(tmp_path, compiled, dtype):
    """Every finite 8- and 16-bit pattern, read from files: the reference decoded once per block,
    two files at a time (rf64x2) and one alone (rf64): the sums of one pass in memory."""
    size = torch.empty(0, dtype=TORCH[dtype]).element_size()
    bits = np.arange(256**size, dtype=np.uint16 if size == 2 else np.uint8)
    finite = bits[~np.isnan(decode(bits, dtype, compiled=False))]
    arrays = [np.random.default_rng(s).permutation(finite) for s in range(4)]  # reference, 3 files
    fds = []
    try:
        for f, a in enumerate(arrays):
            (tmp_path / f"{f}.bin").write_bytes(a.tobytes())
            fds.append(os.open(tmp_path / f"{f}.bin", os.O_RDONLY))
        rows = [(fd, 0, dtype) for fd in fds]
        got = np.zeros((4, 1, STATS))
        assert kernels.accumulate_files([8], finite.size, rows, got, compiled=compiled) == -1
        np.testing.assert_array_equal(got, _in_memory(rows, [8], finite.size, compiled))
    finally:
        for fd in fds:
            os.close(fd)
