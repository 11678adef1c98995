"""Build the ``naig`` Typer app; each command lives in its own module."""

from __future__ import annotations

import sys
from typing import Any

import click
import typer

from naig import __version__
from naig_cli import audit, simulate, spectrum

__all__ = ["app"]


class _OneLineErrors(typer.Typer):
    """A Typer app whose usage errors (missing argument, bad type) print one line and exit 2."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            code = super().__call__(*args, standalone_mode=False, **kwargs)
        except click.exceptions.ClickException as exc:
            where = exc.ctx.command_path if getattr(exc, "ctx", None) else "naig"
            message = exc.format_message().replace("\n", " ")
            if message.strip():  # no-args-is-help has already printed the help
                sys.stderr.write(f"error: {message} See '{where} --help'.\n")
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            sys.exit(130)
        sys.exit(code if isinstance(code, int) else 0)


app = _OneLineErrors(
    name="naig",
    help="Audit gradient compatibility in asynchronous and distributed training.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"naig {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Certify the Fano–Fisher metric, audit gradient files, simulate stale workers."""


app.command("spectrum")(spectrum.spectrum)
app.command("audit")(audit.audit)
app.command("simulate")(simulate.simulate)
