"""naig.io.save_gradients writes real safetensors with audit metadata."""

import os
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from naig.errors import UsageError
from naig.io import save_gradients
from tests.conftest import run_python


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


def _read(path) -> dict:
    with safe_open(str(path), "pt") as f:
        return {n: f.get_tensor(n) for n in f.keys()}


def test_none_gradients_of_frozen_layers_are_skipped_and_named(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    for p in model[0].parameters():
        p.requires_grad_(False)
    model(torch.randn(5, 3)).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    with pytest.warns(UserWarning, match=r"skipped 2 tensor\(s\) with no gradient.*'0.weight', '0.bias'"):
        path = save_gradients(tmp_path / "w.safetensors", grads)
    saved = _read(path)
    assert sorted(saved) == ["1.bias", "1.weight"]
    assert torch.equal(saved["1.weight"], model[1].weight.grad)


def test_all_none_is_refused(tmp_path):
    with pytest.raises(UsageError, match="every tensor is None"):
        save_gradients(tmp_path / "w.safetensors", {"a": None})
    assert not list(tmp_path.iterdir())


def test_shared_storage_and_tied_weights_are_saved(tmp_path):
    t = torch.arange(10.0)
    emb = torch.nn.Embedding(6, 3)
    head = torch.nn.Linear(3, 6, bias=False)
    head.weight = emb.weight  # tied, as GPT-2's state_dict
    tied = torch.nn.Sequential(emb, head).state_dict()
    path = save_gradients(tmp_path / "w.safetensors", {"a": t, "b": t, "lo": t[:5], "hi": t[3:8], **tied})
    saved = _read(path)
    assert torch.equal(saved["a"], t) and torch.equal(saved["b"], t)
    assert saved["lo"].tolist() == [0, 1, 2, 3, 4] and saved["hi"].tolist() == [3, 4, 5, 6, 7]
    assert torch.equal(saved["0.weight"], emb.weight.detach())
    assert torch.equal(saved["1.weight"], saved["0.weight"])


def test_numpy_negative_strides_and_byte_order(tmp_path):
    a = np.arange(6.0).reshape(2, 3)
    big = np.arange(4, dtype=">f4")
    path = save_gradients(tmp_path / "w.safetensors", {"flip": np.flip(a), "big": big, "step": a[:, ::-2]})
    saved = _read(path)
    assert saved["flip"].tolist() == [[5, 4, 3], [2, 1, 0]]
    assert saved["big"].tolist() == [0, 1, 2, 3] and saved["big"].dtype == torch.float32
    assert saved["step"].tolist() == [[2, 0], [5, 3]]


def test_sparse_embedding_gradient_is_densified_with_a_notice(tmp_path):
    emb = torch.nn.Embedding(10, 4, sparse=True)
    emb(torch.tensor([1, 2, 2])).sum().backward()
    assert emb.weight.grad.is_sparse
    with pytest.warns(UserWarning, match="sparse gradient.*dense.*'weight'"):
        path = save_gradients(tmp_path / "w.safetensors", {"weight": emb.weight.grad})
    dense = _read(path)["weight"]
    assert dense.shape == (10, 4)
    assert dense[2].tolist() == [2.0] * 4 and dense[1].tolist() == [1.0] * 4 and dense[0].abs().sum() == 0


def test_metadata_name_refused_before_anything_is_written(tmp_path):
    target = tmp_path / "sub" / "w.safetensors"
    with pytest.raises(UsageError, match="'__metadata__' is reserved"):
        save_gradients(target, {"w": torch.ones(2), "__metadata__": torch.ones(1)})
    assert not (tmp_path / "sub").exists()


def test_unconvertible_value_names_the_tensor_and_writes_nothing(tmp_path):
    with pytest.raises(UsageError, match="tensor 'bad' cannot be saved"):
        bad = np.array(["x"], dtype=object)
        save_gradients(tmp_path / "w.safetensors", {"ok": torch.ones(2), "bad": bad})
    assert not list(tmp_path.iterdir())


def test_existing_file_untouched_when_saving_fails(tmp_path):
    target = tmp_path / "w.safetensors"
    save_gradients(target, {"w": torch.ones(2)})
    before = target.read_bytes()
    with pytest.raises(UsageError):
        save_gradients(target, {"w": torch.ones(2), "__metadata__": torch.ones(1)})
    assert target.read_bytes() == before and sorted(tmp_path.iterdir()) == [target]


_DTENSOR_SCRIPT = """
import datetime, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from naig.io import save_gradients
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=30))
mesh = init_device_mesh("cpu", (1,))
w = torch.nn.Parameter(distribute_tensor(torch.arange(12.0).reshape(4, 3), mesh, [Shard(0)]))
(w * w).sum().backward()
assert type(w.grad).__name__ == "DTensor"
save_gradients(sys.argv[1], {"w": w.grad}, lag=1)
dist.destroy_process_group()
"""


def test_dtensor_gradient_is_gathered_on_a_real_gloo_group(tmp_path):
    out = tmp_path / "d.safetensors"
    root = Path(__file__).resolve().parents[1]
    r = run_python("-c", _DTENSOR_SCRIPT, out, tmp_path / "store", timeout=120, cwd=root)  # (its FileStore)
    assert r.returncode == 0, r.stderr
    assert _read(out)["w"].tolist() == (2 * torch.arange(12.0).reshape(4, 3)).tolist()  # d(w²)/dw = 2w


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_the_file_gets_the_mode_of_any_file_the_user_creates(tmp_path, umask: int):
    """safetensors writes its file with mode 0600 (and mkstemp did too): a gradient file others on the
    machine should read was private whatever the umask; it is now 0666 less the umask."""
    before = os.umask(umask)
    try:
        path = save_gradients(tmp_path / "g.safetensors", {"w": torch.ones(3)}, lag=0)
    finally:
        os.umask(before)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["g.safetensors"]  # no temporary file left


def test_paths_and_dtypes_safetensors_cannot_take_are_one_line_usage_errors(tmp_path):
    """Each was a raw exception (KeyError: torch.complex128 from inside safetensors, IsADirectoryError,
    FileExistsError, TypeError for a bytes path); nothing is written."""
    (tmp_path / "d.safetensors").mkdir()
    (tmp_path / "f").write_text("x")
    ones = {"w": torch.ones(2)}
    for path, tensors, needle in ((tmp_path / "c.safetensors", {"w": torch.ones(2, dtype=torch.complex128)},
                                   "dtype complex128"),
                                  (tmp_path / "d.safetensors", ones, "is a directory"),
                                  (tmp_path / "f" / "g.safetensors", ones, "is a file, not a folder")):
        with pytest.raises(UsageError, match=needle) as err:
            save_gradients(path, tensors)
        assert "\n" not in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.safetensors", "f"]
    assert save_gradients(os.fsencode(tmp_path / "b.safetensors"), ones).name == "b.safetensors"
