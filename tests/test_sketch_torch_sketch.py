"""Torch path of the sketch equals the docs/design.md §5 reference (naig.sketch.torch_sketch)."""

import numpy as np
import pytest
import torch

from naig.sketch import sketch_reference
from naig.sketch.torch_sketch import TorchSketch

SEED0 = [4.5, 0, -6, 0, 0, 0, 2, 8, -0.25, 0, -7, 0, 0, 10]
SEED7 = [-4, 6, 0, -7, 11, 0.25, 1, 0, 0, -6.5, 0, 5, 0, 8]


def _flat_state() -> torch.Tensor:
    return torch.cat([torch.arange(10, dtype=torch.float32), torch.tensor([1.5, -2.0, 0.25])])


@pytest.mark.parametrize(("seed", "expected"), [(0, SEED0), (7, SEED7)])
def test_spec_test_vectors(seed: int, expected: list[float]) -> None:
    sk = TorchSketch.build([("w", 10), ("b", 3)], seed=seed)
    assert sk(_flat_state()).tolist() == expected


@pytest.mark.parametrize("seed", [0, 3, 2**64 - 1])
def test_equals_reference_float64_on_random_state(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed % 1000)
    shapes = {"a.weight": (7, 5), "a.bias": (5,), "emb": (3, 4, 2)}
    state = {n: torch.randn(s, generator=gen, dtype=torch.float64) for n, s in shapes.items()}
    sk = TorchSketch.build([(n, t.numel()) for n, t in state.items()], seed=seed)
    flat = torch.cat([t.reshape(-1) for t in state.values()])
    ref = sketch_reference({n: t.numpy() for n, t in state.items()}, seed=seed)
    np.testing.assert_allclose(sk(flat).numpy(), ref, rtol=1e-12, atol=1e-12)


def test_batched_rows_are_sketched_independently_and_linearly() -> None:
    sk = TorchSketch.build([("w", 10), ("b", 3)], seed=0)
    x = _flat_state()
    batch = torch.stack([x, 2 * x, -x])
    out = sk(batch)
    assert out.shape == (3, 14) and out.dtype == torch.float64
    assert torch.equal(out[1], 2 * out[0]) and torch.equal(out[2], -out[0])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_inputs_upcast_exactly(dtype: torch.dtype) -> None:
    sk = TorchSketch.build([("w", 10), ("b", 3)], seed=0)
    x = _flat_state().to(dtype)
    assert sk(x).tolist() == sk(x.to(torch.float64)).tolist()


def test_wrong_length_raises() -> None:
    with pytest.raises(ValueError, match="length 13"):
        TorchSketch.build([("w", 10), ("b", 3)])(torch.zeros(12))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_equals_cpu() -> None:
    sk_cpu = TorchSketch.build([("w", 10), ("b", 3)], seed=7)
    sk_gpu = TorchSketch.build([("w", 10), ("b", 3)], seed=7, device="cuda")
    x = _flat_state()
    assert sk_gpu(x.cuda()).cpu().tolist() == sk_cpu(x).tolist()
