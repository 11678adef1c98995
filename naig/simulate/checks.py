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
    """The folder ``path`` is, or would be created in, a writable directory (else ``UsageError``).

    Writability is probed by creating and removing an empty temporary file in the nearest existing
    folder: ``os.access`` says yes to root everywhere, ``/proc`` included, where the run would fail
    only after training. A path the system refuses to look at (a name over 255 bytes) is refused too.
    """
    import tempfile

    p = Path(path)
    try:
        check(not p.exists() or p.is_dir(), name, path,
              "is a file, so it is not a directory; pass a directory (it is created if missing)")
        existing = next(q for q in (p, *p.parents) if q.exists() or q == q.parent)
    except OSError as exc:
        raise UsageError(f"cannot be used ({exc.strerror or exc}); pass a shorter or another path",
                         field=name, value=path if len(path) <= 100 else f"{path[:60]}…") from None
    check(existing.is_dir(), name, path, f"{existing} is not a directory; pass a directory (it is created if "
          "missing)")
    try:
        fd, probe = tempfile.mkstemp(prefix=".naig-probe-", dir=existing)
    except OSError:
        raise UsageError(f"{existing} is not writable; pass a directory you can write to", field=name,
                         value=path) from None
    os.close(fd)
    os.unlink(probe)


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
