"""Errors raised by naig, each carrying the exit code the CLI should use.

``DataError`` (exit 1) means the input data cannot be used; ``UsageError``
(exit 2) means an option or argument is malformed. Messages are one line:
what was expected, what was received, and how to fix it.
"""

from __future__ import annotations

__all__ = ["NaigError", "DataError", "UsageError", "VerificationError", "show"]


class NaigError(Exception):
    """Base class of naig errors; ``exit_code`` is the CLI exit status."""

    exit_code: int = 1


class DataError(NaigError, ValueError):
    """Unusable input data (missing/corrupt file, mismatched tensors). Exit code 1."""

    exit_code = 1


class UsageError(NaigError, ValueError):
    """A malformed option or argument (bad line, negative beta). Exit code 2."""

    exit_code = 2


class VerificationError(NaigError):
    """A mathematical certificate failed to verify. Exit code 1."""

    exit_code = 1


def show(name: str, value: object) -> str:
    """Name a value in a message: ``--beta 1`` for a CLI option, ``beta=1`` for an argument.

    CLI code passes option names (``"--beta"``); library code passes argument
    names (``"beta"``), so each error names what its caller actually typed.
    """
    return f"{name} {value!r}" if name.startswith("-") else f"{name}={value!r}"
