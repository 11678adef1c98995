"""`naig staleness` end to end: real subprocesses (docs/design.md §10)."""

import json

import pytest

from tests.conftest import assert_one_line_error, run_naig


def test_eight_exponential_workers_json() -> None:
    """The issue's check: mean τ ≈ 7 and P(τ = 0) ≈ 1/8, within their intervals."""
    r = run_naig("staleness", "--workers", "8", "--compute", "exp:1", "--json")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    doc = json.loads(r.stdout)
    m, p = doc["staleness"]["measured"], doc["staleness"]["predicted"]
    ci = m["ci95"]
    assert m["mean"] == pytest.approx(7, abs=0.05) and ci["mean"][0] <= 7 <= ci["mean"][1]
    assert m["mean_plus_one"] == pytest.approx(8, abs=0.05) and p["mean_plus_one"] == 8
    assert m["p_zero"] == pytest.approx(1 / 8, abs=0.005) and ci["p_zero"][0] <= 1 / 8 <= ci["p_zero"][1]
    assert p["mean"] == 7 and p["p_zero"] == 0.125 and p["variance"] == 56 and len(m["per_worker"]) == 8
    assert doc["staleness"]["within_ci95"]["mean"] is True and doc["schema_version"] == 2
    assert doc["warnings"] == []


def test_table_output() -> None:
    r = run_naig("staleness", "--compute", "exp:0.5,exp:1,exp:2,exp:4", "--updates", "20000")
    assert r.returncode == 0, r.stderr
    for needle in ("K = 4 workers, blocking", "mean staleness τ", "mean τ + 1", "P(τ = 0)", "E[max C]",
                   "per worker", "up: sketch only", "56 B", "staleness histogram", "arrivals/s"):
        assert needle in r.stdout, needle
    footer = r.stdout.split("statistics after a start-up of", 1)[1]  # the symbols, said below the tables
    for symbol in ("τ staleness", "λ arrivals/s", "E[A] seconds", "E[max C]", "Little: λ̂·E[A] − 1",
                   "B arrivals"):
        assert symbol in footer, symbol


def test_a_prediction_outside_its_interval_is_shown() -> None:
    """Little's law is an approximation in non-blocking mode; with constant compute it misses
    by several interval widths, and the table says so."""
    r = run_naig("staleness", "--compute", "const:1", "--uplink", "exp:2", "--downlink", "exp:2",
                 "--mode", "non-blocking", "--json")
    doc = json.loads(r.stdout)
    assert doc["staleness"]["within_ci95"]["little"] is False
    table = run_naig("staleness", "--compute", "const:1", "--uplink", "exp:2", "--downlink", "exp:2",
                     "--mode", "non-blocking").stdout
    assert "(outside)" in table and f"{doc['staleness']['predicted']['little']:.4f}" in table


def test_same_seed_same_json() -> None:
    args = ("staleness", "--compute", "gamma:1:2", "--uplink", "exp:0.1", "--updates", "5000", "--json")
    a, b = run_naig(*args, "--seed", "3"), run_naig(*args, "--seed", "3")
    assert a.returncode == 0 and a.stdout == b.stdout
    assert a.stdout != run_naig(*args, "--seed", "4").stdout


