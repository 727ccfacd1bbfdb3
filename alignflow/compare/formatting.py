"""How report numbers are written: one notation everywhere (CLI, HTML, markdown, JSON `*_text` fields), and
never with more digits than the logs resolve.

- Relative statistics (`step_rel`, `mean_rel`, `max_rel`) and their thresholds are percentages, fixed-point:
  `0.5%`, `0.00054%` (scientific only below 0.000001%, and then with no digit below the resolution: `2e-14%`).
- Absolute values are fixed-point down to 0.001 and scientific below it: `0.0123`, `-2.48e-05`. A value whose
  shown digits would all be zero is written in scientific notation too, so `-0.0000` never appears; zero is `0`.
- Digits follow the printed resolution: a per-step statistic (max error, one step's relative error) is shown to
  the last digit the coarser log prints; an average over n steps (ME, mean |e|, mean relative error) gets one
  digit more, since averaging n rounding errors of at most half a unit shrinks their spread by ~sqrt(n).
  Without a known resolution, 4 significant digits. JSON keeps the full float beside the text, for machines.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from alignflow.config.criteria import Criterion

SCIENTIFIC_BELOW = 1e-3  # |value| below this is written as d.dde-XX
MAX_DECIMALS = 6
MAX_MANTISSA = 3


def decimals_for(quantum: float | None) -> int | None:
    """Decimals that show one unit of `quantum` (1e-3 -> 3); None when unknown."""
    if quantum is None or not math.isfinite(quantum) or quantum <= 0:
        return None
    return max(0, -math.floor(math.log10(quantum) + 1e-9))


def fmt_stat(value: float | None, statistic: str, quantum: float | None, magnitude: float | None = None) -> str:
    """A statistic for display: absolute ones in the metric's unit, relative ones in percent."""
    if value is None or not math.isfinite(value):
        return "n/a"
    from alignflow.config.statistics import STATISTICS, is_averaged, is_relative  # here: the CLI's fmt_duration
    # loads no pydantic (alignflow.config's package imports its models)

    extra = 1 if is_averaged(statistic) else 0
    if is_relative(statistic):
        rel_q = quantum / magnitude * 100 if quantum and magnitude and magnitude > 0 else None
        return fmt_percent_of(value, rel_q, extra=extra)
    stat = STATISTICS.get(statistic)
    return fmt_value(value, quantum, extra=extra, signed=stat is not None and stat.signed)


def fmt_percent_of(fraction: float, quantum_percent: float | None = None, *, extra: int = 0) -> str:
    """A relative value (a fraction) in percent, fixed-point to its resolution: `0.00054%`, `1.23%`, `0%`."""
    if not math.isfinite(fraction):
        return "n/a"
    pct = abs(fraction) * 100
    if pct == 0:
        return "0%"
    d = decimals_for(quantum_percent)
    decimals = d + extra if d is not None else max(0, 2 - math.floor(math.log10(pct)))
    if decimals > MAX_DECIMALS or pct < 10.0 ** -MAX_DECIMALS:
        # as `fmt_value`: the digits down to the resolution, none below it (a 2e-14% error of a metric printed to
        # 1e-4% is float noise: `2e-14%`, not `2.20e-14%`)
        mantissa = MAX_MANTISSA - 1 if d is None or quantum_percent is None else _mantissa(pct, quantum_percent, extra)
        return f"{pct:.{min(mantissa, MAX_MANTISSA - 1)}e}%"
    return f"{pct:.{decimals}f}%"


def fmt_value(value: float | None, quantum: float | None = None, *, extra: int = 0, signed: bool = False) -> str:
    """One number in the report's notation (see the module docstring); `quantum` = one printed unit, if known."""
    if value is None or not math.isfinite(value):
        return "n/a"
    if value == 0:
        return "0"
    sign = "+" if signed else ""
    size = abs(value)
    d = decimals_for(quantum)
    decimals = min(d + extra, MAX_DECIMALS) if d is not None else max(0, 3 - math.floor(math.log10(size)))
    if size >= SCIENTIFIC_BELOW and decimals <= MAX_DECIMALS:
        text = f"{value:{sign}.{min(decimals, MAX_DECIMALS)}f}"
        if any(c in "123456789" for c in text):
            return text
    mantissa = MAX_MANTISSA - 1 if d is None or quantum is None else _mantissa(size, quantum, extra)
    return f"{value:{sign}.{min(mantissa, MAX_MANTISSA)}e}"


def _mantissa(size: float, quantum: float, extra: int) -> int:
    """Digits after the point of `size` in scientific notation down to one unit of `quantum` (plus `extra`)."""
    return max(0, math.floor(math.log10(size)) - math.floor(math.log10(quantum) + 1e-9) + extra)


def fmt_threshold(criterion: Criterion) -> str:
    """A criterion's threshold in the unit its value is shown in (percent for relative statistics)."""
    from alignflow.config.statistics import is_relative

    if is_relative(criterion.statistic):
        return f"{criterion.threshold * 100:g}%"
    return f"{criterion.threshold:g}"


def criterion_label(criterion: Criterion) -> str:
    """`|me(lm_loss)| < 0.001`, `step_rel(lm_loss, step 1) < 0.5%`: the criterion with its threshold's unit."""
    head = criterion.label.rsplit(" ", 1)[0]  # "... <" without the raw threshold
    return f"{head} {fmt_threshold(criterion)}"


def fmt_number(value: float | None, digits: int = 4) -> str:
    """A plain figure (speed, perplexity) with `digits` significant digits; never `-0`."""
    if value is None or not math.isfinite(value):
        return "n/a"
    text = f"{value:.{digits}g}"
    return text.lstrip("-") if float(text) == 0 else text


def fmt_percent(value: float | None, digits: int = 3) -> str:
    """A signed relative change in percent (`+170%`, `-3.2%`)."""
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value * 100:+.{digits}g}%"


def fmt_duration(seconds: float | None) -> str:
    """`0.4 s`, `12.3 s`, `4 min 05 s`, `2 h 03 min`."""
    if seconds is None or not math.isfinite(seconds):
        return ""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


def fmt_size(n: int | None) -> str:
    """Bytes in binary units (`512 B`, `1.5 MiB`)."""
    if n is None:
        return ""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


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
