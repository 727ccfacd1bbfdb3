"""What a framework parser returns for one step line, and the number tokens both frameworks print.

Kept apart from the parsers so that MindFormers and Megatron share one record type and one notion of a printed
number (with its resolution) without importing each other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from alignflow.logs.schema import Resolution

# The largest step number read (a frame index is int64; a longer number is a damaged line, not a step).
MAX_STEP = 2**62
# A printed number (fixed or scientific, nan/inf in any case), as both frameworks write them.
NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf|NaN|Inf|NAN|INF)"

# How a column's printed resolution is known: from the token's own digits, or fixed by how it is printed.
ResolutionRule = Literal["token", "float32"]
# The timestamp before a Megatron `iteration` anchor: `%H:%M:%S.%f` since megatron-core 0.16, `%H:%M:%S` before
# (and in Megatron-Bridge), none in some Bridge versions and in filtered logs; an RFC 3339 stamp
# (`2025-10-21T16:18:53+08:00`, a fork's or a log collector's) counts by its precision the same way.
Stamp = Literal["micro", "seconds", "none"]
# str() of a numpy float32 prints the shortest repr that round-trips: as precise as float32 itself (~7 digits).
FLOAT32 = Resolution("significant", 7)


@dataclass(slots=True)
class StepLine:
    """One parsed step line of either framework (transient: `StepRecords` keeps only its values dict).

    The lists are None until needed: a 100k-step parse should not allocate 200k empty lists.
    """

    step: int
    values: dict[str, float]
    variant: str
    max_steps: int | None = None
    resolutions: dict[str, Resolution] | None = None  # only on lines sampled for resolution
    not_last_stage: bool = False
    stamp: Stamp | None = None  # Megatron lines only
    non_finite: list[str] | None = None
    unreadable: list[str] | None = None
    # What a line held that was not read, and why (a field cut by the line's end, text glued after its last field).
    not_read: list[str] | None = None
    cut: bool = False  # the line ends inside a field: the next physical line may continue it (a wrapped line)
    glued: str | None = None  # text another process printed onto the line after its last field
    damaged: list[str] | None = None  # known numeric fields whose value is no number: a damaged line
    epoch: tuple[int, int, int] | None = None  # (epoch, step in epoch, steps per epoch) of an epoch-counting line

    def mark_non_finite(self, column: str) -> None:
        if self.non_finite is None:
            self.non_finite = []
        self.non_finite.append(column)

    def note_not_read(self, what: str) -> None:
        if self.not_read is None:
            self.not_read = []
        self.not_read.append(what)

    def mark_damaged(self, column: str, token: str) -> None:
        if self.damaged is None:
            self.damaged = []
        self.damaged.append(f"{column} (`{token.strip()[:40]}`)")

    def mark_unreadable(self, column: str) -> None:
        if self.unreadable is None:
            self.unreadable = []
        self.unreadable.append(column)

    def set_resolution(self, column: str, token: str) -> None:
        res = token_resolution(token)
        if res is not None:
            if self.resolutions is None:
                self.resolutions = {}
            self.resolutions[column] = res

    def check_finite(self) -> None:
        """Mark NaN/inf values; one C-level sum tells whether any is there."""
        values = self.values
        total = sum(values.values())
        if total - total != 0.0:
            for column, value in values.items():
                if value - value != 0.0:
                    self.mark_non_finite(column)


def token_resolution(token: str) -> Resolution | None:
    """The resolution a printed number shows: decimals for fixed notation, mantissa decimals for scientific."""
    t = token.strip()
    lower = t.lower()
    if "nan" in lower or "inf" in lower:
        return None
    e = lower.find("e")
    mantissa = t if e < 0 else t[:e]
    dot = mantissa.find(".")
    decimals = 0 if dot < 0 else len(mantissa) - dot - 1
    return Resolution("decimals" if e < 0 else "significant", decimals)


def snake(name: str) -> str:
    """A printed field name as a column name: `elapsed time per iteration (ms)` -> `elapsed_time_per_iteration_ms`."""
    return re.sub(r"[^0-9a-z]+", "_", name.strip().lower()).strip("_")