def test_worker_sweep() -> None:
    r = run_naig("staleness", "--sweep", "workers=1..3,6", "--updates", "5000", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["sweep"] == {"field": "workers", "values": [1, 2, 3, 6]} and doc["schema_version"] == 2
    means = [run["staleness"]["measured"]["mean"] for run in doc["runs"]]
    assert means == pytest.approx([0, 1, 2, 5], abs=0.1)
    table = run_naig("staleness", "--sweep", "workers=1,2", "--updates", "2000")
    assert table.returncode == 0 and "sweep over K" in table.stdout


def test_batch_size_sweep_moves_age_and_bandwidth_not_blocking_staleness() -> None:
    r = run_naig("staleness", "--compute", "exp:0.1", "--per-sample", "const:0.01", "--sweep",
                 "batch-size=1,100", "--updates", "20000", "--json")
    assert r.returncode == 0, r.stderr
    small, big = (run for run in json.loads(r.stdout)["runs"])
    assert small["staleness"]["measured"]["mean"] == pytest.approx(3, abs=0.1)
    assert big["staleness"]["measured"]["mean"] == pytest.approx(3, abs=0.1)
    assert big["staleness"]["measured"]["age"] / small["staleness"]["measured"]["age"] == pytest.approx(
        1.1 / 0.11, rel=0.05)
    assert big["bandwidth"]["predicted"]["up_gradient"] < small["bandwidth"]["predicted"]["up_gradient"]


@pytest.mark.parametrize(("args", "needles"), [
    (["--compute", "weibull:1"], ["--compute 'weibull:1'", "unknown distribution"]),
    (["--compute", "exp:1,exp:2", "--workers", "3"], ["--compute", "--workers is 3"]),
    (["--uplink", "gamma:1"], ["--uplink", "SHAPE"]),
    (["--batch-size", "8"], ["--batch-size 8", "--per-sample"]),
    (["--mode", "shared-memory", "--downlink", "exp:1"], ["--downlink", "shared memory"]),
    (["--updates", "0"], ["--updates 0", ">= 1"]),
    (["--window", "0"], ["--window 0"]),
    (["--params", "0"], ["--params 0"]),
    (["--params", "-5"], ["--params -5"]),
    (["--seed", "-1"], ["--seed -1"]),
    (["--bandwidth", "fast"], ["--bandwidth 'fast'"]),
    (["--sweep", "lr=1,2"], ["--sweep 'lr=1,2'", "workers=VALUES"]),
    (["--sweep", "workers=4..2"], ["--sweep", "ranges"]),
    (["--sweep", "workers=1..1000"], ["--sweep", "at most 256"]),
    (["--sweep", "workers=2,1..3"], ["--sweep 'workers=2,1..3'", "2 listed more than once"]),
    (["--sweep", "workers=1..4", "--compute", "exp:1,exp:2"], ["--sweep", "--compute lists one value"]),
    (["--sweep", "batch-size=1,2"], ["--sweep: at batch-size=2,", "--per-sample"]),  # not --batch-size
    (["--mode", "async"], ["--mode", "async"]),
])
def test_bad_options_are_one_line_exit_2(args: list[str], needles: list[str]) -> None:
    r = run_naig("staleness", *args)
    assert_one_line_error(r, 2, *needles)
    assert r.stdout == ""


def test_help_lists_the_modes() -> None:
    r = run_naig("staleness", "--help")
    assert r.returncode == 0 and "non-blocking" in r.stdout and "shared-memory" in r.stdout
    assert "shifted-exp:MEAN:SHIFT" in r.stdout  # not eaten by rich's :emoji: codes


def test_scipy_is_imported_only_when_used() -> None:
    """`naig spectrum` start-up must not pay for scipy; naig.arrivals imports it on use."""
    import subprocess
    import sys

    code = "import sys, naig_cli.main, naig.arrivals; print('scipy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_window_divides_the_blocking_mean() -> None:
    r = run_naig("staleness", "--compute", "gamma:1:2", "--workers", "6", "--window", "3",
                 "--updates", "30000", "--json")
    s = json.loads(r.stdout)["staleness"]
    assert s["predicted"]["mean"] == pytest.approx(5 / 3) and s["within_ci95"]["mean"] is True
    assert s["predicted"]["per_worker"] is None and s["measured"]["updates_per_second"] == pytest.approx(
        s["measured"]["rate"] / 3)


def test_mode_choices_match_the_library() -> None:
    from naig.arrivals import MODES
    from naig_cli._common import ArrivalMode

    assert tuple(m.value for m in ArrivalMode) == MODES



def test_one_spec_means_the_documented_four_workers_and_lists_their_length() -> None:
    r = run_naig("staleness", "--compute", "exp:1", "--updates", "2000", "--json")
    assert json.loads(r.stdout)["config"]["workers"] == 4
    r = run_naig("staleness", "--compute", "exp:1", "--uplink", "const:0.1,const:0.2", "--updates", "2000",
                 "--json")
    assert json.loads(r.stdout)["config"]["workers"] == 2


@pytest.mark.parametrize(("args", "needles"), [
    (["--updates", str(10**12)], ["--updates 1000000000000", "GiB of memory", "fewer --updates"]),
    (["--sweep", "workers=1,2", "--updates", str(10**12)], ["--updates 1000000000000", "GiB of memory"]),
    (["--compute", "lognormal:1:40"], ["--compute 'lognormal:1:40'", "sigma <= 8.31"]),
    (["--compute", "exp:1e-300"], ["--compute 'exp:1e-300'", "[1e-100, 1e+100]"]),
    (["--compute", "const:1e300"], ["--compute 'const:1e300'", "[1e-100, 1e+100]"]),
    (["--uplink", "gamma:1:1e-300"], ["--uplink 'gamma:1:1e-300'", "shape >= 0.01"]),
    (["--bandwidth", "1e-300"], ["--bandwidth", "[1e-100, 1e+100]"]),
    (["--params", str(10**30)], ["--params", "at most 1e+15"]),
])
def test_runaway_and_extreme_inputs_are_refused_before_work(args: list[str], needles: list[str]) -> None:
    r = run_naig("staleness", *args, timeout=60)
    assert_one_line_error(r, 2, *needles)
    assert r.stdout == "" and r.stderr.count("\n") == 1


def test_too_few_updates_warn_in_one_line() -> None:
    """One line each on stderr; with ``--json`` the document's ``warnings`` holds the same lines."""
    for json_flag in ([], ["--json"]):
        r = run_naig("staleness", "--updates", "1", *json_flag)
        assert r.returncode == 0 and r.stdout
        assert r.stderr.splitlines() == [r.stderr.strip()] and r.stderr.startswith("warning: --updates 1:")
    assert json.loads(r.stdout)["warnings"] == [r.stderr.strip().removeprefix("warning: ")]
    r = run_naig("staleness", "--sweep", "workers=1,2", "--updates", "5", "--json")
    assert r.returncode == 0 and len(r.stderr.splitlines()) == 2 and "at workers=2," in r.stderr
    assert json.loads(r.stdout)["warnings"] == [ln.removeprefix("warning: ") for ln in r.stderr.splitlines()]
    assert run_naig("staleness", "--updates", "2000").stderr == ""  # enough: no warning


def test_heavy_tails_run_with_one_worded_warning_and_no_scipy_lines() -> None:
    r = run_naig("staleness", "--compute", "lognormal:1:5", "--updates", "20000")
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == ["warning: E[max C] by quadrature did not converge (a heavy-tailed "
                                     "law); the synchronous round time is measured only, not predicted"]
    assert "IntegrationWarning" not in r.stderr and "sync round E[max C], seconds" in r.stdout


def test_huge_numbers_are_compact_and_rows_keep_their_labels() -> None:
    r = run_naig("staleness", "--compute", "const:1e99,exp:1e99", "--updates", "2000")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "…" not in r.stdout and "e+99" in r.stdout
    for label in ("mean staleness τ", "age E[A], seconds", "sync round E[max C], seconds"):
        line = next(ln for ln in r.stdout.splitlines() if label in ln)
        assert max(len(cell) for cell in line.split()) < 40, line
    assert max(len(ln) for ln in r.stdout.splitlines()) <= 200


def test_many_workers_print_a_bounded_table() -> None:
    r = run_naig("staleness", "--workers", "300", "--updates", "20000")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) < 100 and "268 more workers (--json lists every worker)" in r.stdout
    doc = json.loads(run_naig("staleness", "--workers", "300", "--updates", "20000", "--json").stdout)
    assert len(doc["staleness"]["measured"]["per_worker"]) == 300


