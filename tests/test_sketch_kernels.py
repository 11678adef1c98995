"""Compiled and numpy chunk kernels agree with the reference sketch in float64."""

import numpy as np
import pytest

from naig.sketch import TensorHash, kernels, sketch_reference, tensor_key
from naig.sketch.kernels import STATS, accumulate, hash_codes

paths = [False] + ([True] if kernels.HAVE_COMPILED else [])


@pytest.mark.parametrize("compiled", paths)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_accumulate_matches_reference(compiled, dtype):
    rng = np.random.default_rng(0)
    x, r = rng.normal(size=(2, 1001)).astype(dtype)
    key = tensor_key(5, "t")
    codes = hash_codes(key, 0, x.size, compiled=compiled)
    out = np.zeros(STATS)
    accumulate(codes, r, x, out, compiled=compiled)
    x64, r64 = x.astype(np.float64), r.astype(np.float64)
    np.testing.assert_allclose(out[:14], sketch_reference({"t": x64}, seed=5), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out[14:], [x64 @ r64, x64 @ x64, (x64 - r64) @ (x64 - r64)], rtol=1e-12)


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


def test_accumulate_rejects_mismatched_inputs():
    with pytest.raises(ValueError, match="accumulate"):
        accumulate(np.zeros(3, np.uint8), np.zeros(3, np.float32), np.zeros(3), np.zeros(STATS))


@pytest.mark.parametrize("compiled", paths)
def test_empty_chunk_and_negative_key(compiled):
    out = np.zeros(STATS)
    accumulate(
        np.zeros(0, np.uint8), np.zeros(0, np.float32), np.zeros(0, np.float32), out, compiled=compiled
    )
    assert not out.any()
    np.testing.assert_array_equal(hash_codes(-1, 0, 5, compiled=compiled), hash_codes(2**64 - 1, 0, 5))


@pytest.mark.parametrize(
    "codes,ref,x,out",
    [
        (np.zeros(4, np.uint16), np.zeros(4), np.zeros(4), np.zeros(STATS)),
        (np.zeros(4, np.uint8), np.zeros(4, np.int32), np.zeros(4, np.int32), np.zeros(STATS)),
        (np.zeros(4, np.uint8), np.zeros(4), np.zeros(4), np.zeros(STATS, np.int64)),
        (np.zeros(4, np.uint8), np.zeros(8)[::2], np.zeros(4), np.zeros(STATS)),
    ],
)
def test_wrong_dtypes_or_layouts_are_refused(codes, ref, x, out):
    with pytest.raises(ValueError, match="accumulate: expected"):
        accumulate(codes, ref, x, out)
