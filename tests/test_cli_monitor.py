"""`naig monitor report` end to end: real subprocesses on logs the record writers wrote."""

import json
import math
import os
import stat

import numpy as np
import pytest

from naig.monitor import Detector, Monitor, rank_signals
from naig.monitor.records import CsvRecords, JsonlRecords, Records, read_log
from tests.conftest import assert_one_line_error, needs, run_naig

WORLD, BAD_RANK, BAD_STEP, NAN_RANK, NAN_STEP, STEPS = 3, 2, 9, 0, 11, 12


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> tuple:
    """A JSONL and a CSV of 12 steps of 3 ranks: rank 2 ×1000 at step 9, a NaN on rank 0 at step 11."""
    d = tmp_path_factory.mktemp("logs")
    rng = np.random.default_rng(3)
    proj = rng.standard_normal((100, 14)) / math.sqrt(14)
    mon = Monitor(window=4)
    Records(JsonlRecords(d / "m.jsonl"), CsvRecords(d / "m.csv")).attach(mon)
    mon.detector = Detector(WORLD, window=4)  # what Monitor.observe builds at its first step
    for step in range(1, STEPS + 1):
        g = 1.0 + 0.1 * rng.standard_normal((WORLD, 100))
        g[BAD_RANK] *= 1000.0 if step == BAD_STEP else 1.0
        g[NAN_RANK, 0] = np.nan if step == NAN_STEP else g[NAN_RANK, 0]
        sig = rank_signals(np.nan_to_num(g) @ proj, (g * g).sum(1), (~np.isfinite(g)).sum(1))
        dec = mon.detector.update(sig)
        for w in mon.writers:
            w(sig, dec)
    return d / "m.jsonl", d / "m.csv"


def test_report_json_names_the_bad_ranks(logs) -> None:
    jsonl, csv_path = logs
    docs = []
    for path in logs:
        r = run_naig("monitor", "report", path, "--json")
        assert r.returncode == 0 and r.stderr == "", r.stderr
        docs.append(json.loads(r.stdout))
    a, b = docs
    assert (a["format"], b["format"]) == ("jsonl", "csv") and a["ranks"] == b["ranks"]
    assert a["world"] == WORLD and a["steps"] == STEPS and a["schema_version"] == 1
    rows = {r["rank"]: r for r in a["ranks"]}
    expected = read_log(jsonl).rank_rows()  # the library's table, which the command prints
    assert [r["flagged_steps"] for r in rows.values()] == [r["flagged_steps"] for r in expected]
    assert rows[BAD_RANK]["last_flagged"] == BAD_STEP and rows[BAD_RANK]["flagged_steps"] >= 1
    assert rows[NAN_RANK]["flags"]["nonfinite"] == 1 and rows[NAN_RANK]["max_score"]["norm"] == "Infinity"
    scored = [v for v in rows[1]["max_score"].values() if v != "NaN"]  # NaN: a signal not scored (cos)
    assert rows[1]["flagged_steps"] == 0 and scored and all(v < 1 for v in scored)


def test_report_table_and_plot(logs, tmp_path) -> None:
    needs("matplotlib", "the plot needs the plot extra")
    png = tmp_path / "ranks.png"
    r = run_naig("monitor", "report", logs[0], "--plot", png)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    for needle in ("K = 3 ranks, 12 steps (1..12)", "energy", "last flag", "nonfinite ×1", "∞",
                   f"plot: {png}"):
        assert needle in r.stdout, needle
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(png.stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600 (until 2026-12-06)


def test_a_log_cut_mid_line_shows_every_complete_step_and_says_what_was_cut(logs, tmp_path) -> None:
    lines = logs[0].read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[:4]) + lines[4][:50])  # a header, steps 1..3, step 4 cut
    r = run_naig("monitor", "report", cut)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    text = " ".join(r.stdout.split())  # rich wraps at the terminal's width
    assert "K = 3 ranks, 3 steps (1..3)" in text, r.stdout
    assert "line 5 was cut (50 bytes without an end" in text and "3 complete steps" in text, r.stdout
    doc = json.loads(run_naig("monitor", "report", cut, "--json").stdout)
    assert doc["steps"] == 3 and doc["cut"].startswith("line 5 was cut")


def test_corrupt_logs_are_one_line_data_errors(logs, tmp_path) -> None:
    lines = logs[0].read_text().splitlines(keepends=True)
    inner = tmp_path / "inner.jsonl"
    inner.write_text("".join(lines[:4]) + lines[4][:50] + "\n" + "".join(lines[5:]))
    assert_one_line_error(run_naig("monitor", "report", inner), 1, "inner.jsonl, line 5", "not JSON")
    rows = logs[1].read_text().splitlines(keepends=True)
    bad = tmp_path / "bad.csv"
    bad.write_text("".join(rows[:3]) + "x,1" + rows[3][3:] + "".join(rows[4:]))
    assert_one_line_error(run_naig("monitor", "report", bad), 1, "bad.csv, line 4",
                          "a row whose 'step' is not valid")
    assert_one_line_error(run_naig("monitor", "report", tmp_path / "none.jsonl"), 1, "no such file")


