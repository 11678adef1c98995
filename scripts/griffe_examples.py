"""A griffe extension for the docs site: ``Example:`` sections render as doctest examples.

naig's docstrings head their doctests ``Example:`` (Google style accepts it, and the doctests
run under pytest), but griffe's Google parser knows only ``Examples:`` and would render
``Example:`` as a plain admonition, turning ``>>>`` lines into nested quotes. This extension
renames the section heading before the docstring is parsed; the source is not changed.
mkdocs.yml loads it (``extensions: [scripts/griffe_examples.py]``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

__all__ = ["ExampleSections"]

_HEADING = re.compile(r"^(\s*)Example:[ \t]*$", flags=re.M)


class ExampleSections(griffe.Extension):
    """Rename ``Example:`` section headings to ``Examples:`` in every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring heading in place (before griffe parses it)."""
        if obj.docstring is not None:
            obj.docstring.value = _HEADING.sub(r"\1Examples:", obj.docstring.value)
