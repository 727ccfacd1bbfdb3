"""Speed of each side from its own log: ms/iter mean, P95, P99 after a warm-up window, samples/s, change.

Definitions (docs/seeds.md#performance-statistics): samples/s = global_batch_size * 1000 / mean(ms/iter); throughput
change = samples/s(test) / samples/s(reference) - 1. The first steps include compilation, allocator growth and data
loader start-up, so they are left out (seed 004 measured steps 101-200 of 200 and 11-40 of 40).

A speed ratio means something only between timings taken alike (the seeds compare OFF/ON pairs "only inside one
experiment group; timing, memory, load probes run separately"). So a report states each side's conditions
(`TimingConditions`: the device, the machine, the run that measured it — a cached training's log was timed in an
earlier run —, the steps that ran beside it on its machine, the load when its run started) and gives no ratio
between unlike ones (`unlike_conditions`), saying why (issue 40: "NPU is 14.79x faster" from a cached log against
one trained under load).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from alignflow.compare.context import SHARED_TOLERANCE, TimingConditions
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


def unlike_conditions(a: TimingConditions, b: TimingConditions, labels: tuple[str, str]) -> list[str]:
    """Why timings taken under `a` and `b` give no ratio ([] when alike). The device is not one of the reasons:
    it is what an NPU-against-GPU comparison compares; it is stated with every figure instead."""
    why = []
    if a.measured_in != b.measured_in:
        timed = [f"{label} in run {c.measured_in}" + (" (cached)" if c.cached else "")
                 for label, c in zip(labels, (a, b), strict=True)]
        why.append(f"timed in different runs ({', '.join(timed)})")
    share_a = a.shared if a.shared is not None else float(bool(a.beside))
    share_b = b.shared if b.shared is not None else float(bool(b.beside))
    if abs(share_a - share_b) > SHARED_TOLERANCE:
        why.append("they shared their machines for different parts of their time ("
                   + ", ".join(f"{label} {share * 100:.0f}%" + (f" beside {', '.join(c.beside)}" if c.beside else "")
                               for label, c, share in zip(labels, (a, b), (share_a, share_b), strict=True)) + ")")
    if a.loaded is not None and b.loaded is not None and a.loaded != b.loaded:
        busy, idle = (labels[0], labels[1]) if a.loaded else (labels[1], labels[0])
        why.append(f"{busy}'s host was loaded when its run started, {idle}'s was not")
    return why


def speed_summary(performance: Performance, labels: tuple[str, str],
                  conditions: Mapping[str, TimingConditions] | None = None) -> str:
    """Which side is faster and by how much, with units: `GPU is 2.70x faster than NPU (samples/s: ...)`.

    Samples/s when both logs give the batch size (the seeds' throughput), else mean ms/iter; '' without figures.
    `conditions` (label -> how that side was timed): no ratio between unlike ones (`unlike_conditions`).
    """
    t, r = performance.test, performance.reference
    if t is None or r is None:
        missing = [name for name, side in zip(labels, (t, r), strict=True) if side is None]
        return f"no speed comparison: no step time in the {' and '.join(missing)} log" if missing else ""
    conditions = conditions or {}
    caveat = "; how each side was timed is not recorded: a ratio holds only between timings taken alike"
    if labels[0] in conditions and labels[1] in conditions:
        ca, cb = conditions[labels[0]], conditions[labels[1]]
        why = unlike_conditions(ca, cb, labels)
        if why:
            return f"no speed ratio: the two sides were not timed alike: {'; '.join(why)}"
        shared = [w for w, both in (("shared their machines", ca.beside and cb.beside),
                                    ("ran on loaded hosts", ca.loaded and cb.loaded)) if both]
        caveat = f"; timed alike, but both {' and '.join(shared)}" if shared else "; timed alike"
    if t.samples_per_s and r.samples_per_s:
        a, b, unit, higher_is_faster = t.samples_per_s, r.samples_per_s, "samples/s", True
    else:
        a, b, unit, higher_is_faster = t.ms_per_iter_mean, r.ms_per_iter_mean, "ms/iter (mean)", False
    if not (a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b)):
        return ""
    figures = f"{unit}: {labels[0]} {a:.4g}, {labels[1]} {b:.4g}"
    if a == b:
        return f"{labels[0]} and {labels[1]} are equally fast ({figures}{caveat})"
    test_faster = (a > b) == higher_is_faster
    ratio = max(a, b) / min(a, b)
    fast, slow = (labels[0], labels[1]) if test_faster else (labels[1], labels[0])
    return (f"{fast} is {ratio:.2f}x faster than {slow} ({figures}; after {t.warmup_steps}/{r.warmup_steps} "
            f"warm-up steps{caveat})")
