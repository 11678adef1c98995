"""``naig detect`` on the command line (naig_cli.detect)."""

import importlib.util
import json

import pytest
from typer.testing import CliRunner

from naig_cli.main import app
from tests.conftest import assert_one_line_error, run_naig

TINY = ["detect", "--ranks", "3", "--steps", "4", "--warmup", "3", "--window", "3", "--calibration", "1",
        "--validation", "1", "--test", "2", "--false-alarm", "0.1", "--batch-size", "2", "--context", "16",
        "--data-bytes", "50000", "--faults", "scale,nan"]
RUNNER = CliRunner()


def test_table_names_every_detector_and_the_default() -> None:
    r = RUNNER.invoke(app, TINY, env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    for word in ("energy-14", "sketch-56", "monitor", "norm-ind", "Top-1", "AUC", "default detector"):
        assert word in r.output


def test_json_is_one_document_with_every_cell() -> None:
    r = RUNNER.invoke(app, [*TINY, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert len(doc["rows"]) == 8  # 7 scales + 1 nan
    assert doc["config"]["ranks"] == 3 and doc["default"] in doc["detectors"]
    nan_row = doc["rows"][-1]
    assert nan_row["fault"] == "nan" and nan_row["detectors"]["nan"]["detection"][0] == 1.0
    assert doc["detectors"]["nan"]["false_alarm"]["flagged"] == 0


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
def test_plot_is_written(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "d.png"
    r = RUNNER.invoke(app, [*TINY, "--faults", "scale", "--plot", str(out)])
    assert r.exit_code == 0, r.output
    assert out.stat().st_size > 1000


@pytest.mark.parametrize(("args", "needles"), [
    (["--faults", "scale,bogus"], ["--faults", "scale,bogus"]),
    (["--false-alarm", "0.001"], ["--calibration", "calibration seeds"]),
    (["--warmup", "1"], ["--warmup", "--window"]),
    (["--ranks", "2"], ["--ranks"]),
    (["--context", "999"], ["--context", "64"]),
    (["--plot", "x.txt"], ["--plot", ".png"]),
    (["--sketch-seed", "-1"], ["--sketch-seed -1"]),
    (["--steps", "900000", "--test", "9000"], ["--steps 900000", "GiB"]),
])
def test_bad_options_are_one_line_usage_errors(args: list[str], needles: list[str]) -> None:
    assert_one_line_error(run_naig(*TINY, *args), 2, *needles)


def test_missing_text_is_a_data_error() -> None:
    assert_one_line_error(run_naig(*TINY, "--data", "/nonexistent/corpus.txt"), 1, "--data")


def test_help_lists_the_examples() -> None:
    r = RUNNER.invoke(app, ["detect", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "naig detect --plot detect.png" in r.output
