"""The sketch of tensors in place equals the docs/design.md §5 reference (naig.sketch.layout_sketch)."""

import math

import numpy as np
import pytest
import torch

from naig.errors import UsageError
from naig.monitor.fsdp import layout_permutation, layout_segments
from naig.sketch.core import sketch_reference
from naig.sketch.layout_sketch import LayoutSketch, compiled_available
from tests.conftest import run_python

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
CPU_IMPLS = ["numpy", "torch"] + (["compiled"] if compiled_available() else [])


def _layout(seed: int) -> dict[str, torch.Tensor]:
    """A random state dict: odd sizes, a 0-d tensor, an empty one, a tensor larger than a chunk."""
    rng = np.random.default_rng(seed)
    shapes = {"emb.weight": (int(rng.integers(1, 40)), 7), "b": (int(rng.integers(1, 9)),), "scalar": (),
              "empty": (0, 3), f"layer{seed}.w": (int(rng.integers(1, 5)), 33, 3),
              "big": (int(rng.integers(70_000, 70_100)),)}
    scale = rng.uniform(0.1, 10)
    return {n: torch.from_numpy(np.asarray(rng.standard_normal(s) * scale)) for n, s in shapes.items()}


def _reference(state: dict[str, torch.Tensor], seed: int, blocks: int) -> np.ndarray:
    arrays = {n: t.to(torch.float64).numpy() for n, t in state.items()}
    return np.concatenate([sketch_reference(arrays, seed + r) for r in range(blocks)])


def _payload_ok(got: torch.Tensor, state: dict[str, torch.Tensor], seed: int, blocks: int) -> None:
    flat = torch.cat([t.reshape(-1) for t in state.values()]).to(torch.float64)
    scale = float(flat.abs().sum()) * 1e-14  # float64 summation-order bound (docs/design.md §5)
    m = 14 * blocks
    assert got.dtype == torch.float64 and got.shape == (m + 2,)
    np.testing.assert_allclose(got[:m].numpy(), _reference(state, seed, blocks), rtol=0, atol=scale)
    assert got[m].item() == pytest.approx(float(flat @ flat), rel=1e-13)
    assert got[m + 1].item() == 0.0


