"""Issue 32: under bad input and broken disks the monitor never takes training down, its logs stay
readable, and every surface answers in one line. One test (or table row) per kind of the issue:

1. a logging failure never ends training (3 gloo ranks: a full device, a folder where no file can be
   made, a real 64 KiB tmpfs that fills and a read-only one when this runs as root);
2. a log cut mid-line shows every complete step and says what was cut;
3. ranks with different layouts stop on every rank with one line naming them;
4. sparse, meta and DTensor gradients (3 gloo ranks for DTensor);
5. overflowing squares labelled as such; unbounded requests refused before allocating;
6. ``naig detect --lr 1e30``: a diverged clean run is an error;
7. config files; 8. hostile files; 9. library entry points; 10. K = 2 verdicts; 11. messages.

CLI rows run like tests/test_adversarial.py's: a process of its own (``run_python``) in its own session,
its address space capped (``RLIMIT_AS``), one ``error:`` line on stderr, the exit status owed,
nothing written to the working directory and no process left.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from naig.arrivals import ArrivalModel
from naig.arrivals.predict import predict
from naig.errors import DataError, UsageError
from naig.gibbs import frozen_mask, naig_weights
from naig.monitor import Detector, Monitor
from naig.monitor.records import MAX_WORLD, JsonlRecords, LoggerRecords, read_log
from naig.router import Router
from tests.conftest import assert_no_leftovers, run_python
from tests.test_adversarial import capped_cli

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 90


# -- the CLI rows ---------------------------------------------------------------------------------

def _cli(args: list[str], cwd: Path, timeout: float = TIMEOUT) -> tuple[int, str, str]:
    """``python -m naig_cli ARGS``, capped, in its own session: (status, stdout, stderr); no process left."""
    r = capped_cli(args, cwd, timeout, str(args))
    return r.returncode, r.stdout, r.stderr


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``root`` with its size and time (links not followed: the fixture has a loop)."""
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in root.rglob("*")}


def _one_line(args: list[str], cwd: Path, code: int, *needles: str, timeout: float = TIMEOUT) -> str:
    before = _snapshot(cwd)
    rc, out, err = _cli(args, cwd, timeout)
    lines = err.splitlines()
    assert rc == code, (args, rc, err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, err[-2000:])
    assert "Traceback" not in err and "MemoryError" not in err and "Unable to allocate" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert out == "", out[:500]
    assert _snapshot(cwd) == before, f"{args}: wrote to the working directory"
    return lines[0]


def _monitor_log(path: Path, steps: int = 6) -> Path:
    """A real monitor JSONL of 3 ranks (their signals fed through a detector, as observe does)."""
    from naig.monitor import rank_signals

    writer = JsonlRecords(path)
    mon = writer.attach(Monitor(window=3))
    mon.detector = Detector(3, window=3)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        g = rng.normal(size=(3, 40))
        mean = g.mean(0)
        sig = rank_signals(rng.normal(size=(3, 14)), (g * g).sum(1), np.zeros(3), dots=g @ mean,
                           sq_dists=((g - mean) ** 2).sum(1))
        d = mon.detector.update(sig)
        for w in mon.writers:
            w(sig, d)
    writer.close()
    return path


