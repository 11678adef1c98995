"""Write docs/cli.md, the CLI reference, from the Typer app (every command, argument and option),
and the Config keys table of docs/simulate.md from ``naig.simulate.options.DOCS``.

Both are generated, never edited: the help texts in ``naig_cli`` and the option table of the
simulator are their source. tests/test_docs.py regenerates them into temporary files and fails
when the committed pages differ. The reference uses Typer's own Markdown generator (``typer
naig_cli.main utils docs``), with the app's markup mode, and adds a header saying how to
regenerate the page; the table replaces what lies between the ``config-keys`` markers.

Usage: python scripts/gen_cli_reference.py [--output docs/cli.md] [--simulate docs/simulate.md]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import typer
import typer.cli
import typer.main

__all__ = ["COMMAND", "render", "config_keys", "with_config_keys", "main"]

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


BEGIN = "<!-- config-keys: generated from naig.simulate.options by `{command}`; do not edit -->"
END = "<!-- /config-keys -->"


def config_keys() -> str:
    """The Markdown of the keys without a flag (a table: key, what it sets, default) and a sentence
    naming the keys that have one, from ``naig.simulate.options.DOCS``."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from naig.simulate.options import DOCS

    rows = [f"| `{d.key}` | {d.help} | {d.shown_default or 'none'} |" for d in DOCS if d.flag is None]
    flags = ", ".join(f"`{d.key}` ({d.flag})" for d in DOCS if d.flag is not None)
    return "\n".join(["| Key | What it sets | Default |", "|---|---|---|", *rows, "",
                      f"The others have a flag: {flags}."])


def with_config_keys(page: str) -> str:
    """``page`` with the text between the config-keys markers replaced by ``config_keys()``.

    Raises:
        ValueError: the page lacks the markers.
    """
    begin = BEGIN.format(command=COMMAND)
    if begin not in page or END not in page:
        raise ValueError(f"the page has no {begin} ... {END} block")
    head, rest = page.split(begin, 1)
    return f"{head}{begin}\n{config_keys()}\n{END}{rest.split(END, 1)[1]}"


def main(argv: list[str] | None = None) -> None:
    """Write the reference to ``--output`` (default docs/cli.md) and the Config keys table into
    ``--simulate`` (default docs/simulate.md)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "cli.md")
    parser.add_argument("--simulate", type=Path, default=ROOT / "docs" / "simulate.md")
    args = parser.parse_args(argv)
    args.output.write_text(render(), encoding="utf-8")
    print(f"wrote {args.output}")
    args.simulate.write_text(with_config_keys(args.simulate.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote the Config keys of {args.simulate}")


if __name__ == "__main__":
    main()
