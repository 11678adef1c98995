"""The CLI's one table of field → flag, and its one-line wording of library errors."""

import subprocess
import sys
from pathlib import Path

import pytest

from naig.errors import DataError, UsageError
from naig_cli._common import FLAGS, cli_message, flag


@pytest.mark.parametrize(("err", "line"), [
    (UsageError("must be finite and >= 0", field="beta", value="-1"), "--beta '-1': must be finite and >= 0"),
    (UsageError("use blocking", field="mode", value="x"), "--mode 'x': use blocking"),
    (UsageError("bad", field="workers", value=(0, -1)), "--workers 0,-1: bad"),
    (UsageError("needs `per_sample`", field="batch_size", value=(5, 9)),
     "--batch-size 5,9: needs --per-sample"),
    (UsageError("bad", field="lr", value=(float("nan"),)), "--lr nan: bad"),
    (UsageError("use a positive int", field="eval_batches", value=0), "eval_batches=0: use a positive int"),
    (DataError("f: pass `intersect` to use only the common tensors"),
     "f: pass --intersect to use only the common tensors"),
    (UsageError("pass one", field="staleness"), "staleness: pass one"),
])
def test_library_errors_are_worded_as_flags(err: Exception, line: str) -> None:
    assert cli_message(err) == line


def test_flags_are_spelled_from_their_fields() -> None:
    assert flag("batch_size") == "--batch-size" and flag("not_a_field") == "not_a_field"
    for field, option in FLAGS.items():
        assert option.startswith("--") and (option == "--" + field.replace("_", "-")
                                            or field in ("chunk",)), (field, option)


def test_a_command_words_fields_without_a_flag_its_own_way(capsys: pytest.CaptureFixture[str]) -> None:
    """handle_errors(words=...): simulate names a key it sets with --set as --set KEY=VALUE, in the
    error line and in the text's `field` mentions, while it runs and not after."""
    import typer

    from naig_cli._common import handle_errors

    @handle_errors(words=lambda: {"dc_lambda": "--set rules.dc_lambda", "byzantine": "--set rules.byzantine"})
    def command() -> None:
        raise UsageError("too big for `byzantine` f", field="dc_lambda", value=-1.0)

    with pytest.raises((SystemExit, typer.Exit)):
        command()
    line = "error: --set rules.dc_lambda=-1.0: too big for --set rules.byzantine f"
    assert capsys.readouterr().err.strip() == line
    assert flag("dc_lambda") == "dc_lambda"  # outside the command: no wording of its own


def test_a_switch_or_a_missing_value_is_named_without_it() -> None:
    err = UsageError("needs `keys`", field="intersect", value=True)
    assert cli_message(err) == "--intersect: needs --keys"
    err = UsageError("needs two workers", field="window", value=None)
    assert cli_message(err) == "--window: needs two workers"


def test_an_error_without_text_is_still_worded(capsys) -> None:
    """A MemoryError carries no message; the one error line must still say what happened."""
    import typer

    from naig_cli._common import handle_errors

    @handle_errors
    def boom() -> None:
        raise MemoryError

    with pytest.raises(typer.Exit) as info:
        boom()
    err = capsys.readouterr().err
    assert info.value.exit_code == 1
    assert err == "error: out of memory (MemoryError); use smaller sizes or counts\n"


def test_an_os_error_names_its_path_shortened_and_the_fix(tmp_path: Path) -> None:
    """A path longer than a name may be (ENAMETOOLONG from deep in a command): one line, the path
    shortened, what went wrong and the fix; no ``[Errno 36]`` and no 300-character echo."""
    from tests.conftest import assert_one_line_error, run_naig

    long = "a" * 300
    (tmp_path / "w.safetensors").write_bytes(b"")
    r = run_naig("audit", str(tmp_path / f"{long}.safetensors"), str(tmp_path / "w.safetensors"))
    assert_one_line_error(r, 1, "(", "characters): file name too long (use a shorter path")
    line = r.stderr.strip().splitlines()[-1]
    assert "Errno" not in line and len(line) < 220


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full (every write: ENOSPC)")
def test_json_to_a_full_standard_output_is_one_line_naming_it() -> None:
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "naig_cli", "spectrum", "--json"], stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: standard output: could not write the JSON document (No space left")


def test_piped_output_has_no_trailing_spaces_and_a_terminal_gets_every_byte(monkeypatch, capsys) -> None:
    """rich pads a table's title and caption lines to the table's width: piped, those lines ended in
    spaces (simulate, detect, monitor report); the stdout console now drops them, split writes included,
    and passes a terminal's output through as written."""
    from naig_cli._common import PipedStdout

    out = PipedStdout()
    for piece in ("title   \n", "a  ", "  b   ", "\n", "last  "):
        out.write(piece)
    out.write("\n")
    assert capsys.readouterr().out == "title\na    b\nlast\n"
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    out.write("live   \r")
    assert capsys.readouterr().out == "live   \r"


def test_the_spectrum_table_piped_has_no_trailing_spaces() -> None:
    r = subprocess.run([sys.executable, "-m", "naig_cli", "spectrum"], capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0 and "Fano–Fisher metric" in r.stdout
    assert [line for line in r.stdout.splitlines() if line.endswith(" ")] == []


class _Figure:
    """A figure whose savefig writes part of a file, then ends as ``stop`` says."""

    def __init__(self, stop: BaseException | None) -> None:
        self.stop = stop

    def savefig(self, fname: str, format: str, **kwargs: object) -> None:  # noqa: A002 (matplotlib's name)
        with open(fname, "wb") as f:
            f.write(b"\x89PNG partial")
            if self.stop is not None:
                raise self.stop
            f.write(b" whole")


@pytest.mark.parametrize(("stop", "code"), [(KeyboardInterrupt(), 130), (OSError(28, "No space left"), 1)])
def test_a_plot_cut_short_leaves_no_file_under_its_name(tmp_path, capsys, stop, code) -> None:  # noqa: ANN001
    import typer

    from naig_cli._common import save_figure

    path = tmp_path / "curves.png"
    with pytest.raises(typer.Exit) as e:
        save_figure(_Figure(stop), str(path))
    assert e.value.exit_code == code and list(tmp_path.iterdir()) == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "curves.png" in err and "results above are complete" in err


def test_a_plot_is_renamed_into_place_whole(tmp_path) -> None:  # noqa: ANN001
    from naig_cli._common import save_figure

    (tmp_path / "curves.png").write_bytes(b"an older plot")
    save_figure(_Figure(None), str(tmp_path / "curves.png"))
    assert [p.name for p in tmp_path.iterdir()] == ["curves.png"]
    assert (tmp_path / "curves.png").read_bytes() == b"\x89PNG partial whole"
