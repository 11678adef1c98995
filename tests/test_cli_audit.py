"""`naig audit` end to end, including every bad input of docs/design.md §6 that applies to audit."""

import csv
import hashlib
import io
import json
import os
import pickle
import re
import resource
import stat
import subprocess
import sys
from pathlib import Path

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings
from safetensors.torch import save_file
from typer.testing import CliRunner

from naig.io import save_gradients
from tests.conftest import assert_one_line_error, make_state, run_naig, warning_lines


def _digest(root: Path) -> dict:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def untouched(grads_dir):
    """Assert that no input file is modified or added by the test's commands."""
    before = _digest(grads_dir)
    yield grads_dir
    assert _digest(grads_dir) == before


def test_table_and_footer(untouched):
    r = run_naig("audit", untouched / "ref.safetensors", untouched / "workers")
    assert r.returncode == 0, r.stderr
    for word in (
        "w0 ",
        "w2 ",
        "cos",
        "verdict",
        "β =",
        "K_eff",
        "n = 1,510",
        "compression n/14",
        "MiB/s",
    ):
        assert word in r.stdout, word


def test_json_and_csv(untouched, tmp_path):
    (tmp_path / "out").mkdir()
    csv_path = tmp_path / "out" / "audit.csv"
    r = run_naig("audit", untouched / "ref.safetensors", untouched / "workers", "--json", "--csv", csv_path)
    assert r.returncode == 0 and warning_lines(r) == []
    doc = json.loads(r.stdout)
    assert [f["lag"] for f in doc["files"]] == [0, 10, 20]
    assert abs(sum(f["pi"] for f in doc["files"]) - 1) < 1e-12
    assert doc["n"] == 1510 and doc["bytes_read"] == 4 * 1510 * 4
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("file,lag,step,worker,cos") and len(lines) == 4
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(csv_path.stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600


def test_sketches_option(untouched):
    doc = json.loads(
        run_naig(
            "audit",
            untouched / "ref.safetensors",
            untouched / "workers",
            "--json",
            "--sketches",
            "4",
        ).stdout
    )
    assert doc["sketches"] == 4 and all(f["energy_std"] is not None for f in doc["files"])


def test_missing_file(untouched):
    r = run_naig("audit", untouched / "ref.safetensors", untouched / "nope.safetensors")
    assert_one_line_error(r, 1, "nope.safetensors", "no such file")


def test_directory_without_safetensors(untouched, tmp_path):
    (tmp_path / "empty").mkdir()
    r = run_naig("audit", untouched / "ref.safetensors", tmp_path / "empty")
    assert_one_line_error(r, 1, "empty", "no *.safetensors")


@pytest.mark.parametrize(("cut", "words"), [
    (0, "is empty (0 bytes)"),
    # under 8 bytes a cut-short file and another kind of file look alike: both are said
    (5, "has 5 bytes, fewer than the 8 of a safetensors file's header length: an incomplete file"),
    (20, "is truncated inside its header (20 bytes; the header alone needs"),
    (-1, "is truncated (3,"),  # inside the data: half of the file
])
def test_empty_or_truncated_says_incomplete(untouched, tmp_path, cut, words):
    good = (untouched / "workers" / "w1.safetensors").read_bytes()
    bad = tmp_path / "cut.safetensors"
    bad.write_bytes(good[: len(good) // 2 if cut == -1 else cut])
    r = run_naig("audit", untouched / "ref.safetensors", bad)
    assert_one_line_error(r, 1, str(bad), words, "incomplete", "copy it again")
    assert "re-save" not in r.stderr  # re-saving a cut copy cannot help


def test_a_short_text_file_is_said_to_be_maybe_not_safetensors(untouched, tmp_path):
    bad = tmp_path / "text.safetensors"
    bad.write_text("hello\n")
    r = run_naig("audit", untouched / "ref.safetensors", bad)
    assert_one_line_error(r, 1, str(bad), "has 6 bytes", "or not a safetensors file")


def test_a_file_holding_no_tensor_is_said_so_as_reference_and_as_worker(untouched, tmp_path):
    empty = tmp_path / "empty.safetensors"
    save_file({}, str(empty))
    r = run_naig("audit", empty, untouched / "workers")
    assert_one_line_error(r, 1, str(empty), "holds no tensor", "pass a reference")
    r = run_naig("audit", untouched / "ref.safetensors", empty)
    assert_one_line_error(r, 1, str(empty), "holds no tensor", "save the worker's")
    ints = tmp_path / "ints.safetensors"
    save_file({"step": torch.arange(3), "mask": torch.ones(2, dtype=torch.bool)}, str(ints))
    r = run_naig("audit", ints, untouched / "workers")
    assert_one_line_error(r, 1, str(ints), "no floating-point tensor to audit (its dtypes: BOOL, I64)")


def test_recursive_without_a_folder_is_refused(untouched):
    """It was accepted and did nothing (a review, 2026-12-07)."""
    workers = sorted((untouched / "workers").glob("*.safetensors"))
    r = run_naig("audit", untouched / "ref.safetensors", *workers, "--recursive")
    assert_one_line_error(r, 2, "--recursive", "no input is a folder")
    r = run_naig("audit", untouched / "ref.safetensors", untouched / "workers", "--recursive")
    assert r.returncode == 0, r.stderr


def test_trailing_garbage_is_invalid_not_truncated(untouched, tmp_path):
    bad = tmp_path / "long.safetensors"
    bad.write_bytes((untouched / "workers" / "w1.safetensors").read_bytes() + b"xx")
    r = run_naig("audit", untouched / "ref.safetensors", bad)
    assert_one_line_error(r, 1, str(bad), "not a valid safetensors file")


def test_git_lfs_pointer(untouched, tmp_path):
    p = tmp_path / "lfs.safetensors"
    p.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 12345\n")
    assert_one_line_error(run_naig("audit", untouched / "ref.safetensors", p), 1, "git-lfs", "git lfs pull")


@pytest.mark.parametrize("name", ["model.pt", "pytorch_model.bin", "last.ckpt", "sneaky.safetensors"])
def test_pickle_refused_never_loaded(untouched, tmp_path, name):
    p = tmp_path / name
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))

    p.write_bytes(pickle.dumps(Evil(), protocol=4))
    r = run_naig("audit", untouched / "ref.safetensors", p)
    assert_one_line_error(r, 1, name, "save_file")
    assert not marker.exists()


def test_torch_zip_checkpoint_refused(untouched, tmp_path):
    p = tmp_path / "ckpt.safetensors"
    torch.save({"w": torch.ones(2)}, p)
    assert_one_line_error(run_naig("audit", untouched / "ref.safetensors", p), 1, "pickle/zip")


def test_header_too_large(untouched, tmp_path):
    p = tmp_path / "huge.safetensors"
    p.write_bytes((300_000_000).to_bytes(8, "little") + b"{}")
    r = run_naig("audit", untouched / "ref.safetensors", p)
    assert_one_line_error(r, 1, "huge.safetensors", "header too large")


def test_mismatched_names_and_shapes(untouched, tmp_path):
    state = make_state(5)
    state["extra"] = torch.ones(3)
    save_gradients(tmp_path / "names.safetensors", state)
    r = run_naig("audit", untouched / "ref.safetensors", tmp_path / "names.safetensors")
    assert_one_line_error(r, 1, "'extra'", "--intersect")
    state = make_state(5)
    state["layer.bias"] = torch.ones(31)
    save_gradients(tmp_path / "shapes.safetensors", state)
    r = run_naig("audit", untouched / "ref.safetensors", tmp_path / "shapes.safetensors")
    assert_one_line_error(r, 1, "'layer.bias'", "[31]", "--intersect")
    r = run_naig("audit", untouched / "ref.safetensors", tmp_path / "shapes.safetensors", "--intersect")
    assert r.returncode == 0 and "1 not common" in r.stdout


def test_reference_as_worker_warns_and_skips(untouched):
    ref = untouched / "ref.safetensors"
    r = run_naig("audit", ref, ref, untouched / "workers", "--json")
    assert r.returncode == 0
    assert r.stderr.startswith("warning: ") and "reference itself" in r.stderr
    assert len(json.loads(r.stdout)["files"]) == 3


def test_nan_flagged_and_all_nan_fails(untouched, tmp_path):
    bad = make_state(3)
    bad["head.weight"][0, 0] = float("inf")
    save_gradients(tmp_path / "inf.safetensors", bad)
    r = run_naig(
        "audit",
        untouched / "ref.safetensors",
        tmp_path / "inf.safetensors",
        untouched / "workers" / "w1.safetensors",
        "--json",
    )
    assert r.returncode == 0
    files = json.loads(r.stdout)["files"]
    assert files[0]["verdict"] == "non-finite" and files[0]["pi"] == 0.0
    assert files[0]["energy"] is None and files[0]["nonfinite_tensor"] == "head.weight"
    r = run_naig("audit", untouched / "ref.safetensors", tmp_path / "inf.safetensors")
    assert_one_line_error(r, 1, "NaN/Inf", "inf.safetensors")


def test_zero_norm_shows_dash(untouched, tmp_path):
    save_gradients(tmp_path / "zero.safetensors", {k: torch.zeros_like(v) for k, v in make_state(0).items()})
    r = run_naig("audit", untouched / "ref.safetensors", tmp_path / "zero.safetensors")
    assert r.returncode == 0 and "—" in r.stdout


def test_low_precision_and_int_tensors(untouched, tmp_path):
    for dt in (torch.bfloat16, torch.float16, torch.float8_e4m3fn):
        state = {k: v.to(dt) for k, v in make_state(9).items()}
        state["num_batches_tracked"] = torch.tensor(7)
        state["mask"] = torch.ones(4, dtype=torch.bool)
        ref = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
        save_file(ref, tmp_path / "ref.safetensors")
        save_file(state, tmp_path / "lp.safetensors")
        r = run_naig("audit", tmp_path / "ref.safetensors", tmp_path / "lp.safetensors", "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["skipped_tensors"]["int/bool"] == 2
        assert doc["files"][0]["delta_norm"] == 0.0  # the upcast is exact


@pytest.mark.parametrize("beta", ["-1", "nan", "abc"])
def test_bad_beta(untouched, beta):
    r = run_naig("audit", untouched / "ref.safetensors", untouched / "workers", "--beta", beta)
    assert_one_line_error(r, 2, "--beta")


def test_bad_line_and_keys(untouched):
    r = run_naig("audit", untouched / "ref.safetensors", untouched / "workers", "--line", "1,2,3")
    assert_one_line_error(r, 2, "--line")
    r = run_naig("audit", untouched / "ref.safetensors", untouched / "workers", "--keys", "[")
    assert_one_line_error(r, 2, "--keys")


def test_csv_never_overwrites_an_input(untouched, tmp_path):
    target = untouched / "workers" / "w0.safetensors"
    r = run_naig("audit", untouched / "ref.safetensors", untouched / "workers", "--csv", target)
    assert_one_line_error(r, 2, "--csv", "safetensors file")
    # a checkpoint folder's index, which a folder argument reads (it was overwritten with the CSV)
    from tests.test_audit_inputs import save_sharded

    index = save_sharded(tmp_path / "ckpt", make_state(0))
    before = index.read_bytes()
    r = run_naig("audit", untouched / "ref.safetensors", tmp_path / "ckpt", "--csv", index)
    assert_one_line_error(r, 2, "--csv", "checkpoint index")
    assert index.read_bytes() == before


def test_error_writes_no_csv(untouched, tmp_path):
    out = tmp_path / "out.csv"
    r = run_naig("audit", untouched / "ref.safetensors", tmp_path / "missing.safetensors", "--csv", out)
    assert r.returncode == 1 and not out.exists()


@pytest.mark.parametrize("target", ["", "dir", "link", "missing/x.csv"])
def test_bad_csv_targets_refused_before_work(untouched, tmp_path, target):
    (tmp_path / "dir").mkdir()
    (tmp_path / "real.csv").write_text("keep me\n")
    (tmp_path / "link").symlink_to(tmp_path / "real.csv")
    before = sorted(p.name for p in tmp_path.iterdir())
    arg = "" if target == "" else str(tmp_path / target)
    r = run_naig("audit", untouched / "ref.safetensors", untouched / "workers", "--csv", arg)
    assert_one_line_error(r, 2, "--csv")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temp files left
    assert (tmp_path / "real.csv").read_text() == "keep me\n" and (tmp_path / "link").is_symlink()


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1", "1e-9", "1e308", "65537"])
def test_bad_chunk_mb(untouched, value):
    r = run_naig("audit", untouched / "ref.safetensors", untouched / "workers", "--chunk-mb", value)
    assert_one_line_error(r, 2, "--chunk-mb")


@pytest.mark.parametrize("args", [["--seed", str(2**64)], ["--seed", "-1"], ["--sketches", "0"]])
def test_out_of_range_seed_and_sketches(untouched, args):
    r = run_naig("audit", untouched / "ref.safetensors", untouched / "workers", *args)
    assert_one_line_error(r, 2, args[0])


def test_non_finite_reference_is_named(untouched, tmp_path):
    bad = make_state(0)
    bad["layer.bias"][0] = float("nan")
    save_gradients(tmp_path / "ref_nan.safetensors", bad)
    r = run_naig("audit", tmp_path / "ref_nan.safetensors", untouched / "workers")
    assert_one_line_error(r, 1, "ref_nan.safetensors", "reference", "'layer.bias'")


def test_duplicates_and_symlinks_audited_once(untouched, tmp_path):
    w0 = untouched / "workers" / "w0.safetensors"
    (tmp_path / "alias.safetensors").symlink_to(w0)
    r = run_naig("audit", untouched / "ref.safetensors", w0, w0, tmp_path / "alias.safetensors", "--json")
    assert r.returncode == 0
    assert len(json.loads(r.stdout)["files"]) == 1
    warnings = warning_lines(r)
    assert len(warnings) == 2 and all(w.startswith("warning: ") and "audited once" in w for w in warnings)


def test_warnings_stay_on_one_line(untouched):
    ref = untouched / "ref.safetensors"
    r = run_naig("audit", ref, ref, untouched / "workers", "--json")
    assert len(warning_lines(r)) == 1 and "reference itself" in r.stderr


def test_odd_metadata_shown_verbatim(untouched, tmp_path):
    save_file(make_state(1), tmp_path / "odd.safetensors", metadata={"lag": "²", "step": "9" * 5000})
    r = run_naig("audit", untouched / "ref.safetensors", tmp_path / "odd.safetensors", "--json")
    assert r.returncode == 0, r.stderr
    f = json.loads(r.stdout)["files"][0]
    assert f["lag"] == "²" and f["step"] == "9" * 5000


def test_empty_and_complex_tensors(untouched, tmp_path):
    ref = {**make_state(0), "empty": torch.ones(0, 5)}
    w = {**make_state(1), "empty": torch.ones(0, 5), "phase": torch.ones(3, dtype=torch.complex64)}
    save_file(ref, tmp_path / "r.safetensors")
    save_file(w, tmp_path / "w.safetensors")
    r = run_naig("audit", tmp_path / "r.safetensors", tmp_path / "w.safetensors", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["n"] == 1510


def test_keys_matching_nothing_is_a_usage_error(untouched):
    r = run_naig("audit", untouched / "ref.safetensors", untouched / "workers", "--keys", "nomatch")
    assert_one_line_error(r, 2, "--keys", "matches no floating-point tensor")


def test_renamed_pickle_hint_does_not_overwrite_the_input(untouched, tmp_path):
    p = tmp_path / "evil.safetensors"
    p.write_bytes(pickle.dumps({"w": 1}, protocol=4))
    r = run_naig("audit", untouched / "ref.safetensors", p)
    assert_one_line_error(r, 1, "evil.converted.safetensors")


def test_markup_in_names_and_metadata_is_shown_literally(untouched, tmp_path):
    save_file(make_state(1), tmp_path / "[bold]w1.safetensors", metadata={"lag": "[/x]", "worker": "[red]"})
    save_file(make_state(2), tmp_path / "w2.safetensors", metadata={"lag": "3"})
    r = run_naig(
        "audit", untouched / "ref.safetensors", tmp_path / "[bold]w1.safetensors", tmp_path / "w2.safetensors"
    )
    assert r.returncode == 0, r.stderr
    assert "[bold]w1" in r.stdout and "[/x]" in r.stdout and "Traceback" not in r.stderr


def _run_at(width: int, *args) -> subprocess.CompletedProcess:
    return run_naig(*args, columns=width)


@pytest.fixture
def wide_inputs(tmp_path: Path) -> Path:
    """Long names, every metadata key varying, one file without metadata, one 1e30 gradient."""
    ref = make_state(0)
    save_gradients(tmp_path / "ref.safetensors", ref)
    for k in range(3):
        state = {n: ref[n] + make_state(10 + k, scale=0.3 * (k + 1))[n] for n in ref}
        save_gradients(tmp_path / "w" / f"a_rather_long_worker_file_name_{k}.safetensors", state,
                       lag=5 * k, step=1000 + k, worker=k)
    save_gradients(tmp_path / "w" / "no_metadata.safetensors", make_state(7))
    save_gradients(tmp_path / "w" / "huge.safetensors", make_state(8, scale=1e30))
    return tmp_path


@pytest.mark.parametrize("width", [80, 60, 48])
@pytest.mark.parametrize("sketches", ["1", "3"])
def test_table_never_cuts_a_number(wide_inputs, width, sketches):
    args = ("audit", wide_inputs / "ref.safetensors", wide_inputs / "w", "--sketches", sketches)
    r = _run_at(width, *args)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert all(len(line) <= width for line in lines) and "…" not in r.stdout
    files = json.loads(_run_at(width, *args, "--json").stdout)["files"]
    rows = [line for line in lines if line.split() and line.split()[-1] in ("integrated", "frozen")]
    assert len(rows) == len(files)
    for f, row in zip(files, rows, strict=True):
        assert f"{f['pi']:.4f}" in row.split() and f["verdict"] in row.split()
        e = f["energy"]
        assert (f"{e:.3e}" if e >= 1e6 else f"{e:.2f}") in row.split()
    if width == 60:
        assert "left out to fit 60 columns" in r.stdout
    for item in ("K_eff = ", "compression n/14 = ", "tensors skipped: ", "E vs lag: Spearman r = "):
        line = next(ln for ln in lines if item in ln)  # each footer item whole on one line
        assert re.search(re.escape(item) + r"\S", line), line


@pytest.mark.parametrize("width", [48, 44, 40, 30])
def test_narrow_terminals_keep_the_file_column_and_whole_cells(wide_inputs, width):
    """Below the width of file, E ± spread, π and verdict, E loses its spread; below that of
    file, E, π and verdict (42 columns here) the table keeps them all and the terminal wraps."""
    r = _run_at(width, "audit", wide_inputs / "ref.safetensors", wide_inputs / "w")
    assert r.returncode == 0, r.stderr
    files = json.loads(_run_at(width, "audit", wide_inputs / "ref.safetensors", wide_inputs / "w",
                                "--json").stdout)["files"]
    verdicts = (["integrated"], ["frozen"])
    rows = [line.split() for line in r.stdout.splitlines() if line.split()[-1:] in verdicts]
    assert len(rows) == len(files) and "…" not in r.stdout
    for f, row in zip(files, rows, strict=True):
        stem = Path(f["file"]).name.removesuffix(".safetensors")
        assert stem.startswith(row[0]) and len(row[0]) >= min(10, len(stem))  # the file column, folded
        assert row[-1] == f["verdict"] and f"{f['pi']:.4f}" in row
    assert ("spread of E" in r.stdout) == (width < 52)


def test_huge_values_are_compact(wide_inputs):
    r = run_naig("audit", wide_inputs / "ref.safetensors", wide_inputs / "w" / "huge.safetensors")
    assert r.returncode == 0, r.stderr
    assert max(len(line) for line in r.stdout.splitlines()) <= 200
    assert re.search(r"\d\.\d{3}e\+6\d", r.stdout) and not re.search(r"\d{12}", r.stdout)


def test_title_says_for_all_only_when_every_file_has_the_value(tmp_path):
    save_gradients(tmp_path / "ref.safetensors", make_state(0))
    save_gradients(tmp_path / "a.safetensors", make_state(1), lag=5, step=7)
    save_gradients(tmp_path / "b.safetensors", make_state(2), step=7)
    r = run_naig("audit", *(tmp_path / f"{n}.safetensors" for n in ("ref", "a", "b")))
    assert r.returncode == 0, r.stderr
    title = r.stdout.splitlines()[0]
    assert "step 7 for all" in title and "lag" not in title
    header = next(line for line in r.stdout.splitlines() if "verdict" in line)
    assert header.split()[:2] == ["file", "lag"]


def test_lag_correlation_in_footer_and_json(grads_dir):
    args = ("audit", grads_dir / "ref.safetensors", grads_dir / "workers")
    doc = json.loads(run_naig(*args, "--json").stdout)["lag_correlation"]
    assert doc["files"] == 3 and doc["exact"] is True
    assert doc["delta_norm"]["spearman"] == 1.0 and doc["delta_norm"]["p_value"] == pytest.approx(2 / 6)
    out = run_naig(*args).stdout
    assert "‖Δ‖ vs lag: Spearman r = +1.00 (p = 0.33)" in out and "(permutation test, exact, 3 files)" in out


def test_undecodable_file_names_in_table_csv_and_json(untouched, tmp_path):
    raw = os.fsdecode(b"w\xff.safetensors")
    (tmp_path / raw).write_bytes((untouched / "workers" / "w1.safetensors").read_bytes())
    args = ("audit", untouched / "ref.safetensors", tmp_path / raw)
    r = run_naig(*args, "--csv", tmp_path / "out.csv")
    assert r.returncode == 0 and "w\\xff" in r.stdout, r.stderr
    assert "w\\xff.safetensors" in (tmp_path / "out.csv").read_text(encoding="utf-8")
    r = run_naig(*args, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["files"][0]["file"].endswith("w\\xff.safetensors")


def test_intersect_with_nothing_common_names_the_file_and_prefix(untouched, tmp_path):
    save_gradients(tmp_path / "ddp.safetensors", {"module." + k: v for k, v in make_state(1).items()})
    r = run_naig("audit", untouched / "ref.safetensors", tmp_path / "ddp.safetensors", "--intersect")
    assert_one_line_error(r, 1, str(tmp_path / "ddp.safetensors"), "prefix 'module.'")


def _shard(folder: Path, state: dict, meta: dict) -> None:
    folder.mkdir(parents=True)
    names = list(state)
    weight_map = {}
    for i, keys in enumerate((names[:1], names[1:]), start=1):
        shard = f"model-{i:05d}-of-00002.safetensors"
        save_file({k: state[k] for k in keys}, folder / shard, metadata=meta)
        weight_map.update(dict.fromkeys(keys, shard))
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def test_sharded_checkpoints_match_single_files(tmp_path):
    ref = make_state(0)
    save_file(ref, tmp_path / "ref.safetensors")
    for k in (1, 2):
        state = {n: ref[n] + make_state(k, scale=0.1 * k)[n] for n in ref}
        save_file(state, tmp_path / f"single{k}.safetensors", metadata={"step": str(1000 * k)})
        _shard(tmp_path / f"ckpt_step{1000 * k}", state, {"step": str(1000 * k)})
    base = ("audit", tmp_path / "ref.safetensors")
    single = json.loads(run_naig(*base, tmp_path / "single1.safetensors", tmp_path / "single2.safetensors",
                                 "--json").stdout)
    keys = ("cos", "delta_norm", "energy", "friction", "pi", "step")
    for workers in ([tmp_path / "ckpt_step1000", tmp_path / "ckpt_step2000"],
                    [tmp_path / f"ckpt_step{s}" / "model.safetensors.index.json" for s in (1000, 2000)]):
        r = run_naig(*base, *workers, "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert [[f[k] for k in keys] for f in doc["files"]] == [[f[k] for k in keys] for f in single["files"]]
        assert doc["n"] == single["n"] and doc["bytes_read"] == single["bytes_read"]
    r = run_naig("audit", tmp_path / "ckpt_step1000", tmp_path / "ckpt_step2000")
    assert r.returncode == 0, r.stderr
    assert "reference ckpt_step1000/model" in r.stdout and "ckpt_step2000/model" in r.stdout


def test_recursive_folders(tmp_path, untouched):
    (tmp_path / "runs" / "a").mkdir(parents=True)
    for k, sub in enumerate(("a", "b")):
        (tmp_path / "runs" / sub).mkdir(exist_ok=True)
        save_gradients(tmp_path / "runs" / sub / f"w{k}.safetensors", make_state(k + 1), lag=k)
    ref = untouched / "ref.safetensors"
    assert_one_line_error(run_naig("audit", ref, tmp_path / "runs"), 1, "--recursive")
    r = run_naig("audit", ref, tmp_path / "runs", "--recursive", "--json")
    assert r.returncode == 0, r.stderr
    names = [Path(f["file"]).name for f in json.loads(r.stdout)["files"]]
    assert names == ["w0.safetensors", "w1.safetensors"]


def test_help_describes_ref_and_files():
    out = _run_at(100, "audit", "--help").stdout
    for words in ("ref", "files", "Reference the workers are scored", "sharded checkpoint", "--recursive"):
        assert words in out, words


# Property: no input file, however broken, gives a traceback (CLI run in-process, so it stays fast).
_DTYPES = ["F32", "F16", "BF16", "F64", "F8_E4M3", "I64", "BOOL", "C64", "XX", 7, None]
_runner = CliRunner()


def _audit_in_process(ref: Path, worker: Path) -> None:
    from naig_cli.main import app

    r = _runner.invoke(app, ["audit", str(ref), str(worker)])
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.exit_code in (0, 1), (r.exit_code, r.stderr)
    if r.exit_code == 1:
        lines = [ln for ln in r.stderr.splitlines() if not ln.startswith("warning: ")]
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr


def _header(draw) -> bytes:
    """A random JSON header (names, dtypes, shapes, offsets, metadata), length field and data."""
    entries = {}
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(["layer.weight", "layer.bias", "x", "__metadata__", ""]))
        shape = draw(st.lists(st.integers(-2, 2**33), max_size=3))
        start = draw(st.integers(-4, 5000))
        entries[name] = {"dtype": draw(st.sampled_from(_DTYPES)), "shape": shape,
                         "data_offsets": [start, start + draw(st.integers(-4, 5000))]}
    if draw(st.booleans()):
        entries["__metadata__"] = draw(st.sampled_from([{"lag": "3"}, {"lag": 3}, [], "x", {"step": None}]))
    text = json.dumps(entries).encode()
    length = draw(st.sampled_from([len(text), len(text) + 5, max(0, len(text) - 3), 2**40]))
    return length.to_bytes(8, "little") + text + draw(st.binary(max_size=6000))


def _broken(draw, valid: bytes) -> bytes:
    """Random bytes, a random header, a cut or a flipped byte of a valid file."""
    kind = draw(st.sampled_from(["bytes", "header", "cut", "flip"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "header":
        return _header(draw)
    if kind == "cut":
        return valid[: draw(st.integers(0, len(valid) - 1))]
    pos = draw(st.integers(0, len(valid) - 1))
    return valid[:pos] + bytes([valid[pos] ^ draw(st.integers(1, 255))]) + valid[pos + 1 :]


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    save_gradients(root / "valid.safetensors", make_state(3), lag=1)
    save_gradients(root / "ref.safetensors", make_state(0))
    return root


@settings(max_examples=150, deadline=None, derandomize=True)
@given(data=st.data())
def test_fuzzed_files_never_give_a_traceback(fuzz_dir, data):
    ref, bad = fuzz_dir / "ref.safetensors", fuzz_dir / "bad.safetensors"
    content = _broken(data.draw, (fuzz_dir / "valid.safetensors").read_bytes())
    bad.write_bytes(content)
    ref_before = ref.read_bytes()
    if data.draw(st.booleans()):
        _audit_in_process(bad, ref)
    else:
        _audit_in_process(ref, bad)
    assert ref.read_bytes() == ref_before and bad.read_bytes() == content  # nothing written


def _numbers(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k not in ("seconds", "throughput_bytes_per_s")}


def test_threads_option_gives_the_same_json(untouched):
    docs = [json.loads(run_naig("audit", untouched / "ref.safetensors", untouched / "workers", "--json",
                                "--chunk-mb", "0.0625", "--threads", t).stdout) for t in ("1", "2")]
    assert _numbers(docs[0]) == _numbers(docs[1])
    r = run_naig("audit", untouched / "ref.safetensors", untouched / "workers", "--threads", "0")
    assert r.returncode == 2 and "--threads" in r.stderr


def test_table_shows_the_energy_spread_and_an_unstable_ranking(untouched):
    args = ("audit", untouched / "ref.safetensors", untouched / "workers", "--seed", "3")
    doc = json.loads(run_naig(*args, "--json").stdout)
    table = run_naig(*args).stdout
    assert "E ± spread" in table
    for f in doc["files"]:
        assert f"{f['energy']:.2f} ± {f['energy_spread']:.2f}" in table
    notice = [ln for ln in table.splitlines() if ln.startswith("note: ranking by E not stable")]
    assert len(notice) == (0 if doc["ranking_stable"] else 1)
    assert not doc["ranking_stable"]  # w1 (6.5 ± 7.8) and w2 (12.2 ± 29.1) overlap at seed 3


def test_fnuz_files_are_audited_by_both_kernel_paths(tmp_path):
    for name, seed in (("ref", 0), ("w", 1)):
        state = {k: v.to(torch.float8_e4m3fnuz) for k, v in make_state(seed).items()}
        state["head.weight"] = state["head.weight"].to(torch.float32).to(torch.float8_e5m2fnuz)
        save_file(state, tmp_path / f"{name}.safetensors")
    args = ("audit", tmp_path / "ref.safetensors", tmp_path / "w.safetensors", "--json")
    fast = json.loads(run_naig(*args).stdout)
    env = {**os.environ, "NAIG_PURE_NUMPY": "1", "COLUMNS": "200"}
    slow = json.loads(subprocess.run([sys.executable, "-m", "naig_cli", *map(str, args)], capture_output=True,
                                     text=True, env=env, timeout=300).stdout)
    assert fast["n"] == 1510 and sum(fast["skipped_tensors"].values()) == 0
    for a, b in zip(fast["files"], slow["files"], strict=True):
        for key in ("energy", "energy_spread", "cos", "delta_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-12)


def test_recursive_rows_with_the_same_file_name_are_told_apart(tmp_path):
    save_gradients(tmp_path / "ref.safetensors", make_state(0))
    for step in (100, 200):
        save_gradients(tmp_path / "ckpts" / f"s{step}" / "worker0.safetensors", make_state(step))
    r = run_naig("audit", tmp_path / "ref.safetensors", tmp_path / "ckpts", "--recursive")
    assert r.returncode == 0, r.stderr
    assert "s100/worker0" in r.stdout and "s200/worker0" in r.stdout


def test_csv_dash_prints_the_csv_instead_of_the_table(untouched, tmp_path):
    args = ("audit", untouched / "ref.safetensors", untouched / "workers")
    raw = subprocess.run([sys.executable, "-m", "naig_cli", *map(str, args), "--csv", "-"],
                         capture_output=True, timeout=300, cwd=tmp_path)
    assert raw.returncode == 0, raw.stderr
    assert b"\r" not in raw.stdout  # lines end in \n on a pipe
    r = subprocess.CompletedProcess(raw.args, 0, raw.stdout.decode(), raw.stderr.decode())
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    files = json.loads(run_naig(*args, "--json").stdout)["files"]
    assert [row["file"] for row in rows] == [f["file"] for f in files]
    assert [float(row["pi"]) for row in rows] == [f["pi"] for f in files]
    assert not (tmp_path / "-").exists()


def test_csv_dash_with_json_is_a_usage_error(untouched, tmp_path):
    r = subprocess.run([sys.executable, "-m", "naig_cli", "audit", str(untouched / "ref.safetensors"),
                        str(untouched / "workers"), "--csv", "-", "--json"], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert_one_line_error(r, 2, "--csv", "--json")
    assert not (tmp_path / "-").exists() and r.stdout == ""


def test_running_out_of_file_descriptors_is_one_line_naming_the_limit(tmp_path):
    """Each file is opened once per audit, whatever the thread count; past the process's limit
    the error says so (not a bare "[Errno 24]")."""
    save_gradients(tmp_path / "ref.safetensors", make_state(0))
    for k in range(40):
        save_gradients(tmp_path / "w" / f"w{k:02d}.safetensors", make_state(k + 1))
    args = [sys.executable, "-m", "naig_cli", "audit", str(tmp_path / "ref.safetensors"), str(tmp_path / "w")]

    def limit(n: int):  # noqa: ANN202
        return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    ok = subprocess.run([*args, "--threads", "8"], capture_output=True, text=True, timeout=300,
                        preexec_fn=limit(96))  # 41 files + Python's own: enough when shared by threads
    assert ok.returncode == 0, ok.stderr
    r = subprocess.run(args, capture_output=True, text=True, timeout=300, preexec_fn=limit(40))
    assert_one_line_error(r, 1, "may open no more files", "ulimit -n")


def test_control_characters_in_names_never_reach_the_terminal(untouched, tmp_path):
    """An escape sequence in a file name is shown as \\x1b in the table, warnings and errors."""
    evil = tmp_path / "w\x1b[31mred.safetensors"
    save_gradients(evil, make_state(1))
    r = run_naig("audit", untouched / "ref.safetensors", evil)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\\x1b[31mred" in r.stdout
    missing = run_naig("audit", untouched / "ref.safetensors", tmp_path / "gone\x1b[2J.safetensors")
    assert_one_line_error(missing, 1, "\\x1b[2J")
    assert "\x1b" not in missing.stderr


def test_an_infinite_figure_is_a_dash_in_the_table(tmp_path):
    """‖x − r‖² beyond float64 (values ~1e200 in a float64 file): '—' in the table, null in JSON."""
    ref = {"a": torch.ones(10, dtype=torch.float64)}
    save_gradients(tmp_path / "ref.safetensors", ref)
    save_gradients(tmp_path / "huge.safetensors", {"a": torch.full((10,), 1e200, dtype=torch.float64)})
    save_gradients(tmp_path / "ok.safetensors", {"a": torch.full((10,), 2.0, dtype=torch.float64)})
    args = ("audit", tmp_path / "ref.safetensors", tmp_path / "huge.safetensors", tmp_path / "ok.safetensors")
    r = run_naig(*args)
    assert r.returncode == 0 and warning_lines(r) == [], r.stderr  # no RuntimeWarning from the overflow
    assert "inf" not in r.stdout.lower().replace("integrated", "")
    row = next(line for line in r.stdout.splitlines() if line.startswith("huge"))
    assert "—" in row
    assert json.loads(run_naig(*args, "--json").stdout)["files"][0]["delta_norm"] is None


def test_only_the_reference_as_worker_says_why_nothing_is_left(untouched):
    ref = untouched / "ref.safetensors"
    r = run_naig("audit", ref, ref)
    assert_one_line_error(r, 2, "no worker files to audit", "is the reference itself")


def test_without_the_c_kernel_a_refused_input_is_one_line_and_an_audit_says_so_once(untouched, tmp_path):
    """A machine without a C compiler at install time: the notice comes once the audit reads data,
    never beside the one line of a refused input."""
    code = ("import sys, naig.sketch.kernels as k; k.HAVE_COMPILED = False; from naig_cli.main import app; "
            "app(prog_name='naig')")

    def naig(*args) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != "NAIG_PURE_NUMPY"}
        return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                              timeout=120, env=env)

    missing = tmp_path / "missing.safetensors"
    r = naig("audit", missing, untouched / "workers")
    assert_one_line_error(r, 1, "no such file")
    assert len(r.stderr.splitlines()) == 1, r.stderr  # the error line alone, no notice beside it
    r = naig("audit", untouched / "ref.safetensors", untouched / "workers", "--json")
    assert r.returncode == 0, r.stderr
    notes = [ln for ln in r.stderr.splitlines() if "C sketch kernel was not built" in ln]
    assert len(notes) == 1 and notes[0].startswith("warning: ") and len(json.loads(r.stdout)["files"]) == 3
