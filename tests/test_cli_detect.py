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


def test_narrow_terminal_leaves_detectors_out_and_says_so() -> None:
    """As audit and simulate do: whole cells, fewer columns, a line naming what was left out."""
    r = run_naig(*TINY, columns=80)
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout  # no cell cut
    assert "too narrow for" in r.stdout and "use --json" in r.stdout
    assert max(len(line) for line in r.stdout.splitlines() if not line.startswith("naig detect:")) <= 80
    default = r.stdout.rsplit("validation seeds): ", 1)[1].strip()
    table = r.stdout.split("Mean detection rate", 1)[1].split("too narrow", 1)[0]
    assert default in table  # the default detector is kept longest


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
    (["--test", "100000000"], ["--test 100000000", "too many seeds", "smaller --test"]),
    (["--warmup", "100000000"], ["--warmup 100000000", "too many steps", "smaller --warmup"]),
    (["--threads", "100000"], ["--threads 100000", "from 1 to 1024"]),  # a segfault until 2026-12-06
])
def test_bad_options_are_one_line_usage_errors(args: list[str], needles: list[str]) -> None:
    assert_one_line_error(run_naig(*TINY, *args), 2, *needles)


def test_missing_text_is_a_data_error() -> None:
    assert_one_line_error(run_naig(*TINY, "--data", "/nonexistent/corpus.txt"), 1, "--data")


def test_help_lists_the_examples() -> None:
    r = RUNNER.invoke(app, ["detect", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "naig detect --plot detect.png" in r.output

PLOT_COMMANDS = [["detect"], ["simulate", "--steps", "2"], ["monitor", "report", "log.jsonl"]]


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")
@pytest.mark.parametrize("cmd", PLOT_COMMANDS)
def test_unwritable_plot_folder_is_refused_before_any_work(cmd: list[str], tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """The folder exists but cannot take a file (root may write anywhere by os.access, not in /proc):
    a usage error naming --plot before training or reading, not [Errno 2] at the end."""
    import tempfile

    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    r = RUNNER.invoke(app, [*cmd, "--plot", str(tmp_path / "x.png")])
    assert r.exit_code == 2 and r.stderr.startswith(f"error: --plot '{tmp_path / 'x.png'}': cannot write")
    assert r.stderr.count("\n") == 1 and not r.stdout


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self") or importlib.util.find_spec("matplotlib")
                    is None, reason="needs Linux /proc and matplotlib")
@pytest.mark.parametrize("cmd", PLOT_COMMANDS)
def test_plot_in_proc_is_a_usage_error(cmd: list[str]) -> None:
    assert_one_line_error(run_naig(*cmd, "--plot", "/proc/x.png"), 2, "--plot '/proc/x.png'", "cannot write")


@pytest.mark.parametrize(("target", "needle"), [("", "is a directory"), ("no/x.png", "its folder must exist"),
                                                ("x.txt", ".png"), ("x.png/", "is a directory")])
def test_plot_checks_name_the_option(target: str, needle: str, tmp_path) -> None:  # noqa: ANN001
    from naig.errors import UsageError
    from naig_cli._common import check_plot_path, cli_message

    with pytest.raises(UsageError) as info:
        check_plot_path(f"{tmp_path}/{target}", "d.png")  # (a Path would drop x.png/'s slash)
    assert cli_message(info.value).startswith("--plot '") and needle in cli_message(info.value)


def test_plot_write_failure_is_one_line_naming_plot(capsys) -> None:  # noqa: ANN001
    import typer

    from naig_cli._common import save_figure

    class Fig:
        def savefig(self, path: str, **kwargs: object) -> None:
            raise OSError(28, "No space left on device")

    with pytest.raises(typer.Exit) as info:
        save_figure(Fig(), "out.png")
    err = capsys.readouterr().err
    assert info.value.exit_code == 1 and err.startswith("error: --plot 'out.png': could not write it (No sp")
    assert err.count("\n") == 1


@pytest.mark.parametrize(("args", "needles"), [
    (["--protocol", "online"], ["--protocol", "steps or persistent"]),
    (["--protocol", "persistent", "--steps", "5"], ["--steps", "--protocol steps only"]),
    (["--protocol", "persistent", "--faults", "x3"], ["--faults", "x3"]),
    (["--cache", "somewhere"], ["--cache", "--protocol persistent only"]),
    # given is given, whatever the value: these equal the other protocol's defaults
    (["--protocol", "persistent", "--steps", "40"], ["--steps 40", "--protocol steps only"]),
    (["--protocol", "persistent", "--sketch-seed", "0"], ["--sketch-seed 0", "--protocol steps only"]),
    (["--replays", "40"], ["--replays 40", "--protocol persistent only"]),
    (["--protocol", "persistent", "--cache", ""], ["--cache ''", "an empty path"]),
    # until 2026-12-06: a segfault; a repeated kind counted twice; a traceback after a minute of work
    (["--protocol", "persistent", "--threads", "100000"], ["--threads 100000", "from 1 to 1024"]),
    (["--protocol", "persistent", "--faults", "scale:2,nan:1,scale:2"],
     ["--faults", "scale:2 listed more than once"]),
    # since 2026-12-08 more ranks than the clean pools' are refused first (their false alarms could not
    # be replayed); before, this many were refused by the memory check ("GiB", "smaller --ranks")
    (["--protocol", "persistent", "--ranks", "2000000", "--faults", "nan:1"],
     ["--ranks 2000000", "at most 10: the false alarms at K are replayed"]),
])
def test_protocol_options_are_one_line_usage_errors(args: list[str], needles: list[str]) -> None:
    assert_one_line_error(run_naig("detect", *args), 2, *needles)


def test_persistent_keeps_every_value_given_even_the_steps_protocols_default(monkeypatch, tmp_path) -> None:  # noqa: ANN001
    """--ranks 8 --validation 2 --test 3 are the steps protocol's defaults; given with --protocol
    persistent they are what runs (they were once replaced by its own defaults 4, 3, 10). The
    recording (~20 min) is replaced by one that keeps the config and stops."""
    import naig.detect.sequential as sequential

    seen = []

    def record_all(cfg, advance, cache=None):  # noqa: ANN001, ANN202
        seen.append(cfg)
        raise KeyboardInterrupt

    monkeypatch.setattr(sequential, "record_all", record_all)
    RUNNER.invoke(app, ["detect", "--protocol", "persistent", "--ranks", "8", "--validation", "2",
                        "--test", "3", "--faults", "scale:2"])
    RUNNER.invoke(app, ["detect", "--protocol", "persistent", "--faults", "scale:2"])
    given, default = seen
    assert (given.ranks, given.validation, given.test) == (8, 2, 3)
    assert (default.ranks, default.validation, default.test, default.replays) == (4, 3, 10, 40)
    (tmp_path / "afile").write_text("")
    assert_one_line_error(run_naig("detect", "--protocol", "persistent", "--cache", str(tmp_path / "afile")),
                          2, "--cache", "is a file")
