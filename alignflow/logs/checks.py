"""Checks on a built frame that need the format's table: columns that look like a damaged known key.

A key broken by line wrapping or copy-paste (`g      rad norm`, `lm los`) parses as a new column and would be
silently left out of the comparison of the metric it should have been. Any column the format is not known to
print that resembles one it is known to print is reported, naming both; the value is not merged into the known
column (which of the two is right is for a person to say).
"""

from __future__ import annotations

from difflib import SequenceMatcher
from typing import TYPE_CHECKING

from alignflow.logs.schema import Sentinel

if TYPE_CHECKING:
    import pandas as pd

    from alignflow.logs.formats import LogFormatSpec

# Similarity (difflib ratio of the names without separators) above which an unknown column resembles a known one.
RESEMBLANCE = 0.85


def resembles(column: str, known: frozenset[str]) -> str | None:
    """The known column `column` most resembles (same letters, or a close spelling), or None."""
    squashed = column.replace("_", "")
    best, score = None, RESEMBLANCE
    for name in sorted(known):
        other = name.replace("_", "")
        if other == squashed:
            return name
        if 2 * min(len(squashed), len(other)) < score * (len(squashed) + len(other)):
            continue  # the lengths alone rule it out (and a 1 MB damaged key costs nothing)
        ratio = SequenceMatcher(None, squashed, other).ratio()
        if ratio >= score:
            best, score = name, ratio
    return best


def near_misses(frame: pd.DataFrame, line_numbers: pd.Series, spec: LogFormatSpec,
                rank: int | None) -> list[Sentinel]:
    """A warning for each column of `frame` the format does not know that resembles one it knows."""
    out = []
    for column in frame.columns:
        if column in spec.known_columns or (spec.known_pattern is not None and spec.known_pattern.match(column)):
            continue
        like = resembles(column, spec.known_columns)
        if like is None:
            continue
        present = frame[column].notna().to_numpy()
        line = int(line_numbers.to_numpy()[present.argmax()]) if present.any() else int(line_numbers.iloc[0])
        out.append(Sentinel(line, "", "unknown_field", False,
                            f"field `{column}` is not one {spec.title} prints but resembles `{like}` (a damaged or "
                            f"wrapped key?): kept apart, not compared as {like}", rank))
    return out
