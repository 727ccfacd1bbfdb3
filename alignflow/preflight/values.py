"""The values preflight compares: each setting's effective value and where it came from.

A `Value` always carries its source — the YAML key path on the NPU side (`model.num_hidden_layers`), the flag on
the GPU side (`--num-layers`), or the documented default that applied (`--hidden-dropout (Megatron default)`) —
because a mismatch report is only useful when it says which line to change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class _Missing:
    """Marker of a setting a side does not state and has no documented default for."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "not set"


MISSING: Any = _Missing()


class _Undeclared:
    """Marker of a setting a side cannot be read for and does not declare (a `command` side)."""

    _instance: _Undeclared | None = None

    def __new__(cls) -> _Undeclared:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "not declared"


UNDECLARED: Any = _Undeclared()


@dataclass(frozen=True, slots=True)
class Value:
    """One side's effective value of a setting and the place it came from."""

    value: Any
    source: str

    @property
    def missing(self) -> bool:
        return self.value is MISSING

    @property
    def undeclared(self) -> bool:
        return self.value is UNDECLARED

    def show(self) -> str:
        return f"{display(self.value)} ({self.source})"


@dataclass(frozen=True, slots=True)
class DataFile:
    """The data file one side reads: as written in its config, and what alignflow binds that path to.

    `{in:data}` (or a host path declared in `data.host_paths`) is the experiment's data file, whose sha256 the
    runner verifies on every host before a training starts; any other path is a file alignflow knows nothing about.
    """

    path: str
    sha256: str | None  # the bound data file's fingerprint, when known before the run
    bound: bool  # True: the experiment's data file (same bytes on every host, verified at staging)
    suffix: str = ""  # what follows the data dir, e.g. "/<prefix>" for Megatron indexed data

    def __str__(self) -> str:
        if not self.bound:
            return f"{self.path} -> not the experiment's data file"
        fp = f"sha256 {self.sha256[:16]}…" if self.sha256 else "sha256 verified when staged"
        return f"{self.path} -> experiment data ({fp})"

    def same_as(self, other: DataFile) -> bool:
        return self.bound and other.bound and self.suffix == other.suffix and (
            self.sha256 is None or other.sha256 is None or self.sha256 == other.sha256)


Settings = Mapping[str, Value]


def display(value: Any) -> str:
    """A value as a person reads it in a report (`1e-05`, `[0, 1, 1, 1]`, `True`)."""
    if value is MISSING:
        return "not set"
    if value is UNDECLARED:
        return "not declared"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple | list):
        return "[" + ", ".join(display(v) for v in value) + "]"
    return str(value)


def same(a: Any, b: Any) -> bool:
    """Equality as alignment needs it: floats to 1e-9 relative (YAML `1.e-5` vs flag `1e-05`), sequences itemwise."""
    if isinstance(a, DataFile) and isinstance(b, DataFile):
        return a.same_as(b)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b if isinstance(a, bool) and isinstance(b, bool) else False
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-15)
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def jsonable(value: Any) -> Any:
    """A value for `--json`: DataFile as a mapping, MISSING as null."""
    if value is MISSING or value is UNDECLARED:
        return None
    if isinstance(value, DataFile):
        return {"path": value.path, "sha256": value.sha256, "bound": value.bound}
    if isinstance(value, tuple):
        return [jsonable(v) for v in value]
    return value
