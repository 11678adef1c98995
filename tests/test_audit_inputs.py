"""Audit inputs: sharded checkpoints as one, folder rules, reads that fail mid-stream (docs/design.md §6)."""

import json
import os
import time
from pathlib import Path

import pytest
from safetensors.torch import save_file

from naig.audit import AuditConfig, run_audit
from naig.audit.inputs import expand_inputs, inspect_input
from naig.errors import DataError, UsageError
from tests.conftest import make_state


def save_sharded(folder: Path, state: dict, split: int = 1, metadata: dict | None = None) -> Path:
    """Write ``state`` as two shards plus a Hugging Face style index; returns the index path."""
    folder.mkdir(parents=True, exist_ok=True)
    names = list(state)
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    shards = {first: names[:split], second: names[split:]}
    weight_map = {}
    for shard, keys in shards.items():
        save_file({k: state[k] for k in keys}, folder / shard, metadata=metadata)
        weight_map.update({k: shard for k in keys})
    index = folder / "model.safetensors.index.json"
    total = sum(v.numel() * v.element_size() for v in state.values())
    index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return index


def _numbers(result) -> list[tuple]:
    return [(f.cos, f.delta_norm, f.energy, f.friction, f.pi, f.verdict) for f in result.files]


def _close(a: list[tuple], b: list[tuple]) -> None:
    for ra, rb in zip(a, b, strict=True):
        assert ra[-1] == rb[-1]
        assert ra[:-1] == pytest.approx(rb[:-1], rel=1e-12, abs=1e-12)


@pytest.fixture
def sharded(tmp_path: Path) -> Path:
    """The same reference and two workers, as single files and as 2-shard checkpoints."""
    ref = make_state(0)
    for k in range(3):
        state = ref if k == 0 else {n: ref[n] + make_state(10 + k, scale=0.2 * k)[n] for n in ref}
        save_file(state, tmp_path / f"single{k}.safetensors", metadata={"lag": str(5 * k)})
        save_sharded(tmp_path / f"ckpt{k}", state, metadata={"lag": str(5 * k)})
    return tmp_path


def test_sharded_worker_gives_the_single_file_numbers(sharded):
    cfg = AuditConfig(beta=1.0, chunk=300)  # several batches, each crossing a shard boundary
    ref = sharded / "single0.safetensors"
    single = run_audit(ref, [sharded / "single1.safetensors", sharded / "single2.safetensors"], cfg)
    index_form = [sharded / f"ckpt{k}" / "model.safetensors.index.json" for k in (1, 2)]
    for workers in (index_form, [sharded / "ckpt1", sharded / "ckpt2"]):
        got = run_audit(ref, workers, cfg)
        assert _numbers(got) == _numbers(single)  # same plan order: bit for bit
        assert got.n == single.n and got.bytes_read == single.bytes_read
        assert [f.meta("lag") for f in got.files] == [5, 10]


def test_sharded_reference_gives_the_single_file_numbers(sharded):
    cfg = AuditConfig(beta=1.0, chunk=300)
    single = run_audit(sharded / "single0.safetensors", [sharded / "single1.safetensors"], cfg)
    for ref in (sharded / "ckpt0", sharded / "ckpt0" / "model.safetensors.index.json"):
        got = run_audit(ref, [sharded / "single1.safetensors"], cfg)
        _close(_numbers(got), _numbers(single))  # tensors in shard order: summation order differs
        assert got.reference == sharded / "ckpt0" / "model.safetensors.index.json"


def test_several_checkpoint_folders_compared(sharded):
    r = run_audit(sharded / "ckpt0", [sharded / "ckpt1", sharded / "ckpt2"], AuditConfig(beta=1.0))
    assert [f.path.parent.name for f in r.files] == ["ckpt1", "ckpt2"]
    assert r.files[0].delta_norm < r.files[1].delta_norm


def test_checkpoint_metadata_and_layout(sharded):
    info = inspect_input(sharded / "ckpt1")
    assert info.metadata["lag"] == "5" and int(info.metadata["total_size"]) == 4 * 1510
    assert list(info.tensors) == ["layer.weight", "head.weight", "layer.bias"]  # shard by shard
    assert info.file_of("layer.weight").name == "model-00001-of-00002.safetensors"
    assert info.file_of("layer.bias").name == "model-00002-of-00002.safetensors"


def test_folder_rules(sharded, tmp_path):
    runs = tmp_path / "runs"
    (runs / "a").mkdir(parents=True)
    save_file(make_state(1), runs / "a" / "w1.safetensors")
    save_file(make_state(2), runs / "top.safetensors")
    save_sharded(runs / "b" / "ckpt", make_state(3))
    assert [p.name for p in expand_inputs([runs])] == ["top.safetensors"]
    got = [p.relative_to(runs).as_posix() for p in expand_inputs([runs], recursive=True)]
    assert got == ["a/w1.safetensors", "b/ckpt/model.safetensors.index.json", "top.safetensors"]
    (tmp_path / "nested" / "deeper").mkdir(parents=True)
    save_file(make_state(1), tmp_path / "nested" / "deeper" / "w.safetensors")
    with pytest.raises(DataError, match="no \\*.safetensors files; pass `recursive`"):
        expand_inputs([tmp_path / "nested"])


def test_reference_folder_without_index_is_refused(sharded):
    with pytest.raises(UsageError, match="one sharded checkpoint"):
        run_audit(sharded, [sharded / "single1.safetensors"])