@pytest.fixture
def files(tmp_path: Path) -> Path:
    """A working directory of hostile files (each named for what is wrong with it)."""
    lines = _monitor_log(tmp_path / "good.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "good.jsonl").unlink()
    header, step = json.loads(lines[0]), json.loads(lines[1])
    (tmp_path / "cut.jsonl").write_text("".join(lines[:4]) + lines[4][:70])  # steps 1..3, step 4 cut
    big = dict(header, world=10**8, hosts=[])
    (tmp_path / "world-1e8.jsonl").write_text(json.dumps(big) + "\n" + json.dumps(step) + "\n")
    (tmp_path / "world-2p62.jsonl").write_text(json.dumps(dict(big, world=2**62)) + "\n" + lines[1])
    with open(tmp_path / "long-line.jsonl", "w") as fh:  # a header, then 1 GB without a newline (sparse)
        fh.write(lines[0])
        fh.truncate(len(lines[0]) + 10**9)
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / "deep.jsonl").write_text(lines[0] + '{"type": "step", "step": ' + deep + "}\n")
    (tmp_path / "step-1e30.jsonl").write_text(lines[0] + json.dumps(dict(step, step=10**30)) + "\n")
    (tmp_path / "no-signal.jsonl").write_text(lines[0] + json.dumps(dict(step, scores={"bogus": [1, 2, 3]}))
                                              + "\n")
    head = ('{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "x": ' + deep + "}").encode()
    (tmp_path / "deep.safetensors").write_bytes(struct.pack("<Q", len(head)) + head + b"\0" * 4)
    gen = torch.Generator().manual_seed(0)
    save_file({"w": torch.randn(64, 8, generator=gen)}, str(tmp_path / "ref.safetensors"))
    save_file({"w": torch.randn(64, 8, generator=gen)}, str(tmp_path / "w1.safetensors"))
    save_file({"w": torch.full((64, 8), 3e38)}, str(tmp_path / "big38.safetensors"))
    os.symlink("loop-b", tmp_path / "loop-a")
    os.symlink("loop-a", tmp_path / "loop-b")
    configs = {
        "steps-true.toml": "steps = true\n", "seeds-true.toml": "seeds = true\n",
        "strategies-3.toml": "strategies = 3\n", "arrivals-x.toml": 'arrivals = "x"\n',
        "local-3.toml": '[arrivals]\ncompute = "exp:1,exp:1"\nlocal = 3\n',
        "deep.toml": "a = " + deep + "\n", "deep.json": '{"a": ' + deep + "}",
        "window-2.toml": "[arrivals]\nwindow = 2\n", "nproc-true.toml": "[distributed]\nnproc = true\n",
    }
    for name, text in configs.items():
        (tmp_path / name).write_text(text)
    return tmp_path


SIM = ["simulate", "--steps", "2", "--seeds", "1", "--data-bytes", "100000", "--strategies", "hogwild"]
DETECT = ["detect", "--ranks", "3", "--steps", "4", "--warmup", "3", "--window", "3", "--calibration", "1",
          "--validation", "1", "--test", "2", "--false-alarm", "0.1", "--batch-size", "2", "--context", "16",
          "--data-bytes", "50000", "--faults", "scale,nan"]

ROWS: dict[str, tuple[list[str], int, tuple[str, ...]]] = {
    # 5: unbounded requests, refused before allocating (under the 4 GiB cap)
    "report-world-1e8": (["monitor", "report", "world-1e8.jsonl"], 1, ("world-1e8.jsonl, line 1", "at most")),
    "report-world-2^62": (["monitor", "report", "world-2p62.jsonl"], 1, ("line 1", f"{MAX_WORLD:,} ranks")),
    "report-1gb-line": (["monitor", "report", "long-line.jsonl"], 1,
                        ("long-line.jsonl, line 2", "longer than")),
    "audit-sketches-1e9": (["audit", "ref.safetensors", "w1.safetensors", "--sketches", str(10**9)], 2,
                           ("--sketches", "1024")),
    # 6: a result that is not true
    "detect-lr-1e30": ([*DETECT, "--lr", "1e30"], 1, ("--lr", "diverged")),
    # 7: config files
    "config-steps-true": (["simulate", "--config", "steps-true.toml", *SIM[3:]], 2,
                          ("--config", "steps-true.toml", "steps = true", "positive int")),
    "config-seeds-true": (["simulate", "--config", "seeds-true.toml", *SIM[1:3], *SIM[5:]], 2,
                          ("--config", "seeds = true")),
    "config-strategies-3": ([*SIM[:1], "--config", "strategies-3.toml"], 2,
                            ("--config", "strategies = 3")),
    "config-arrivals-x": ([*SIM, "--config", "arrivals-x.toml"], 2, ("arrivals", "table")),
    "config-local-3": ([*SIM, "--config", "local-3.toml"], 2, ("local", "[arrivals.local]")),
    "config-nproc-true": ([*SIM, "--config", "nproc-true.toml"], 2,
                          ("--config", "distributed.nproc = true")),
    "config-deep-toml": ([*SIM, "--config", "deep.toml"], 2, ("--config", "deep.toml", "nested too deeply")),
    "config-deep-json": ([*SIM, "--config", "deep.json"], 2, ("--config", "deep.json", "nested too deeply")),
    "config-window-distributed": (  # applied (and too big for K = 1), not dropped
        [*SIM, "--config", "window-2.toml", "--engine", "distributed", "--nproc", "2"], 2,
        ("--window 2", "1..1")),
    # 8: hostile files
    "report-deep-json": (["monitor", "report", "deep.jsonl"], 1, ("deep.jsonl, line 2", "nested too deeply")),
    "report-step-1e30": (["monitor", "report", "step-1e30.jsonl"], 1, ("line 2", "'step' is not valid")),
    "report-no-signal": (["monitor", "report", "no-signal.jsonl"], 1,
                         ("line 2", "no score of a known signal")),
    "audit-deep-header": (["audit", "ref.safetensors", "deep.safetensors"], 1, ("deep.safetensors",)),
    # 11: messages
    "audit-symlink-loop": (["audit", "ref.safetensors", "loop-a"], 1, ("loop-a", "symbolic link loop")),
    "report-symlink-loop": (["monitor", "report", "loop-a"], 1, ("loop-a", "symbolic link loop")),
    "audit-csv-unwritable": (
        ["audit", "ref.safetensors", "w1.safetensors", "--csv", "/proc/naig-audit.csv"], 2,
        ("--csv", "/proc/naig-audit.csv", "cannot be written")),
    "sim-lags-2^31": ([*SIM, "--lags", f"0,{2**31}"], 2, ("--lags", "never joins")),
}


