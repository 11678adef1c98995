"""Write docs/cli.md, the CLI reference, from the Typer app (every command, argument and option).

The reference is generated, never edited: the help texts in ``naig_cli`` are its source.
tests/test_docs.py regenerates it into a temporary file and fails when docs/cli.md differs.
It uses Typer's own Markdown generator (``typer naig_cli.main utils docs``), with the app's
markup mode, and adds a header saying how to regenerate the page.

Usage: python scripts/gen_cli_reference.py [--output docs/cli.md]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import typer
import typer.cli
import typer.main

__all__ = ["COMMAND", "render", "main"]

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "python scripts/gen_cli_reference.py"
_HEADER = (
    "<!-- Generated from the Typer app by `{command}`; do not edit. -->\n\n"
    "# CLI reference\n\n"
    "Every command of `naig`, with its arguments and options, as `naig COMMAND --help` prints them.\n"
    "This page is generated from the code (`{command}`); the [guides](index.md#where-to-read-next)\n"
    "explain what the commands compute.\n\n"
)


def render() -> str:
    """The Markdown of the CLI reference (str, ending in one newline), from this checkout's app."""
    if str(ROOT) not in sys.path:  # run as a script, sys.path[0] is scripts/: use this checkout's naig_cli
        sys.path.insert(0, str(ROOT))
    from naig_cli.main import app

    command = typer.main.get_command(app)
    ctx = typer.Context(command)
    ctx.ensure_object(dict)
    ctx.obj[typer.cli.MARKUP_MODE_KEY] = app.rich_markup_mode
    body = typer.cli.get_docs_for_click(obj=command, ctx=ctx, name="naig").strip()
    body = re.sub(r"^(#+ `naig)", r"#\1", body, flags=re.M)  # one level down, under the page title
    return _HEADER.format(command=COMMAND) + body + "\n"


def main(argv: list[str] | None = None) -> None:
    """Write the reference to ``--output`` (default docs/cli.md)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "cli.md")
    args = parser.parse_args(argv)
    args.output.write_text(render(), encoding="utf-8")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