def test_broken_indexes_are_named(sharded, tmp_path):
    index = save_sharded(tmp_path / "c", make_state(1))
    (tmp_path / "c" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(DataError, match="model-00002-of-00002.safetensors: no such file"):
        inspect_input(index)
    index = save_sharded(tmp_path / "d", make_state(1))
    doc = json.loads(index.read_text())
    doc["weight_map"]["ghost"] = "model-00001-of-00002.safetensors"
    index.write_text(json.dumps(doc))
    with pytest.raises(DataError, match="tensor 'ghost' is listed in shard model-00001.*incomplete"):
        inspect_input(index)
    index.write_text("{not json")
    with pytest.raises(DataError, match="not a readable checkpoint index"):
        inspect_input(index)
    index.write_text("[]")
    with pytest.raises(DataError, match="no \"weight_map\""):
        inspect_input(index)
    (tmp_path / "d" / "other.safetensors.index.json").write_text("{}")
    with pytest.raises(DataError, match="holds 2 checkpoint indexes"):
        inspect_input(tmp_path / "d")


def test_file_truncated_while_the_audit_streams_it(sharded):
    victim = sharded / "single2.safetensors"
    calls = []

    def truncate_after_first_batch(nbytes: int) -> None:
        calls.append(nbytes)
        if len(calls) == 1:
            victim.write_bytes(victim.read_bytes()[:200])

    with pytest.raises(DataError) as err:
        run_audit(sharded / "single0.safetensors", [sharded / "single1.safetensors", victim],
                  AuditConfig(chunk=100), progress=truncate_after_first_batch)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{victim}: truncated or changed while being audited")
    assert "nothing is still writing it" in msg


def test_file_rewritten_in_place_while_the_audit_streams_it(sharded):
    """Same size, same inode, new bytes: the numbers could mix two versions, so it is refused."""
    victim = sharded / "single2.safetensors"
    calls = []

    def rewrite_after_first_batch(nbytes: int) -> None:
        calls.append(nbytes)
        if len(calls) == 1:
            time.sleep(0.02)  # past the file system's timestamp tick
            data = bytearray(victim.read_bytes())
            data[-8:] = bytes(8)  # the last two float32 scalars become 0
            with victim.open("r+b") as fh:
                fh.write(data)

    with pytest.raises(DataError, match=f"^{victim}: truncated or changed while being audited; make sure"):
        run_audit(sharded / "single0.safetensors", [sharded / "single1.safetensors", victim],
                  AuditConfig(chunk=100), progress=rewrite_after_first_batch)


def test_file_replaced_by_rename_is_audited_as_it_was_opened(sharded, tmp_path):
    """The common "save to a temporary name, rename over" pattern: the audit keeps reading the
    file it opened, so its numbers are those of one version, not a mix."""
    victim = sharded / "single2.safetensors"
    original = tmp_path / "original.safetensors"
    original.write_bytes(victim.read_bytes())
    ref, cfg = sharded / "single0.safetensors", AuditConfig(chunk=100)
    calls = []

    def replace_after_first_batch(nbytes: int) -> None:
        calls.append(nbytes)
        if len(calls) == 1:
            save_file(make_state(99), sharded / "new.safetensors")
            os.replace(sharded / "new.safetensors", victim)

    got = run_audit(ref, [sharded / "single1.safetensors", victim], cfg, progress=replace_after_first_batch)
    want = run_audit(ref, [sharded / "single1.safetensors", original], cfg)
    assert len(calls) > 1 and _numbers(got) == _numbers(want)


def test_shard_truncated_while_the_audit_streams_it(sharded):
    shard = sharded / "ckpt1" / "model-00002-of-00002.safetensors"
    calls = []

    def truncate(nbytes: int) -> None:
        calls.append(nbytes)
        if len(calls) == 1:
            shard.write_bytes(b"")

    with pytest.raises(DataError, match=f"^{shard}: truncated or changed while being audited"):
        run_audit(sharded / "single0.safetensors", [sharded / "ckpt1"], AuditConfig(chunk=100),
                  progress=truncate)


def test_a_stale_copy_in_another_shard_is_not_read(tmp_path):
    """The index places each tensor in one shard; a second shard holding a tensor of the same name (a
    stale or tied copy) was read instead when it sorted last: cos 0.70 for identical checkpoints."""
    ref = make_state(0)
    names = list(ref)
    a = save_sharded(tmp_path / "a", ref)
    b = save_sharded(tmp_path / "b", ref)
    second = b.parent / "model-00002-of-00002.safetensors"
    save_file({**{k: ref[k] for k in names[1:]}, names[0]: ref[names[0]] * 0}, second)  # a stale copy
    r = run_audit(a, [b], AuditConfig(beta=1.0))
    assert r.files[0].cos == pytest.approx(1.0, abs=1e-12) and r.files[0].delta_norm == 0.0


@pytest.mark.parametrize("shard", ["../out.safetensors", "/tmp/abs.safetensors", "sub/x.safetensors", ".."])
def test_an_index_naming_a_shard_outside_its_folder_or_nested_thousands_deep_is_one_line(tmp_path, shard):
    """A weight_map entry of "../x" or an absolute path was read from outside the checkpoint folder;
    JSON nested ~3,000 deep was a RecursionError traceback."""
    index = save_sharded(tmp_path / "ckpt", make_state(0))
    doc = json.loads(index.read_text())
    doc["weight_map"][next(iter(doc["weight_map"]))] = shard
    index.write_text(json.dumps(doc))
    with pytest.raises(DataError, match="not a file name in the index's folder") as err:
        inspect_input(index)
    assert "\n" not in str(err.value)
    index.write_text("[" * 5000 + "]" * 5000)
    with pytest.raises(DataError, match="not a readable checkpoint index"):
        inspect_input(index)
