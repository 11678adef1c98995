"""Build the ``naig`` Typer app; each command lives in its own module."""

from __future__ import annotations

import typer

from naig import __version__
from naig_cli import audit, simulate, spectrum

__all__ = ["app"]

app = typer.Typer(
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
