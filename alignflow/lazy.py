"""Lazy package exports (PEP 562): a package names what it exports and from which of its modules; each name is
imported on first use and kept. `alignflow.convert` (torch), `alignflow.compare` (pandas, matplotlib) and
`alignflow.logs` (pandas) use it, so that importing one of their light modules does not pull the heavy ones."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """The package's module-level `__getattr__`: `name` comes from `package.<exports[name]>`, or from
    `exports[name]` itself when that is a dotted module path."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module if "." in module else f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
