"""Errors raised by naig, each carrying the exit code the CLI should use.

``DataError`` (exit 1) means the input data cannot be used; ``UsageError``
(exit 2) means an option or argument is malformed. Messages are one line:
what was expected, what was received, and how to fix it.
"""

from __future__ import annotations

__all__ = ["NaigError", "DataError", "UsageError", "VerificationError"]


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