@pytest.mark.parametrize("impl", CPU_IMPLS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_body_equals_the_reference(impl: str, dtype: torch.dtype) -> None:
    for seed, blocks in ((0, 1), (7, 2), (2**64 - 3, 3)):
        state = {n: t.to(dtype) for n, t in _layout(seed % 1000).items()}
        sk = LayoutSketch.build([(n, t.numel()) for n, t in state.items()], seed=seed, blocks=blocks)
        flat = torch.cat([t.reshape(-1) for t in state.values()])
        _payload_ok(sk(flat, impl), state, seed, blocks)
        _payload_ok(sk.of_tensors(list(state.values()), impl), state, seed, blocks)


@pytest.mark.skipif(not compiled_available(), reason="the C kernel is not built")
def test_the_compiled_body_reads_fp8() -> None:
    x = (torch.randn(1001) * 4).to(torch.float8_e4m3fn)
    sk = LayoutSketch.build([("w", 1001)], seed=5)
    _payload_ok(sk(x, "compiled"), {"w": x.to(torch.float64)}, 5, 1)


@pytest.mark.parametrize("impl", CPU_IMPLS)
def test_non_finite_entries_are_counted(impl: str) -> None:
    x = torch.randn(3001)
    x[[5, 17, 3000]] = torch.tensor([math.nan, math.inf, -math.inf])
    p = LayoutSketch.build([("w", 3001)], seed=1, blocks=2)(x, impl)
    assert p[-1].item() == 3.0 and not math.isfinite(p[-2].item())
    assert torch.isfinite(LayoutSketch.build([("w", 3001)])(torch.randn(3001), impl)[-1])


@pytest.mark.parametrize("impl", CPU_IMPLS)
def test_a_non_contiguous_tensor_is_sketched_in_its_row_major_order(impl: str) -> None:
    base = torch.randn(37, 29, dtype=torch.float32)
    view = base.t()  # (29, 37), strides (1, 29): not contiguous
    sk = LayoutSketch.build([("w", view.numel())], seed=3)
    _payload_ok(sk(view, impl), {"w": view.contiguous()}, 3, 1)
    _payload_ok(sk.of_tensors([view], impl), {"w": view.contiguous()}, 3, 1)


@pytest.mark.parametrize("impl", CPU_IMPLS)
def test_strided_views_that_flatten_without_a_copy_are_read_by_their_strides(impl: str) -> None:
    """reshape(-1) returns these as strided views (no copy): a 1-D slice with a step, a column of a
    matrix, an expanded 0-stride tensor (autograd's gradient of a sum), a view at an offset. Read as if
    contiguous they gave another vector's norm and sketch (and out-of-bounds reads)."""
    base, mat = torch.randn(3001), torch.randn(1000, 3)
    views = {"step": base[::3], "column": mat[:, 1:2], "expanded": torch.full((1,), 0.5).expand(2000),
             "offset": base[1000:2000:2]}
    sk = LayoutSketch.build([(n, v.numel()) for n, v in views.items()], seed=11, blocks=2)
    dense = {n: v.contiguous() for n, v in views.items()}
    _payload_ok(sk.of_tensors(list(views.values()), impl), dense, 11, 2)
    for name, v in views.items():
        one = LayoutSketch.build([(name, v.numel())], seed=11)
        _payload_ok(one(v, impl), {name: dense[name]}, 11, 1)


@pytest.mark.parametrize("impl", CPU_IMPLS)
def test_empty_layouts(impl: str) -> None:
    for named in ([], [("a", 0)], [("a", 0), ("b", 0)]):
        sk = LayoutSketch.build(named, seed=0, blocks=2)
        assert sk(torch.zeros(0), impl).tolist() == [0.0] * 30
        assert sk.of_tensors([torch.zeros(0) for _ in named], impl).tolist() == [0.0] * 30


@pytest.mark.parametrize("world", [2, 3, 4])
def test_fsdp_segments_are_the_permuted_layout(world: int) -> None:
    """FSDP's reduce-scatter input (rows of chunks, padded) sketched by segments = the state dict's sketch."""
    sizes = ((5, 3), (7,), (), (1, 4), (2, 2, 2))
    names = [f"p{i}" for i in range(len(sizes))]
    state = {n: torch.randn(s, dtype=torch.float64) for n, s in zip(names, sizes, strict=True)}
    perm = layout_permutation(sizes, world)
    flat = torch.cat([t.reshape(-1) for t in state.values()])
    inp = torch.where(torch.from_numpy(perm >= 0), flat[torch.from_numpy(np.maximum(perm, 0))], 123.0)
    segments, total = layout_segments(sizes, world)
    assert total == perm.size and segments.shape == (world * len(sizes), 4)  # nothing of the input's size
    sk = LayoutSketch.from_segments(names, segments, total, seed=9, blocks=2)
    for impl in CPU_IMPLS:
        _payload_ok(sk(inp, impl), state, 9, 2)  # the padding (123.0) is not read


def test_memory_does_not_grow_with_the_layout() -> None:
    named = [(f"layer{i}.weight", 2_500_000) for i in range(400)]  # 1e9 parameters
    sk = LayoutSketch.build(named, seed=0, blocks=4)
    assert sk.numel == 10**9 and sk.nbytes() <= 400 * (4 * 8 + 4 * 8)


def test_refusals() -> None:
    sk = LayoutSketch.build([("w", 4)])
    with pytest.raises(UsageError, match="expected 4 values"):
        sk(torch.zeros(5))
    with pytest.raises(UsageError, match="float tensor"):
        sk(torch.zeros(4, dtype=torch.int64))
    with pytest.raises(UsageError, match="use one of"):
        sk(torch.zeros(4), impl="cuda")
    with pytest.raises(UsageError, match="blocks"):
        LayoutSketch.build([("w", 4)], blocks=0)
    with pytest.raises(UsageError, match="seed"):
        LayoutSketch.build([("w", 4)], seed=2**64 - 1, blocks=2)
    with pytest.raises(UsageError, match="inside the input"):
        LayoutSketch.from_segments(["w"], np.array([[2, 4, 0, 0]]), 5)
    with pytest.raises(UsageError, match="size differs"):
        sk.of_tensors([torch.zeros(3)])


# The children run forked from the preloaded server (``run_python``), whose imports stop short of the
# kernel: the environment each sets is read when the kernel is imported (NAIG_KERNEL_ISA by the C
# module, NAIG_PURE_NUMPY by the modules that import it), which must be after it.
FRESH_KERNEL = ("assert not {'naig.sketch._kernel', 'naig.sketch.kernels', 'naig.sketch.layout_sketch'}"
                " & set(sys.modules), 'the kernel was imported before the run'")

FALLBACK_CHILD = """
import sys, warnings
{fresh}
{block}
import torch
from naig.monitor.signals import MonitorSketch, pack
sketch = MonitorSketch.build([("w", 100), ("b", 7)], seed=0)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(3):
        pack(torch.ones(107), sketch)
print(len(caught))
for w in caught:
    print(w.category.__name__, str(w.message))
"""


@pytest.mark.parametrize("env, warned", [({}, 1), ({"NAIG_PURE_NUMPY": "1"}, 0)])
def test_the_monitor_warns_once_when_the_kernel_was_not_built(env: dict, warned: int) -> None:
    """The C extension made unimportable: one warning for the process (three packs), none when asked."""
    import os

    from naig.sketch.layout_sketch import FALLBACK

    code = FALLBACK_CHILD.format(fresh=FRESH_KERNEL, block="sys.modules['naig.sketch._kernel'] = None")
    out = run_python("-c", code, timeout=120, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert int(lines[0]) == warned, lines
    if warned:
        assert lines[1] == f"UserWarning {FALLBACK['numpy']}"


BODIES_CHILD = "import hashlib, sys, numpy as np, torch\n" + FRESH_KERNEL + """
from naig.sketch.kernels import compiled_isa
from naig.sketch.layout_sketch import LayoutSketch
gen = torch.Generator().manual_seed(7)
digest = hashlib.sha256()


def add(payload):  # the bytes, every NaN made the same NaN (a sign flip of a NaN is no difference)
    p = payload.numpy().copy()
    p[np.isnan(p)] = np.nan
    digest.update(p.tobytes())


sizes = [1, 7, 8, 9, 63, 64, 65, 71, 127, 128, 129, 1000, 1024, 1031, 4097]
for blocks in (1, 3):
    for seed in range(3):
        names = [(f"p{i}", sizes[(seed * 5 + i * 3) % len(sizes)]) for i in range(6)]
        sk = LayoutSketch.build(names, seed=seed, blocks=blocks)
        n = sum(m for _, m in names)
        for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn):
            x = (torch.randn(n, generator=gen) * 4).to(dtype)
            add(sk(x, impl="compiled"))
            strided = (torch.randn(n, 2, generator=gen) * 4).to(dtype)[:, 1]
            add(sk(strided, impl="compiled"))
        x = torch.randn(n, generator=gen)
        x[n // 2] = float("nan")
        add(sk(x, impl="compiled"))
print(compiled_isa(), digest.hexdigest())
"""


@pytest.mark.skipif(not compiled_available(), reason="the C kernel is not built on this machine")
def test_every_vector_body_gives_the_same_sums_bit_for_bit() -> None:
    """NAIG_KERNEL_ISA caps the bodies: portable, AVX2, AVX-512 and (where the CPU has it) AVX-512
    IFMA sketch odd-sized pieces of every float dtype, blocks 1 and 3, to the same bytes (NaN signs
    aside: x86 keeps the first of two NaN operands, -1 * NaN keeps a NaN's sign, and the bodies
    order their operands differently)."""
    import os

    got = {}
    # any case, surrounding white space ignored; an unknown cap: said (quoted), then the CPU's best
    for cap in ("portable", " AVX2\n", "avx512", "avx9000"):
        env = {**os.environ, "NAIG_KERNEL_ISA": cap}
        out = run_python("-c", BODIES_CHILD, timeout=120, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        isa, digest = out.stdout.split()
        got[cap] = (isa, digest)
        said = "NAIG_KERNEL_ISA='avx9000' is not portable, avx2, avx512 or avx512-ifma: ignored" in out.stderr
        assert said == (cap == "avx9000"), out.stderr
    assert (got["portable"][0], got[" AVX2\n"][0]) == ("portable", "avx2")
    order = ["portable", "avx2", "avx512", "avx512-ifma"]
    assert order.index(got["avx9000"][0]) >= order.index(got["avx512"][0])  # not capped
    assert len({digest for _, digest in got.values()}) == 1, got
