"""Shared CLI plumbing: one-line errors with exit codes, JSON output, consoles."""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console

from naig.errors import NaigError

__all__ = ["stdout", "stderr", "handle_errors", "print_json", "fail", "fmt_num"]


def _width() -> int | None:
    """Terminal width on a TTY; 160 columns (tables shrink to fit) when piped, unless COLUMNS."""
    return None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160


stdout = Console(highlight=False, width=_width())
stderr = Console(stderr=True, highlight=False)
F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int) -> None:
    """Print ``error: message`` as one line on stderr and exit with ``code``."""
    sys.stderr.write(f"error: {message}\n")
    raise typer.Exit(code)


def handle_errors(fn: F) -> F:
    """Turn ``NaigError`` (and OS/memory errors) into one-line errors; NAIG_DEBUG=1 re-raises."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (NaigError, OSError, MemoryError) as exc:
            if os.environ.get("NAIG_DEBUG") == "1":
                raise
            code = exc.exit_code if isinstance(exc, NaigError) else 1
            fail(str(exc).replace("\n", " "), code)

    return wrapper  # type: ignore[return-value]


def _clean(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def fmt_num(v: float | None, spec: str) -> str:
    """Format a number for a table cell; ``—`` for None, NaN and anything undefined."""
    return "—" if v is None or v != v else format(v, spec)


def print_json(doc: Any) -> None:
    """Write one strict JSON document (NaN/Inf → null) to stdout."""
    import json

    sys.stdout.write(json.dumps(_clean(doc), indent=2, default=str) + "\n")
