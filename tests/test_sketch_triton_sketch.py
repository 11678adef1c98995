"""The Triton body of the monitor's sketch equals the reference (naig.sketch.triton_sketch).

On a machine without a GPU the kernel runs under triton's interpreter (``TRITON_INTERPRET=1``,
set here before the kernel module is imported); with a GPU it runs on CUDA.
"""

import math
import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():  # read by triton when it is imported (and by its lazy imports after)
    os.environ.setdefault("TRITON_INTERPRET", "1")
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
pytest.importorskip("triton", reason="the CUDA sketch needs triton (pip install 'naig[triton]')")

from naig.sketch.core import sketch_reference  # noqa: E402
from naig.sketch.layout_sketch import LayoutSketch  # noqa: E402
from naig.sketch.triton_sketch import BLOCK, launch_plan  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(DEVICE.type == "cpu" and not INTERPRETED,
                                reason="no GPU and the interpreter is off")


def _state(seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(seed)
    shapes = {"w": (int(rng.integers(1, 9)), 13), "b": (int(rng.integers(1, 4)),), "s": (), "e": (0,),
              "long": (3 * BLOCK + int(rng.integers(1, BLOCK)),)}
    return {n: torch.from_numpy(np.asarray(rng.standard_normal(s) * 3)).to(dtype)
            for n, s in shapes.items()}


def _check(got: torch.Tensor, state: dict[str, torch.Tensor], seed: int, blocks: int) -> None:
    arrays = {n: t.to(torch.float64).numpy() for n, t in state.items()}
    ref = np.concatenate([sketch_reference(arrays, seed + r) for r in range(blocks)])
    flat = torch.cat([t.reshape(-1) for t in state.values()]).to(torch.float64)
    got = got.cpu()
    np.testing.assert_allclose(got[:14 * blocks].numpy(), ref, rtol=0, atol=float(flat.abs().sum()) * 1e-14)
    assert got[-2].item() == pytest.approx(float(flat @ flat), rel=1e-13)
    assert got[-1].item() == 0.0


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("blocks", [1, 2, 5])  # 5: two groups of blocks, two launches
def test_triton_equals_the_reference(dtype: torch.dtype, blocks: int) -> None:
    seed = {1: 0, 2: 2**64 - 2, 5: 12345}[blocks]
    state = _state(blocks, dtype)
    sk = LayoutSketch.build([(n, t.numel()) for n, t in state.items()], seed=seed, blocks=blocks)
    flat = torch.cat([t.reshape(-1) for t in state.values()]).to(DEVICE)
    _check(sk(flat, "triton"), state, seed, blocks)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's inf − inf
def test_triton_counts_non_finite_entries_and_reads_strided_and_empty_input() -> None:
    x = torch.randn(2 * BLOCK + 3)
    x[[0, BLOCK + 1]] = torch.tensor([math.nan, -math.inf])
    p = LayoutSketch.build([("w", x.numel())], seed=4)(x.to(DEVICE), "triton").cpu()
    assert p[-1].item() == 2.0 and not math.isfinite(p[-2].item())
    view = torch.randn(40, 9).t()
    got = LayoutSketch.build([("w", 360)], seed=1)(view.to(DEVICE), "triton")
    _check(got, {"w": view.contiguous()}, 1, 1)
    empty = LayoutSketch.build([("a", 0)], seed=0)(torch.zeros(0, device=DEVICE), "triton")
    assert empty.cpu().tolist() == [0.0] * 16


def test_triton_reads_fsdp_segments_and_skips_padding() -> None:
    segments = np.array([[0, 5, 0, 0], [8, 300, 0, 1], [400, 7, 5, 0]])
    state_x = torch.randn(420)
    sk = LayoutSketch.from_segments(["a", "b"], segments, 420, seed=3)
    a = torch.zeros(12, dtype=torch.float64)
    a[0:5], a[5:12] = state_x[0:5].double(), state_x[400:407].double()
    _check(sk(state_x.to(DEVICE), "triton"), {"a": a, "b": state_x[8:308].double()}, 3, 1)


def test_launch_plan_spreads_small_segments() -> None:
    segments = np.array([[0, 10, 0, 0], [10, 5 * BLOCK, 0, 1], [0, 1, 0, 2]])
    programs, first = launch_plan(segments, torch.device("cpu"))
    assert programs == 7 and first.tolist() == [0, 1, 6]


@pytest.mark.parametrize("cap", [1 << 26, 40, 1])  # one launch; several runs; a launch per tensor
@pytest.mark.parametrize("blocks", [1, 2])
def test_of_tensors_concatenates_runs_of_tensors_of_mixed_dtypes(monkeypatch: pytest.MonkeyPatch, cap: int,
                                                                 blocks: int) -> None:
    """``of_tensors`` on the Triton body (``observe`` on CUDA) sketches runs of one dtype and at most
    ``GROUP_VALUES`` values in one launch each: the same payload as the reference, whatever the runs, with
    fp32, bf16 and fp16 tensors, an empty one between two fp32 ones (left out of the run, which goes on)
    and a strided one among them."""
    import naig.sketch.layout_sketch as layout_sketch

    monkeypatch.setattr(layout_sketch, "GROUP_VALUES", cap)
    dtypes = (torch.float32, torch.bfloat16, torch.float32, torch.float32, torch.float32)  # w b s e long
    state = {n: t.to(d) for (n, t), d in zip(_state(11, torch.float32).items(), dtypes, strict=True)}
    state["h"] = torch.randn(300).to(torch.float16)
    state["t"] = torch.randn(6, 9).t()
    sk = LayoutSketch.build([(n, t.numel()) for n, t in state.items()], seed=5, blocks=blocks)
    got = sk.of_tensors([t.to(DEVICE) for t in state.values()], "triton")
    _check(got, {n: t.contiguous() for n, t in state.items()}, 5, blocks)