@pytest.mark.parametrize("name", list(ROWS))
def test_hostile_input_ends_in_one_line(name: str, files: Path) -> None:
    args, code, needles = ROWS[name]
    line = _one_line(args, files, code, *needles)
    if name == "audit-csv-unwritable":
        assert ".tmp" not in line and "naig-csv" not in line  # --csv named, not a temporary file


def test_a_log_cut_mid_line_reports_every_complete_step_and_says_what_was_cut(files: Path) -> None:
    rc, out, err = _cli(["monitor", "report", "cut.jsonl", "--json"], files)
    assert rc == 0 and err == "", err
    doc = json.loads(out)
    assert doc["steps"] == 3 and (doc["first_step"], doc["last_step"]) == (1, 3)
    assert doc["cut"].startswith("line 5 was cut (70 bytes without an end")
    assert "3 complete steps" in doc["cut"]


def test_two_workers_an_outlier_is_frozen_not_integrated(files: Path) -> None:
    """Kind 10: ``naig audit ref big38 w1`` (every entry of big38 3e38) at K = 2, --beta auto."""
    rc, out, err = _cli(["audit", "ref.safetensors", "big38.safetensors", "w1.safetensors", "--json"], files)
    assert rc == 0, err
    verdicts = {Path(f["file"]).name: (f["verdict"], f["pi"]) for f in json.loads(out)["files"]}
    assert verdicts["big38.safetensors"][0] == "frozen" and verdicts["big38.safetensors"][1] < 0.005
    assert verdicts["w1.safetensors"][0] == "integrated"


# -- the library rows -------------------------------------------------------------------------------

def test_a_writer_on_a_full_device_warns_once_and_counts_what_it_lost() -> None:
    writer = JsonlRecords("/dev/full")  # a real full device: every write is ENOSPC
    mon = writer.attach(Monitor())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(5):
            mon.observe({"w": torch.randn(10)})
        during = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]  # not the warm-up's
        writer.close()
    assert len(during) == 1 and "could not write the record of step 1" in during[0], during
    assert "No space left on device" in during[0] and writer.lost == 5
    assert str(seen[-1].message).endswith("lost 5 records after OSError: [Errno 28] No space left on device")


def test_a_logger_that_raises_is_a_passenger_unless_asked_to_raise() -> None:
    def broken(_: dict) -> None:
        raise ConnectionError("the tracking server is down")

    mon = LoggerRecords(broken).attach(Monitor())
    with pytest.warns(RuntimeWarning, match="ConnectionError: the tracking server is down"):
        decision = mon.observe({"w": torch.ones(3)})
    assert decision.step == 1 and mon.observe({"w": torch.ones(3)}).step == 2
    strict = LoggerRecords(broken).attach(Monitor(), on_error="raise")
    with pytest.raises(ConnectionError):
        strict.observe({"w": torch.ones(3)})
    with pytest.raises(UsageError, match="on_error"):
        LoggerRecords(broken).attach(Monitor(), on_error="ignore")


