"""A package's face: the names other packages import from it, loaded on first use (PEP 562).

A package's `__init__` imports its face for type checkers only (`if TYPE_CHECKING:`) and ends
with `__all__, _face = face(__name__)` and, outside type checking, `__getattr__ = _face`: that
reads those imports back from its source (one small parse as the package is imported), so
each name is written once. Importing the package imports none of its modules (the command
line starts fast, the warm server starts on the standard library); `from sweep.trial import
Outcome` imports `sweep.trial.outcome` then.
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def names(package: str) -> dict[str, str]:
    """What `package`'s `__init__` imports under `if TYPE_CHECKING:` from its own modules:
    each name with the module (dotted, absolute) that defines it."""
    source = Path(sys.modules[package].__file__ or "").read_text()
    blocks = [node for node in ast.parse(source).body if isinstance(node, ast.If)
              and getattr(node.test, "id", "") == "TYPE_CHECKING"]
    return {alias.asname or alias.name: node.module
            for block in blocks for node in ast.walk(block)
            if isinstance(node, ast.ImportFrom) and node.module
            and node.module.startswith(f"{package}.") for alias in node.names}


def face(package: str) -> tuple[list[str], Callable[[str], Any]]:
    """`package`'s `__all__` (its face's names, sorted) and its module `__getattr__`: the
    first use of a name imports the module that defines it and keeps the name in the
    package; any other name is an AttributeError (then `from package import module` imports
    the submodule, as for any package)."""
    table = names(package)
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return sorted(table), __getattr__
