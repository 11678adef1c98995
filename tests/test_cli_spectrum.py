"""`naig spectrum` end to end (docs/design.md §3)."""

import json
import math
import subprocess

import pytest

from tests.conftest import run_naig


def naig(*args: str) -> subprocess.CompletedProcess:
    return run_naig(*args, timeout=120)


def test_default_table():
    r = naig("spectrum")
    assert r.returncode == 0, r.stderr
    assert "8/3 × 4" in r.stdout and "0 × 10" in r.stdout
    assert "rank" in r.stdout and "verified" in r.stdout and "NOT" not in r.stdout


def test_all_lines():
    r = naig("spectrum", "--all-lines")
    assert r.returncode == 0
    assert "21/21 lines verified" in r.stdout


def test_exact_prints_charpoly():
    r = naig("spectrum", "--exact")
    assert r.returncode == 0
    assert "λ^10 (λ − 8/3)^4" in r.stdout


def test_json_psi_blocks():
    r = naig("spectrum", "--json", "--exact")
    assert r.returncode == 0 and r.stderr == ""
    doc = json.loads(r.stdout)
    assert doc["line"] == [1, 2, 4] and doc["rank"] == 4 and doc["verified"] is True
    assert len(doc["eigenvalues"]) == 14 and doc["eigenvalues"] == sorted(doc["eigenvalues"])
    psi = doc["psi"]
    s = 2 / math.sqrt(3)
    blocks = {(4, 5): -s, (8, 9): -s, (10, 11): s, (12, 13): s}
    expected = [[0.0] * 14 for _ in range(14)]
    for (a, b), off in blocks.items():
        expected[a][a], expected[b][b], expected[a][b], expected[b][a] = 2, 2 / 3, off, off
    for i in range(14):
        for j in range(14):
            assert psi[i][j] == pytest.approx(expected[i][j], abs=1e-14), (i, j)
    nonzero = {(i, j) for i in range(14) for j in range(14) if abs(psi[i][j]) > 1e-14}
    assert nonzero == {(i, j) for (a, b) in blocks for i in (a, b) for j in (a, b)}
    assert doc["charpoly"][10:] == ["4096/81", "-2048/27", "128/3", "-32/3", "1"]


def test_all_lines_json():
    doc = json.loads(naig("spectrum", "--all-lines", "--json").stdout)
    assert doc["verified"] is True and len(doc["lines"]) == 21


@pytest.mark.parametrize("bad", ["1,2,3", "1,2", "x", "", " "])
def test_bad_line_exit_2_one_line(bad):
    r = naig("spectrum", "--line", bad)
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
    assert "Traceback" not in r.stderr and "--line" in r.stderr


def test_failed_verification_exits_1():
    r = naig("spectrum", "--tol", "0")
    assert r.returncode == 1 and "NOT verified" in r.stdout


def test_version_and_help():
    assert naig("--version").stdout.startswith("naig ")
    r = naig("spectrum", "--help")
    assert r.returncode == 0 and "[default: 1,2,4]" in r.stdout  # not eaten as rich markup


@pytest.mark.parametrize("args", [["spectrum", "--tol", "x"], ["audit"], ["nope"]])
def test_click_usage_errors_are_one_line(args):
    r = naig(*args)
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1 and "╭" not in r.stderr


@pytest.mark.parametrize(
    "args",
    [["--tol", "inf"], ["--tol", "nan"], ["--tol", "-1"], ["--tol", "2"], ["--all-lines", "--line", "2,4,1"]],
)
def test_bad_tol_and_conflicting_options(args):
    r = naig("spectrum", *args)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1
