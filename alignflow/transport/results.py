"""What the transport's operations return: a finished command, a path's stat, a copy's progress callback.

Our own values, never a fabric/invoke/subprocess result, so that nothing above the transport depends on how the
host was reached.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from alignflow.errors import RemoteCommandError

ProgressFn = Callable[[int, int], None]
"""Progress of a transfer: `(bytes_done, bytes_total)`; called from the thread that runs the transfer."""


@dataclass(frozen=True, slots=True)
class Completed:
    """A finished command: our own value, never a fabric/invoke/subprocess result."""

    host: str
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def check(self) -> Completed:
        """Return self, or raise `RemoteCommandError` (exit code and stderr tail) when the command failed."""
        if self.exit_code != 0:
            raise RemoteCommandError(self)
        return self


@dataclass(frozen=True, slots=True)
class PathStat:
    """What `Transport.stat` tells about a path (symlinks followed)."""

    path: str
    kind: Literal["file", "dir", "other"]
    size_bytes: int
    mtime_ns: int
    mode: int
