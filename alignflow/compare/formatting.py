"""How report numbers are written: never with more digits than the logs resolve.

A per-step statistic (max error, one step's relative error) is shown to the last digit the coarser log prints;
an average over n steps (ME, mean |e|, mean relative error) gets one digit more, since averaging n rounding
errors of at most half a unit shrinks their spread by ~sqrt(n). Without a known resolution, 4 significant
digits. JSON keeps the full float plus the resolution, for machines.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from alignflow.compare.criteria import RELATIVE_STATISTICS

AVERAGES = frozenset({"me", "mean_abs", "mean_rel"})


def decimals_for(quantum: float | None) -> int | None:
    """Decimals that show one unit of `quantum` (1e-3 -> 3); None when unknown."""
    if quantum is None or not math.isfinite(quantum) or quantum <= 0:
        return None
    return max(0, -math.floor(math.log10(quantum) + 1e-9))


def fmt_stat(value: float | None, statistic: str, quantum: float | None, magnitude: float | None = None) -> str:
    """A statistic for display: absolute ones in the metric's unit, relative ones in percent."""
    if value is None or not math.isfinite(value):
        return "n/a"
    extra = 1 if statistic in AVERAGES else 0
    signed = statistic in ("me", "max_error", "min_error")
    if statistic in RELATIVE_STATISTICS:
        rel_q = quantum / magnitude if quantum and magnitude and magnitude > 0 else None
        return _fixed(value * 100, rel_q * 100 if rel_q else None, extra, signed=False) + "%"
    return _fixed(value, quantum, extra, signed=signed)


def _fixed(value: float, quantum: float | None, extra: int, *, signed: bool) -> str:
    """`value` to the digit of `quantum` (+`extra`); scientific notation when that digit is far right of the point."""
    sign = "+" if signed else ""
    d = decimals_for(quantum)
    if d is None:
        return f"{value:{sign}.4g}"
    if d + extra <= 6:
        return f"{value:{sign}.{d + extra}f}"
    assert quantum is not None
    if value == 0:
        return "0"
    digits = math.floor(math.log10(abs(value))) - math.floor(math.log10(quantum) + 1e-9) + extra
    return f"{value:{sign}.{min(max(digits, 0), 10)}e}"


def fmt_number(value: float | None, digits: int = 4) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.{digits}g}"


def fmt_percent(value: float | None, digits: int = 3) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value * 100:+.{digits}g}%"


def step_ranges(steps: Sequence[int] | Iterable[int], limit: int = 20) -> str:
    """`[1, 2, 3, 7, 9, 10]` -> `1-3, 7, 9-10` (at most `limit` ranges, then how many steps remain)."""
    ordered = sorted(steps)
    if not ordered:
        return "none"
    ranges: list[tuple[int, int]] = []
    start = prev = ordered[0]
    for s in ordered[1:]:
        if s == prev + 1:
            prev = s
            continue
        ranges.append((start, prev))
        start = prev = s
    ranges.append((start, prev))
    shown = [f"{a}" if a == b else f"{a}-{b}" for a, b in ranges[:limit]]
    if len(ranges) > limit:
        rest = sum(b - a + 1 for a, b in ranges[limit:])
        shown.append(f"... ({rest} more step(s))")
    return ", ".join(shown)
