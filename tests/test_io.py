"""naig.io.save_gradients writes real safetensors with audit metadata."""

import numpy as np
import pytest
import torch
from safetensors import safe_open

from naig.errors import UsageError
from naig.io import save_gradients


def test_roundtrip_with_metadata(tmp_path):
    model = torch.nn.Linear(4, 3)
    model(torch.randn(2, 4)).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    path = save_gradients(
        tmp_path / "sub" / "w.safetensors", grads, lag=10, step=50, worker=2, strategy="naig"
    )
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"lag": "10", "step": "50", "worker": "2", "strategy": "naig"}
        for n, g in grads.items():
            assert torch.equal(f.get_tensor(n), g)


def test_numpy_and_non_contiguous(tmp_path):
    t = torch.arange(12.0).reshape(3, 4).T  # non-contiguous
    path = save_gradients(tmp_path / "x.safetensors", {"t": t, "n": np.ones(2)})
    with safe_open(str(path), "pt") as f:
        assert torch.equal(f.get_tensor("t"), t.contiguous()) and f.metadata() == {}


@pytest.mark.parametrize("name,tensors", [("x.pt", {"a": torch.ones(1)}), ("x.safetensors", {})])
def test_rejects_bad_targets(tmp_path, name, tensors):
    with pytest.raises(UsageError):
        save_gradients(tmp_path / name, tensors)
    assert not (tmp_path / name).exists()
