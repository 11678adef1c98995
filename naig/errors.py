"""Errors raised by naig, each carrying the exit code the CLI should use.

``DataError`` (exit 1) means the input data cannot be used; ``UsageError``
(exit 2) means an option or argument is malformed. Messages are one line:
what was expected, what was received, and how to fix it.

An error about one argument carries its ``field`` (the library's name, e.g.
``beta``) and the ``value`` received, and its text reads ``beta=-1.0: must be …``.
Other fields it mentions are written in backticks (```save_grads```). The CLI
rewords both as the flags a user typed (``--beta -1.0``, ``--save-grads``) from one
table (``naig_cli._common.FLAGS``), so library errors never speak CLI.

Example:
    >>> err = UsageError("must be finite and >= 0", field="beta", value=-1.0)
    >>> str(err)
    'beta=-1.0: must be finite and >= 0'
    >>> err.field, err.value, err.exit_code
    ('beta', -1.0, 2)
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable

__all__ = ["NaigError", "DataError", "UsageError", "RunError", "VerificationError", "SEED_MAX", "a_type",
           "check_seed", "run_main", "warn_caller"]

SEED_MAX = (1 << 64) - 1  # seeds are uint64

_NO_VALUE = object()


class NaigError(Exception):
    """Base class of naig errors.

    Args:
        message: what is wrong and how to fix it (one line). Other fields are named
            in backticks, e.g. ```save_grads```.
        field: the argument or config field at fault (``None``: the input as a whole).
        value: the value received for ``field``.

    Attributes:
        exit_code: the CLI exit status (1 data, 2 usage).
    """

    exit_code: int = 1

    def __init__(self, message: str, *, field: str | None = None, value: object = _NO_VALUE) -> None:
        self.message = message
        self.field = field
        self.value = None if value is _NO_VALUE else value
        self.has_value = value is not _NO_VALUE
        super().__init__(message)

    def __str__(self) -> str:
        if self.field is None:
            return self.message
        shown = f"{self.field}={self.value!r}" if self.has_value else self.field
        return f"{shown}: {self.message}"


class DataError(NaigError, ValueError):
    """Unusable input data (missing/corrupt file, mismatched tensors). Exit code 1."""

    exit_code = 1


class UsageError(NaigError, ValueError):
    """A malformed option or argument (bad line, negative beta). Exit code 2."""

    exit_code = 2


class RunError(NaigError):
    """A run could not finish: the process running it ended first (killed, out of memory). Exit code 1."""

    exit_code = 1


class VerificationError(NaigError):
    """A mathematical certificate failed to verify. Exit code 1."""

    exit_code = 1


def a_type(obj: object) -> str:
    """``obj``'s type name with its article, for messages: ``a list``, ``an int``.

    Example:
        >>> a_type(3), a_type([1]), a_type(None)
        ('an int', 'a list', 'a NoneType')
    """
    name = type(obj).__name__
    return ("an " if name[:1].lower() in "aeiou" else "a ") + name


def check_seed(seed: object, field: str = "seed") -> int:
    """Validate a seed (a sketch's, a simulation's): an int with 0 <= seed < 2^64 (a uint64).

    Args:
        seed: the value to check (an ``int`` or a numpy integer; not a bool).
        field: the argument name errors carry (``UsageError.field``).

    Returns:
        The seed as an ``int``.

    Raises:
        UsageError: for a non-int, negative or too large seed.
    """
    if isinstance(seed, bool) or not hasattr(type(seed), "__index__"):  # int, numpy integers
        raise UsageError("must be an int in 0..2^64-1, e.g. 0", field=field, value=seed)
    value = seed.__index__()
    if not 0 <= value <= SEED_MAX:
        raise UsageError("must be an int in 0..2^64-1, e.g. 0", field=field, value=seed)
    return int(value)


def run_main(main: Callable[[list[str]], object], argv: list[str]) -> None:
    """Run a script's ``main(argv)`` with naig's errors as one line ``error: …`` on stderr, no traceback.

    For scripts outside the CLI (the examples, each rank of a recipe); the CLI has its own entry.

    Args:
        main: the script's entry, called with ``argv``.
        argv: its arguments (``sys.argv[1:]``).

    Raises:
        SystemExit: with the error's ``exit_code`` (2 usage, 1 data) after printing it; with
            ``NAIG_DEBUG=1`` the error propagates with its traceback instead.
    """
    try:
        main(argv)
    except NaigError as exc:
        if os.environ.get("NAIG_DEBUG") == "1":
            raise
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(exc.exit_code)


# Top-level packages whose frames are not "the caller": naig and the frameworks that call its hooks.
_LIBRARIES = frozenset({"naig", "torch", "lightning", "pytorch_lightning", "transformers", "accelerate"})


def warn_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` pointing at the user's line: the first frame outside naig and the training
    frameworks that call it (torch, Lightning, Transformers, Accelerate).

    A warning raised inside a DDP hook during ``loss.backward()`` is then shown at that
    ``backward`` line (or ``trainer.fit``), not at naig's own. When every frame is a library's
    (a hook run on a framework thread), it points at naig's caller.

    Args:
        message: the one-line warning.
        category: its class.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as w:
        ...     warnings.simplefilter("always")
        ...     warn_caller("careful")
        >>> w[0].message.args[0]
        'careful'
    """
    frame, level = sys._getframe(1), 2
    while frame is not None and str(frame.f_globals.get("__name__", "")).split(".")[0] in _LIBRARIES:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level if frame is not None else 2)
