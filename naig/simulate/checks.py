"""The checks every setting and the config tree share: one-line ``UsageError``s naming the field.

Example:
    >>> check(True, "steps", 5, "use a positive int")
    >>> is_int(True), is_number(2.5)
    (False, True)
"""

from __future__ import annotations

import os
from pathlib import Path

from naig.errors import UsageError

__all__ = ["MAX_STEPS", "check", "check_writable_dir", "as_tuple", "is_int", "is_number"]

MAX_STEPS = 10**9  # server steps per run, and inner steps per phase


def check_writable_dir(path: str, name: str) -> None:
    """The folder ``path`` is, or would be created in, a writable directory (else ``UsageError``)."""
    p = Path(path)
    check(not p.exists() or p.is_dir(), name, path,
          "is a file, so it is not a directory; pass a directory (it is created if missing)")
    existing = next(q for q in (p, *p.parents) if q.exists() or q == q.parent)
    check(existing.is_dir(), name, path, f"{existing} is not a directory; pass a directory (it is created if "
          "missing)")
    check(os.access(existing, os.W_OK | os.X_OK), name, path,
          f"{existing} is not writable; pass a directory you can write to")


def as_tuple(value: object, name: str, example: str) -> tuple:
    """A list option as a tuple: a sequence as is, one number as a one-item tuple.

    Raises:
        UsageError: naming ``name`` for text or anything else that is not a list of values.

    Example:
        >>> as_tuple([0, 1], "lags", "0, 10"), as_tuple(5, "local_steps", "10")
        ((0, 1), (5,))
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise UsageError(f"use a list of values, e.g. [{example}]", field=name, value=value)
    return tuple(value)


def is_int(value: object) -> bool:
    """Whether ``value`` is an int and not a bool (a config's ``true`` is not 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """Whether ``value`` is an int or a float and not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def check(ok: bool, name: str, value: object, message: str) -> None:
    """Raise ``UsageError(message, field=name, value=value)`` unless ``ok``."""
    if not ok:
        raise UsageError(message, field=name, value=value)
