"""Build the ``naig`` Typer app; each command lives in its own module."""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperGroup

from naig import __version__
from naig_cli import audit, detect, monitor, simulate, spectrum, staleness

__all__ = ["app"]


class _OneLineGroup(TyperGroup):
    """The app's command group: usage errors (missing argument, bad type) print one line, exit 2.

    It wraps the group's ``main``, so ``naig``, ``python -m naig_cli`` and Typer's
    ``CliRunner`` all get the same one-line errors. Usage errors are recognised by
    their interface (``format_message`` and ``exit_code``), not by the class of the
    click that raised them.
    """

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except Exception as exc:
            if not (hasattr(exc, "format_message") and hasattr(exc, "exit_code")):
                if type(exc).__name__ == "Abort":  # Ctrl-C at a prompt
                    sys.exit(130)
                raise
            ctx = getattr(exc, "ctx", None)
            where = ctx.command_path if ctx is not None else "naig"
            message = exc.format_message().replace("\n", " ").strip()
            if message:  # no-args-is-help has already printed the help
                stop = "" if message.endswith((".", "!", "?")) else "."
                sys.stderr.write(f"error: {message}{stop} See '{where} --help'.\n")
            sys.exit(exc.exit_code)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    name="naig",
    cls=_OneLineGroup,
    help="Audit gradient compatibility in asynchronous and distributed training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # paragraphs wrap to the terminal; examples keep their lines
)


def _version(value: bool) -> None:
    if value:
        from naig_cli._common import kernel_path

        typer.echo(f"naig {__version__} (sketch kernel: {kernel_path()})")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Certify the Fano–Fisher metric, audit gradient files, simulate stale workers and their staleness."""


app.command("spectrum")(spectrum.spectrum)
app.command("audit", epilog=audit.SYMBOLS)(audit.audit)
app.command("simulate", epilog=simulate.EXAMPLES)(simulate.simulate)
app.command("staleness", epilog=staleness.SYMBOLS)(staleness.staleness)
app.add_typer(monitor.app, name="monitor")
app.command("detect", epilog=detect.EXAMPLES)(detect.detect)