@pytest.mark.parametrize(("grad", "needle"), [
    (torch.eye(3).to_sparse(), "'emb.weight' is a sparse gradient"),
    (torch.empty(3, device="meta"), "'emb.weight' is a meta tensor"),
])
def test_gradients_the_monitor_cannot_read_are_refused_naming_the_parameter(grad: torch.Tensor,
                                                                            needle: str) -> None:
    with pytest.raises(UsageError, match=needle) as err:
        Monitor().observe({"w": torch.ones(2), "emb.weight": grad})
    assert "\n" not in str(err.value)


def test_finite_entries_whose_square_overflows_are_labelled_overflow_not_nonfinite() -> None:
    mon = Monitor()
    d = mon.observe({"w": torch.full((4,), 1e200, dtype=torch.float64)})
    assert mon.signals.nonfinite.tolist() == [0] and not mon.signals.usable[0]
    assert [(f.signal, f.score) for f in d.flags] == [("nonfinite", "overflow")]
    assert "beyond float64" in d.describe() and "non-finite gradient" not in d.describe()
    d = Monitor().observe({"w": torch.tensor([1.0, float("nan")])})
    assert [(f.signal, f.score) for f in d.flags] == [("nonfinite", "nonfinite")]
    assert "non-finite gradient" in d.describe()


def test_runaway_sketch_sizes_are_refused_at_once() -> None:
    start = time.monotonic()
    with pytest.raises(UsageError, match=r"blocks=1000000000: must be an int in \[1, 256\]"):
        Monitor(blocks=10**9)
    assert time.monotonic() - start < 1.0


@pytest.mark.parametrize(("call", "field"), [
    (lambda: ArrivalModel.from_specs(1), "compute=1"),
    (lambda: ArrivalModel.from_specs(["exp:1", "exp:2"]), "join a list with commas"),
    (lambda: ArrivalModel.from_specs("exp:1,exp:2", bandwidth=5.0), "bandwidth=5.0"),
    (lambda: predict(ArrivalModel.from_specs("exp:1,exp:2"), window=0), r"window=0: must be an int in 1\.\.2"
     ),
    (lambda: predict(ArrivalModel.from_specs("exp:1,exp:2"), window=3), r"window=3: must be an int in 1\.\.2"
     ),
    (lambda: predict("exp:1"), "must be an ArrivalModel"),
    (lambda: Router(lags=(0, 1, 2)).weights([torch.ones(0)] * 3), "every one of the 3 gradients is empty"),
])
def test_library_entry_points_refuse_wrong_types_in_one_line(call, field: str) -> None:  # noqa: ANN001
    with pytest.raises(UsageError, match=field) as err:
        call()
    assert "\n" not in str(err.value)


def test_at_two_workers_auto_beta_judges_by_the_energy_ratio_in_router_and_monitor_weights() -> None:
    """Kind 10 in the library: with two positive energies the worse worker is frozen once it is 6.3x
    the better (π_worse/π_better = exp(1 − ratio)), at 2x it is integrated."""
    for ratio, frozen in ((100.0, True), (8.0, True), (2.0, False)):
        pi = naig_weights(np.array([1.0, ratio]), "auto")
        assert pi[1] / pi[0] == pytest.approx(np.exp(1.0 - ratio), rel=1e-12)
        assert frozen_mask(pi).tolist() == [False, frozen]
    router = Router(lags=None)
    grads = [torch.ones(64), torch.ones(64) + 0.01, torch.ones(64) * 1e6]
    pi = router.weights(grads[1:], reference=grads[0])
    assert frozen_mask(pi).tolist() == [False, True]


def test_hostile_monitor_logs_through_the_library(files: Path) -> None:
    for name, needle in (("world-1e8.jsonl", "at most"), ("deep.jsonl", "nested too deeply"),
                         ("step-1e30.jsonl", "'step'"), ("no-signal.jsonl", "known signal")):
        with pytest.raises(DataError, match=needle):
            read_log(files / name)


# -- 3 gloo ranks -----------------------------------------------------------------------------------

