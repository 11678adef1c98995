"""Public names resolved on first use (PEP 562), for packages whose names live in their submodules.

A package that re-exports its submodules' names imports them all when it is imported: for
``naig.monitor`` and ``naig.simulate`` that is torch, 1 s and more, where reading a log or the CLI's
option table needs none of it. ``lazy_names`` gives such a package the module-level ``__getattr__``
and ``__dir__`` that import a submodule when one of its names is first asked for, and cache it.

Example:
    >>> getattr_, dir_ = lazy_names("json", {"decoder": ("JSONDecodeError",)}, {"__all__": []})
    >>> getattr_("JSONDecodeError").__name__
    'JSONDecodeError'
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, home: Mapping[str, Sequence[str]], namespace: dict[str, Any]
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``.

    Args:
        package: the package's name (``__name__``).
        home: submodule (relative to the package) → the public names it defines.
        namespace: the package's ``globals()``; a resolved name is cached there, and its
            ``__all__`` joins ``dir()``.

    Returns:
        ``__getattr__(name)``, raising ``AttributeError`` for a name of no submodule, and ``__dir__()``.
    """
    module_of = {name: module for module, names in home.items() for name in names}

    def __getattr__(name: str) -> Any:  # noqa: N807
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:  # noqa: N807
        return sorted([*namespace, *namespace.get("__all__", ())])

    return __getattr__, __dir__