@pytest.mark.parametrize("width", [40, 60])
def test_narrow_terminals_leave_columns_out_and_say_so_cells_stay_whole(width: int) -> None:
    """Every cell was cut to "…" at 40 columns, measured values included, and nothing said so (a review,
    2026-12-07); now columns are left out, in a fixed order, and the line below each table names them."""
    r = run_naig("staleness", "--updates", "2000", timeout=120, columns=width)
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout
    said = [line for line in r.stdout.splitlines() if line.startswith("left out to fit")]
    assert said and all(f"left out to fit {width} columns: " in line for line in said)
    assert "mean staleness τ                 2.9995" in r.stdout  # the measured value, whole
    wide = run_naig("staleness", "--updates", "2000")  # 200 columns: every column
    assert "left out" not in wide.stdout and "95% interval" in wide.stdout


def test_the_more_workers_line_sits_under_the_table_and_widens_no_column() -> None:
    """In a cell of E[C_i] it made that column ~45 wide, so at 80 columns the column, and the line with
    it, were left out (a review of the narrow-terminal change, 2026-12-07)."""
    r = run_naig("staleness", "--workers", "300", "--updates", "20000", timeout=120, columns=80)
    assert r.returncode == 0, r.stderr
    table = r.stdout.split("per worker:", 1)[1].split("bandwidth at the master", 1)[0]
    assert "E[C_i] s" in table and "… 268 more workers (--json lists every worker)" in table