def _mount(target: Path, options: str) -> bool:
    """Mount a tmpfs at ``target`` (root only; False where this machine does not allow it)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    target.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True,
                       timeout=30)
    return r.returncode == 0


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("adversarial-monitor")
    dirs = {name: tmp / name for name, opts in (("fills", "size=32k"), ("readonly", "ro,size=32k"))
            if _mount(tmp / name, opts)}
    out = tmp / "out.json"
    try:
        r = run_python("-m", "tests.adversarial_monitor_ranks", out, *(f"{k}={v}" for k, v in dirs.items()),
                       timeout=300, env={**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}, cwd=tmp)
        assert_no_leftovers(str(tmp))
        assert r.returncode == 0, r.stderr[-3000:]
        doc = json.loads(out.read_text())
        if "fills" in dirs:
            doc["fills_log"] = read_log(dirs["fills"] / "monitor.jsonl")
        return doc
    finally:
        for d in dirs.values():
            subprocess.run(["umount", str(d)], capture_output=True, timeout=30)


@pytest.mark.parametrize("disk", ["full", "proc", "fills", "readonly", "ddp_full"])
def test_a_full_or_unwritable_disk_leaves_training_running_on_every_rank_with_one_warning_each(
        ranks: dict, disk: str) -> None:
    if disk not in ranks["ranks"][0]:
        pytest.skip("needs root to mount a tmpfs")
    views = [r[disk] for r in ranks["ranks"]]
    steps = 5 if disk == "proc" else ranks["steps"]
    assert [v["steps"] for v in views] == [steps] * 3  # every rank trained to the end
    failed = [w for w in views[0]["warnings"] if "could not write the record" in w]
    summary = [w for w in views[0]["warnings"] if " lost " in w and " after " in w]
    assert len(failed) == 1 and len(summary) == 1 and len(views[0]["warnings"]) == 2, views[0]["warnings"]
    assert f"lost {views[0]['lost']} record" in summary[0]
    for v in views[1:]:
        assert len(v["warnings"]) == 1 and "a record writer of rank 0 could not write" in v["warnings"][0]
    if disk != "fills":
        assert views[0]["lost"] == steps  # not a byte could be written
        return
    log = ranks["fills_log"]  # the disk filled mid-run: every complete step is read back
    n = len(log.steps)
    assert 1 <= n < steps and log.steps.tolist() == list(range(1, n + 1))
    assert n + views[0]["lost"] == steps  # each step is either in the log or counted lost
    assert "could not write the record of step " + str(n + 1) in failed[0]


def test_ranks_with_different_layouts_stop_on_every_rank_naming_them(ranks: dict) -> None:
    errors = [r["layout"]["error"] for r in ranks["ranks"]]
    assert errors[0] is not None and errors == [errors[0]] * 3 and "\n" not in errors[0]
    assert errors[0].startswith("ranks 2 passed Monitor.observe other gradient names or shapes than "
                                "ranks 0, 1")


def test_a_gradient_none_on_one_rank_stops_every_rank_saying_to_pass_zeros(ranks: dict) -> None:
    """observe's docstring said a None gradient counts as zero; it is left out, so a None on some ranks
    only is a layout mismatch: every rank stops, and the line says what to pass instead (2026-12-06).
    None on every rank is simply left out."""
    errors = [r["layout"]["none_error"] for r in ranks["ranks"]]
    assert errors[0] is not None and errors == [errors[0]] * 3
    assert errors[0].startswith("ranks 1 passed Monitor.observe other gradient names or shapes than "
                                "ranks 0, 2")
    assert "None on some ranks only: pass torch.zeros_like(p) there" in errors[0]
    assert [r["layout"]["all_none"] for r in ranks["ranks"]] == [None] * 3


def test_a_dtensor_gradient_is_monitored_or_refused_in_one_line(ranks: dict) -> None:
    views = [r["dtensor"] for r in ranks["ranks"]]
    for k, v in enumerate(views):
        want = [24.0 + float((torch.randn(6, 4, generator=torch.Generator().manual_seed(100 + j)) ** 2).sum())
                for j in range(3)]  # the replicated ones(6, 4) read locally, plus each rank's own tensor
        assert v["replicated"]["sq_norm"] == pytest.approx(want, rel=1e-6), k
        assert v["sharded"].startswith("grads: 'layer.weight' is a DTensor with placements (Shard(dim=0),)")
        assert "full_dtensor=True" in v["sharded"] and "\n" not in v["sharded"]
        assert v["gathered_sq_norm"] == [float((torch.arange(24.0) ** 2).sum())] * 3