def test_a_folder_is_refused_naming_the_log_in_it(logs, tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    assert_one_line_error(run_naig("monitor", "report", run), 1, "is a folder", "pass a monitor .jsonl")
    (run / "monitor.jsonl").write_bytes(logs[0].read_bytes())
    assert_one_line_error(run_naig("monitor", "report", run), 1, "is a folder",
                          f"pass its log, e.g. {run / 'monitor.jsonl'}")


def test_usage_errors(logs, tmp_path) -> None:
    assert_one_line_error(run_naig("monitor", "report", logs[0], "--plot", tmp_path / "x.gif"), 2, "--plot",
                          ".png")
    assert_one_line_error(run_naig("monitor", "report", logs[0], "--plot", tmp_path / "no" / "x.png"), 2,
                          "--plot", "folder must exist")
    assert_one_line_error(run_naig("monitor", "report"), 2, "Missing argument", "naig monitor report --help")


def test_help_has_examples() -> None:
    r = run_naig("monitor", "report", "--help")
    assert r.returncode == 0 and "naig monitor report monitor.csv --plot ranks.png" in r.stdout
    assert "monitor" in run_naig("--help").stdout


def test_one_step_and_no_step_logs(logs, tmp_path) -> None:
    lines = logs[0].read_text().splitlines(keepends=True)
    one = tmp_path / "one.jsonl"
    one.write_text("".join(lines[:2]))
    r = run_naig("monitor", "report", one)
    assert r.returncode == 0 and "K = 3 ranks, 1 step (1..1)" in " ".join(r.stdout.split()), r.stdout
    for path in logs:
        head = tmp_path / f"head{path.suffix}"
        head.write_text(path.read_text().splitlines(keepends=True)[0])
        r = run_naig("monitor", "report", head)
        assert_one_line_error(r, 1, head.name, "no step recorded")
        assert "None" not in r.stdout + r.stderr
    where = tmp_path / "where.jsonl"
    step = json.loads(lines[1])
    step["where"] = "x"
    where.write_text(lines[0] + json.dumps(step) + "\n")
    assert_one_line_error(run_naig("monitor", "report", where), 1, "where.jsonl, line 2",
                          "'where' is not valid")


@pytest.mark.parametrize("columns", [80, 120])
def test_a_narrow_terminal_leaves_columns_out_and_says_so(logs, columns: int) -> None:
    """As audit, simulate and detect do: whole cells and headers (no wrapped "flagge/d"), fewer columns,
    a line naming what was left out; rank, flagged and flags stay."""
    r = run_naig("monitor", "report", logs[0], timeout=120, columns=columns)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    table = r.stdout.split("max score per signal", 1)[1].split("too narrow for", 1)[0]
    assert max(len(line) for line in table.splitlines()) <= columns
    assert "…" not in table
    header = table.split("───", 1)[0]
    for name in ("rank", "flagged", "flags", "norm"):
        assert f" {name} " in f"{header} ", header
    hidden = r.stdout.split("(too narrow for ", 1)[1].split(":", 1)[0].split(", ")
    assert hidden and all(f" {c} " not in f"{header} " for c in hidden), (hidden, header)


def test_lone_surrogates_in_a_log_are_printed_escaped_not_a_traceback(logs, tmp_path) -> None:
    """A strictly valid JSONL may hold ``\\ud800`` (JSON's escape of a lone surrogate) in a host name or
    a flag's test: shown as ``\\ud800``, exit 0, in the table and in --json (until 2026-12-06: a
    UnicodeEncodeError traceback)."""
    lines = logs[0].read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    header["hosts"] = ["\ud800", "b", "c"]
    step = json.loads(lines[BAD_STEP])
    step["flags"][0]["score"] = "\udfff"
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps(header) + "\n" + "".join(lines[1:BAD_STEP]) + json.dumps(step) + "\n"
                   + "".join(lines[BAD_STEP + 1:]))
    r = run_naig("monitor", "report", odd)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "\\ud800" in r.stdout and "\\udfff" in r.stdout, r.stdout
    doc = run_naig("monitor", "report", odd, "--json")
    assert doc.returncode == 0 and "\\\\ud800" in doc.stdout, doc.stderr


def test_a_resumed_run_appended_to_a_crashed_one_is_reported_as_two_runs(tmp_path) -> None:
    """A monitor resumed from its step-8 state, appending to the log its crashed run wrote to step 12,
    writes steps 9.. again after a new header. The report said "16 steps (1..12)" as one run, its
    range from the first and last lines (2026-12-06); now it counts the runs and their steps."""
    import torch

    path = tmp_path / "m.jsonl"
    torch.manual_seed(0)
    first = Monitor(window=4, warmup=4)
    writer = JsonlRecords(path)
    writer.attach(first)
    state = None
    for step in range(1, 13):
        first.observe({"w": torch.randn(10)})
        state = first.state_dict() if step == 8 else state
    writer.close()
    resumed = Monitor(window=4, warmup=4)
    resumed.load_state_dict(state)
    JsonlRecords(path, append=True).attach(resumed)
    with pytest.warns(UserWarning, match="holds steps up to 12"):
        for _ in range(4):
            resumed.observe({"w": torch.randn(10)})
    for w in resumed.writers:
        w.close()
    r = run_naig("monitor", "report", path)
    said = " ".join(r.stdout.split())  # the title wraps at the terminal's width
    assert r.returncode == 0 and "K = 1 rank, 16 steps in 2 runs (1..12, then 9..12);" in said, r.stdout
    doc = json.loads(run_naig("monitor", "report", path, "--json").stdout)
    assert doc["runs"] == [[1, 12], [9, 12]] and doc["steps"] == 16
