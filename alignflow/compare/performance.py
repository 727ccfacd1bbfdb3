"""Speed of each side from its own log: ms/iter mean, P95, P99 after a warm-up window, samples/s, change.

Definitions (docs/seeds.md#performance-statistics): samples/s = global_batch_size * 1000 / mean(ms/iter); throughput
change = samples/s(test) / samples/s(reference) - 1. The first steps include compilation, allocator growth and data
loader start-up, so they are left out (seed 004 measured steps 101-200 of 200 and 11-40 of 40).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from alignflow.compare.statistics import finite_or_none

DEFAULT_WARMUP_STEPS = 10


@dataclass(frozen=True, slots=True)
class SidePerformance:
    """One side's step time after warm-up."""

    steps: int
    warmup_steps: int
    ms_per_iter_mean: float
    ms_per_iter_p95: float
    ms_per_iter_p99: float
    global_batch_size: float | None
    samples_per_s: float | None
    note: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "steps": self.steps, "warmup_steps": self.warmup_steps,
            "ms_per_iter_mean": finite_or_none(self.ms_per_iter_mean),
            "ms_per_iter_p95": finite_or_none(self.ms_per_iter_p95),
            "ms_per_iter_p99": finite_or_none(self.ms_per_iter_p99),
            "global_batch_size": finite_or_none(self.global_batch_size),
            "samples_per_s": finite_or_none(self.samples_per_s), "note": self.note,
        }


@dataclass(frozen=True, slots=True)
class Performance:
    """Both sides' speed and the relative change of test against reference."""

    test: SidePerformance | None
    reference: SidePerformance | None
    throughput_change: float | None  # samples/s test / reference - 1
    time_change: float | None  # mean ms/iter test / reference - 1

    def to_json(self) -> dict[str, object]:
        return {
            "test": self.test.to_json() if self.test else None,
            "reference": self.reference.to_json() if self.reference else None,
            "throughput_change": finite_or_none(self.throughput_change),
            "time_change": finite_or_none(self.time_change),
        }


def side_performance(frame: pd.DataFrame, warmup_steps: int = DEFAULT_WARMUP_STEPS) -> SidePerformance | None:
    """Step-time figures of one parsed log (None when it prints no step time)."""
    if "step_time_ms" not in frame.columns:
        return None
    times = frame["step_time_ms"].to_numpy(dtype=float, na_value=np.nan)
    note = ""
    if len(times) > warmup_steps:
        measured = times[warmup_steps:]
        skipped = warmup_steps
    else:
        measured, skipped = times, 0
        note = f"only {len(times)} step(s), not more than the {warmup_steps}-step warm-up: all steps measured"
    measured = measured[np.isfinite(measured)]
    if measured.size == 0:
        return None
    mean = float(measured.mean())
    gbs = _global_batch_size(frame)
    sps = gbs * 1000.0 / mean if gbs is not None and mean > 0 else None
    return SidePerformance(
        steps=int(measured.size), warmup_steps=skipped, ms_per_iter_mean=mean,
        ms_per_iter_p95=float(np.percentile(measured, 95)), ms_per_iter_p99=float(np.percentile(measured, 99)),
        global_batch_size=gbs, samples_per_s=sps, note=note,
    )


def _global_batch_size(frame: pd.DataFrame) -> float | None:
    """The printed global batch size, else the typical growth of consumed samples per step."""
    if "global_batch_size" in frame.columns:
        values = frame["global_batch_size"].dropna()
        if len(values):
            return float(values.median())
    if "consumed_samples" in frame.columns and len(frame) > 1:
        consumed = frame["consumed_samples"].astype(float)
        per_step = consumed.diff() / pd.Series(frame.index, index=frame.index, dtype=float).diff()
        per_step = per_step[np.isfinite(per_step) & (per_step > 0)]
        if len(per_step):
            return float(per_step.median())
    return None


def compare_performance(
    test: pd.DataFrame, reference: pd.DataFrame, warmup_steps: int = DEFAULT_WARMUP_STEPS
) -> Performance:
    """Both sides' figures and the change of test relative to reference."""
    t = side_performance(test, warmup_steps)
    r = side_performance(reference, warmup_steps)
    throughput = time = None
    if t and r:
        time = t.ms_per_iter_mean / r.ms_per_iter_mean - 1 if r.ms_per_iter_mean > 0 else None
        if t.samples_per_s and r.samples_per_s:
            throughput = t.samples_per_s / r.samples_per_s - 1
    if throughput is not None and not math.isfinite(throughput):
        throughput = None
    return Performance(t, r, throughput, time)


def speed_summary(performance: Performance, labels: tuple[str, str]) -> str:
    """Which side is faster and by how much, with units: `GPU is 2.70x faster than NPU (samples/s: ...)`.

    Samples/s when both logs give the batch size (the seeds' throughput), else mean ms/iter; '' without figures.
    """
    t, r = performance.test, performance.reference
    if t is None or r is None:
        missing = [name for name, side in zip(labels, (t, r), strict=True) if side is None]
        return f"no speed comparison: no step time in the {' and '.join(missing)} log" if missing else ""
    if t.samples_per_s and r.samples_per_s:
        a, b, unit, higher_is_faster = t.samples_per_s, r.samples_per_s, "samples/s", True
    else:
        a, b, unit, higher_is_faster = t.ms_per_iter_mean, r.ms_per_iter_mean, "ms/iter (mean)", False
    if not (a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b)):
        return ""
    figures = f"{unit}: {labels[0]} {a:.4g}, {labels[1]} {b:.4g}"
    if a == b:
        return f"{labels[0]} and {labels[1]} are equally fast ({figures})"
    test_faster = (a > b) == higher_is_faster
    ratio = max(a, b) / min(a, b)
    fast, slow = (labels[0], labels[1]) if test_faster else (labels[1], labels[0])
    return (f"{fast} is {ratio:.2f}x faster than {slow} ({figures}; after {t.warmup_steps}/{r.warmup_steps} "
            "warm-up steps)")
