"""Shared CLI plumbing: option aliases, the field → flag table, one-line errors, JSON, progress.

Every option used by more than one command is declared once here as an ``Annotated``
alias (pattern: huggingface_hub's CLI); choice options are Enums so ``--help`` lists
the choices. Library errors carry the field at fault (``NaigError.field``); ``FLAGS``
words them as the flags a user typed. ``naig simulate`` words its own from its option table
(``naig.simulate.options.DOCS``, through ``handle_errors(words=...)``), so its fields are not
written here a second time.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import functools
import io
import math
import os
import pathlib
import re
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from enum import Enum
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from naig.choices import ARRIVAL_MODES
from naig.errors import DataError, NaigError
from naig.interrupts import sigterm_as_interrupt
from naig.io import json_ready

__all__ = [
    "FLAGS",
    "consoles",
    "fit_table",
    "narrow_note",
    "PipedStdout",
    "natural_width",
    "flag",
    "cli_message",
    "word_flags",
    "stdout",
    "stderr",
    "handle_errors",
    "print_json",
    "fail",
    "PLOT_SUFFIXES",
    "check_plot_path",
    "save_figure",
    "fmt_num",
    "kernel_path",
    "kernel_notice",
    "printable",
    "progress",
    "opt",
    "JsonOpt",
    "BetaOpt",
    "choice_enum",
    "LineOpt",
    "UplinkOpt",
    "DownlinkOpt",
    "ModeOpt",
    "WindowOpt",
]

FLAGS: dict[str, str] = {  # library field name → the flag that sets it
    "beta": "--beta",
    "line": "--line",
    "seed": "--seed",  # audit: the sketch seed
    "keys": "--keys",
    "intersect": "--intersect",
    "recursive": "--recursive",
    "sketches": "--sketches",
    "chunk": "--chunk-mb",
    "threads": "--threads",
    "csv": "--csv",
    "tol": "--tol",
    "steps": "--steps",
    "lr": "--lr",
    "batch_size": "--batch-size",
    "model": "--model",
    "data": "--data",
    "data_bytes": "--data-bytes",
    "sketch_seed": "--sketch-seed",
    "plot": "--plot",
    "faults": "--faults",
    # naig staleness (naig.arrivals)
    "workers": "--workers",
    "compute": "--compute",
    "per_sample": "--per-sample",
    "uplink": "--uplink",
    "downlink": "--downlink",
    "bandwidth": "--bandwidth",
    "params": "--params",
    "mode": "--mode",
    "window": "--window",
    "updates": "--updates",
    "sweep": "--sweep",
}


_WORDS: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("naig_cli_words", default={})  # noqa: B039


def flag(field: str) -> str:
    """The flag of a library field (``line`` → ``--line``) in the running command (``handle_errors``'s
    ``words`` first: ``--set rules.dc_lambda`` in simulate); unknown fields as they are."""
    return _WORDS.get().get(field) or FLAGS.get(field, field)


def _cli_value(value: object) -> str:
    """A value as a user would type it: ``0,10,20`` for a sequence, ``'x'`` for text."""
    if isinstance(value, tuple | list):
        return ",".join(map(str, value))
    return repr(value) if isinstance(value, str) else str(value)


def word_flags(text: str) -> str:
    """Library text that names fields in backticks, worded with the flags (```per_sample``` →
    ``--per-sample``); unknown names lose their backticks.

    Example:
        >>> word_flags("`batch_size` needs `per_sample` and `nothing`")
        '--batch-size needs --per-sample and nothing'
    """
    known = FLAGS.keys() | _WORDS.get().keys()
    return re.sub(r"`(\w+)`", lambda m: flag(m.group(1)) if m.group(1) in known else m.group(1), text)


def cli_message(exc: NaigError) -> str:
    """The one-line CLI wording of a library error: fields become flags.

    Example:
        >>> from naig.errors import UsageError
        >>> cli_message(UsageError("needs `per_sample`", field="batch_size", value=(5,)))
        '--batch-size 5: needs --per-sample'
    """
    text = word_flags(exc.message)
    if exc.field is None:
        return text
    word = _WORDS.get().get(exc.field)
    if word is not None and word.startswith("--set"):  # a key set with --set KEY=VALUE
        v = exc.value
        typed = str(v).lower() if isinstance(v, bool) else v if isinstance(v, str) else _cli_value(v)
        sep = " " if exc.field == "set" else "="  # --set KEY=VALUE as typed; a key's value after its =
        shown = word if not exc.has_value or v is None else f"{word}{sep}{typed}"
    elif word is None and exc.field not in FLAGS:  # a field without an option: name it as the library does
        shown = f"{exc.field}={exc.value!r}" if exc.has_value else exc.field
    else:
        bare = not exc.has_value or exc.value is None or isinstance(exc.value, bool)  # a switch: its name
        shown = flag(exc.field) if bare else f"{flag(exc.field)} {_cli_value(exc.value)}"
    return f"{shown}: {text}".replace("\n", " ")


def _width() -> int | None:
    """Terminal width on a TTY; 160 columns (tables shrink to fit) when piped, unless COLUMNS."""
    return None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160


class PipedStdout:
    """``sys.stdout`` (looked up at each write, as rich does) with the trailing spaces of each line
    dropped when it is not a terminal: rich pads a table's title and caption lines to the table's
    width, which piped output (a log, a diff) should not carry. A terminal gets every byte as rich
    wrote it (a live display overwrites lines)."""

    def __init__(self) -> None:
        self._spaces = ""  # trailing spaces of the last, unfinished line: written unless a line break follows

    def write(self, text: str) -> int:
        out = sys.stdout
        if out.isatty():
            return out.write(text)
        *lines, last = (self._spaces + text).split("\n")
        kept = last.rstrip(" ")
        self._spaces = last[len(kept):]
        out.write("".join(line.rstrip(" ") + "\n" for line in lines) + kept)
        return len(text)

    def flush(self) -> None:
        sys.stdout.flush()

    def isatty(self) -> bool:
        return sys.stdout.isatty()

    def fileno(self) -> int:
        return sys.stdout.fileno()

    @property
    def encoding(self) -> str:
        return getattr(sys.stdout, "encoding", None) or "utf-8"


def consoles() -> tuple[Console, Console]:
    """The (stdout, stderr) consoles as built from this process's environment and terminal: rich reads
    ``COLUMNS``, ``LINES``, ``NO_COLOR``, ``FORCE_COLOR``, ``COLORTERM`` and more once, when a
    console is made."""
    return Console(highlight=False, width=_width(), file=PipedStdout()), Console(stderr=True, highlight=False)


stdout, stderr = consoles()
F = TypeVar("F", bound=Callable[..., Any])
_NO_TEXT = {MemoryError: "out of memory (MemoryError); use smaller sizes or counts"}  # errors without text


_NOT_BUILT = "numpy; the C extension was not built"


def kernel_path() -> str:
    """Which body of the sketch kernel runs: the C extension and its vector bodies
    (``naig.sketch.kernels.compiled_isa``: ``avx512-ifma``, ``avx512``, ``avx2`` or ``portable``),
    or numpy and why.

    Example:
        >>> kernel_path().startswith(("C", "numpy"))
        True
    """
    from naig.sketch.kernels import HAVE_COMPILED

    if HAVE_COMPILED:
        from naig.sketch.kernels import compiled_isa

        return f"C, {compiled_isa()}"
    if os.environ.get("NAIG_PURE_NUMPY") == "1":
        return "numpy, forced by NAIG_PURE_NUMPY=1"
    return _NOT_BUILT


def kernel_notice() -> str | None:
    """A one-line warning when the C kernel is missing without being asked to be (None otherwise)."""
    if kernel_path() != _NOT_BUILT:
        return None
    return ("the C sketch kernel was not built (no C compiler at install time), so the audit runs on its "
            "numpy path: the same numbers to rounding, about 20x slower; reinstall naig where a C "
            "compiler is available")


def fail(message: str, code: int) -> None:
    """Print ``error: message`` as one line on stderr (names made printable) and exit with ``code``."""
    sys.stderr.write(f"error: {printable(message)}\n")
    raise typer.Exit(code)


PLOT_SUFFIXES = (".png", ".pdf", ".svg")  # what --plot's help promises (no extra package needed)


def check_plot_path(plot: str | None, example: str, inputs: tuple[tuple[str, object], ...] = ()) -> None:
    """Refuse a ``--plot`` target before any work: a suffix not in ``PLOT_SUFFIXES``, a missing or
    unwritable folder, a directory, one of the command's ``inputs`` (name, path), then matplotlib missing.

    The folder is probed by creating and removing a temporary file in it (``os.access`` says yes to
    root even in ``/proc``). Raises ``UsageError`` naming ``--plot`` (exit 2).
    """
    if plot is None:
        return
    import importlib.util
    from pathlib import Path

    from naig.errors import UsageError

    p = Path(plot)
    if p.is_dir() or plot.endswith(("/", os.sep)):  # 'x.png/' names a folder: savefig fails after the work
        raise UsageError(f"is a directory; give a file name in it, e.g. {p / example}", field="plot",
                         value=plot)
    if p.suffix.lower() not in PLOT_SUFFIXES:
        raise UsageError(f"use a .png, .pdf or .svg file name, e.g. {example}", field="plot", value=plot)
    folder = p.absolute().parent
    if not folder.is_dir():
        raise UsageError(f"its folder must exist ({folder} does not); create it or choose another path",
                         field="plot", value=plot)
    if not os.access(folder, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageError("is not writable; choose a path in a folder you can write", field="plot",
                         value=plot)
    for name, path in inputs:
        if path is not None and p.exists() and Path(str(path)).exists() and p.samefile(str(path)):
            raise UsageError(f"would overwrite the {name}; choose another path", field="plot", value=plot)
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".naig-plot-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"cannot write in its folder ({exc.strerror or exc}); choose a path in a folder you "
                         "can write", field="plot", value=plot) from None
    if importlib.util.find_spec("matplotlib") is None:  # last: a bad path is named whether or not it is there
        raise UsageError("needs matplotlib; install it with pip install matplotlib (in a checkout: pip "
                         "install -e '.[plot]')", field="plot")


def save_figure(fig: Any, path: str, **kwargs: Any) -> None:
    """``fig.savefig(path, **kwargs)`` through a temporary file in the same folder, renamed over
    ``path`` once whole: a plot cut short (disk full, Ctrl-C) never lies under the name asked for. An
    OSError is a one-line error naming ``--plot`` with exit 1; a Ctrl-C one with exit 130."""
    from naig.io import temp_beside  # the permissions of a file the user creates (mkstemp's are 0600)

    name, tmp = os.path.basename(path), None
    try:
        fd, tmp = temp_beside(pathlib.Path(path), ".partial")
        os.close(fd)
        fig.savefig(tmp, format=os.path.splitext(name)[1].lstrip(".").lower(), **kwargs)
        os.replace(tmp, path)
    except OSError as exc:
        if os.environ.get("NAIG_DEBUG") == "1":
            raise
        fail(f"--plot {_cli_value(path)}: could not write it ({exc.strerror or exc}); the results above are "
             "complete, choose another path to get the plot", 1)
    except KeyboardInterrupt:
        fail(f"interrupted while writing --plot {_cli_value(path)}: the results above are complete; no plot "
             "was written", 130)
    finally:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def handle_errors(fn: F | None = None, *, words: Callable[[], Mapping[str, str]] | None = None) -> Any:
    """Turn ``NaigError`` (and OS/memory errors) into one-line errors, a Ctrl-C not caught by the command
    into `error: interrupted ...` (exit 130); NAIG_DEBUG=1 re-raises the errors.

    Used bare (``@handle_errors``) or with ``words``: the command's own wording of fields that
    have no flag in ``FLAGS`` there (``{"dc_lambda": "--set rules.dc_lambda"}``), applied to its
    errors and to ``word_flags`` while it runs.
    """
    if fn is None:
        return functools.partial(handle_errors, words=words)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        token = _WORDS.set(dict(words()) if words is not None else {})
        try:
            with sigterm_as_interrupt():  # a scheduler's stop is a Ctrl-C: one line, exit 130
                return fn(*args, **kwargs)
        except (NaigError, OSError, MemoryError) as exc:
            if os.environ.get("NAIG_DEBUG") == "1":
                raise
            if isinstance(exc, NaigError):
                fail(cli_message(exc), exc.exit_code)
            fail(_os_line(exc) if isinstance(exc, OSError) else
                 str(exc).replace("\n", " ") or _NO_TEXT.get(type(exc), type(exc).__name__), 1)
        except KeyboardInterrupt:  # a command that reports what finished catches it itself
            fail("interrupted before the command had a result to report", 130)
        finally:
            _WORDS.reset(token)

    return wrapper


_OS_HINTS = {errno.ENAMETOOLONG: "use a shorter path: each name in it must fit in 255 bytes",
             errno.ENOSPC: "free some space or write elsewhere"}


def _os_line(exc: OSError) -> str:
    """An OS error as ``PATH: what went wrong (the fix)``: the path shortened to 100 characters, no
    ``[Errno N]``; without a file, what went wrong (the fix).

    Example:
        >>> _os_line(PermissionError(13, "Permission denied", "runs/log.csv"))
        'runs/log.csv: permission denied'
        >>> _os_line(OSError(36, "File name too long", "a" * 300)).split(": ", 1)[1]
        'file name too long (use a shorter path: each name in it must fit in 255 bytes)'
    """
    if not exc.strerror:
        return str(exc).replace("\n", " ") or _NO_TEXT.get(type(exc), type(exc).__name__)
    hint = _OS_HINTS.get(exc.errno)
    what = f"{exc.strerror[:1].lower()}{exc.strerror[1:]}" + (f" ({hint})" if hint else "")
    if exc.filename is None:  # e.g. a write to a full standard output
        return what
    path = os.fsdecode(exc.filename) if isinstance(exc.filename, bytes | str) else str(exc.filename)
    if len(path) > 100:
        path = f"{path[:62]}…{path[-37:]} ({len(path)} characters)"
    return f"{path}: {what}"


def fmt_num(v: float | None, spec: str, big: float | None = None) -> str:
    """Format a number for a table cell; ``—`` for None, NaN, ±inf and anything undefined.

    With ``big``, a magnitude ≥ ``big`` is written ``1.235e+30`` whatever ``spec`` says.

    Example:
        >>> fmt_num(3.14159, ".2f"), fmt_num(None, ".2f"), fmt_num(2e30, ".2f", big=1e6)
        ('3.14', '—', '2.000e+30')
    """
    if v is None or not math.isfinite(v):
        return "—"
    return format(v, ".3e") if big is not None and abs(v) >= big else format(v, spec)


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")  # C0 and C1 control characters
_LONE_SURROGATE = re.compile("[\ud800-\udc7f\udd00-\udfff]")  # surrogates surrogateescape did not make


def printable(obj: Any) -> Any:
    r"""Strings (also inside dicts and lists) with undecodable file-name bytes and control
    characters written as ``\xff`` and ``\x1b``.

    Python keeps undecodable bytes of a file name as lone surrogates, which no UTF-8 output
    (table, CSV, JSON) can hold; control characters (an escape sequence in a file name)
    would reach the terminal and could redraw it.

    Example:
        >>> printable({"file": "w\udcff\x1b[31m.safetensors", "n": [1, "ok"]})
        {'file': 'w\\xff\\x1b[31m.safetensors', 'n': [1, 'ok']}
    """
    if isinstance(obj, str):
        obj = _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", obj)  # not from a file name's bytes
        text = obj.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    if isinstance(obj, dict):
        return {printable(k): printable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [printable(v) for v in obj]
    return obj


def print_json(doc: Any) -> None:
    """Write one strict JSON document (NaN/Inf → null) to stdout.

    Raises:
        DataError: standard output cannot take it (a full disk, a closed pipe), saying so.
    """
    import json

    text = json.dumps(json_ready(doc), indent=2, default=str) + "\n"
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as exc:
        raise DataError(f"standard output: could not write the JSON document ({exc.strerror or exc}); "
                        "send it to a file with room, e.g. > result.json, or to a reader that reads it "
                        "all") from None


@contextlib.contextmanager
def progress(description: str, total: int | None, *, bytes_: bool = False) -> Iterator[Callable[..., None]]:
    """A rich progress bar on stderr when it is a TTY; a no-op callback otherwise.

    Yields ``advance(n=1)``. ``total=None`` gives an open-ended bar; ``bytes_`` shows
    sizes and transfer speed (the audit) instead of a count of steps (the simulator).
    """
    if not sys.stderr.isatty():
        yield lambda n=1: None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    cols = (DownloadColumn(), TransferSpeedColumn()) if bytes_ else (MofNCompleteColumn(),
                                                                     TimeRemainingColumn())
    with Progress(description, BarColumn(), *cols, console=stderr, transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task, n)


def choice_enum(name: str, values: tuple[str, ...]) -> type[Enum]:
    """A ``str`` Enum of a closed choice of the library (``naig.choices``), for typer.

    Example:
        >>> [m.value for m in choice_enum("Mode", ("blocking", "non-blocking"))]
        ['blocking', 'non-blocking']
    """
    return Enum(name, {v.replace("-", "_"): v for v in values}, type=str)  # type: ignore[return-value]


ArrivalMode = choice_enum("ArrivalMode", ARRIVAL_MODES)


def opt(flag: str, text: str, **kwargs: Any) -> Any:
    """``typer.Option(flag, help=text, **kwargs)``, short enough for one signature line."""
    return typer.Option(flag, help=text, **kwargs)


JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
BetaOpt = Annotated[str, typer.Option("--beta", help="Gibbs inverse temperature β: 'auto' or a float >= 0.")]
LineOpt = Annotated[str, typer.Option("--line", help="Oriented Fano line I,J,K of the metric Ψ.")]
UplinkOpt = Annotated[str | None, typer.Option(
    "--uplink", help="Latency of a gradient message, seconds: const:MEAN, exp:MEAN, ... (one, or one "
    "per worker; const:0 for none).")]
DownlinkOpt = Annotated[str | None, typer.Option(
    "--downlink", help="Latency of a parameter message, seconds (one, or one per worker).")]
ModeOpt = Annotated[ArrivalMode, typer.Option(  # type: ignore[valid-type]
    "--mode", help="blocking: wait for fresh parameters; non-blocking: compute back to back; "
    "shared-memory: blocking without messages.")]
WindowOpt = Annotated[int, typer.Option(
    "--window", help="B arrivals per server update (1: ASGD; K: K-batch-async).")]


def narrow_note(hidden: Sequence[str]) -> str:
    """The line under a table that left ``hidden`` columns out: how to see them (a terminal: widen it;
    piped output, 160 columns unless COLUMNS: set COLUMNS)."""
    how = "widen the terminal" if sys.stdout.isatty() else "set COLUMNS wider (e.g. COLUMNS=250)"
    return f"(too narrow for {', '.join(hidden)}: {how} or use --json)"


def fit_table(build: Callable[[list[str]], Table], columns: Sequence[str], drop: Sequence[str],
              width: int) -> tuple[Table, list[str]]:
    """The widest table that fits: ``build(columns)``, then without ``drop[0]``, ``drop[1]``, … .

    Cells never wrap (the caller builds them ``no_wrap``): columns are left out instead, in
    ``drop`` order, until the table's natural width is at most ``width`` (or nothing more may go).

    Returns:
        The table and the columns left out (for a line saying so; ``--json`` has them all).
    """
    kept = list(columns)
    table = build(kept)
    for name in drop:
        if natural_width(table) <= width:
            break
        if name in kept:
            kept.remove(name)
            table = build(kept)
    return table, [c for c in columns if c not in kept]


def natural_width(table: Table) -> int:
    """Columns ``table`` needs without wrapping any cell."""
    probe = Console(width=10_000, file=io.StringIO())
    return table.__rich_measure__(probe, probe.options).maximum
