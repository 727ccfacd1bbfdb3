"""`compare(test, reference, criteria) -> Comparison`: align two parsed logs by step, compute the seeds'
statistics per metric, evaluate the criteria, and decide the verdict.

Pure: two `ParsedLog` values in, one `Comparison` out; the report module does the file I/O. A failed alignment
is a verdict (`"fail"` with its reasons), never an exception. The verdict passes only when every criterion
passes and neither log has a fatal sentinel (issue 6): a run whose checkpoint silently did not load is not
"aligned" however close its curves are.

Metrics compared are the canonical columns present in both logs (both parsers map the frameworks' names:
`loss`/`lm loss` -> `lm_loss`, `mtp_k_loss`/`mtp_k loss` -> `mtp_k_loss`, `grad_norm`/`grad norm` -> `grad_norm`,
`lr`/`learning rate` -> `lr`). A metric on one side only is reported, not compared; steps on one side only are
listed; a criterion that cannot be evaluated fails with a note saying why.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

from alignflow.compare.divergence import Band, Divergence, Driver, criterion_first_outside, curve_level, drivers
from alignflow.compare.evaluable import gaps_within, step_rel_steps, zero_reference
from alignflow.compare.formatting import criterion_label, fmt_stat, fmt_threshold
from alignflow.compare.memory import MEMORY_METRICS, MemoryComparison, compare_memory
from alignflow.compare.performance import DEFAULT_WARMUP_STEPS, Performance, compare_performance
from alignflow.compare.statistics import (
    REL_EPS,
    ErrorStats,
    Pairs,
    Perplexity,
    best_shift,
    error_statistics,
    finite_or_none,
    paired,
    perplexity,
    relative_error,
    values_at,
)
from alignflow.config.criteria import Criterion
from alignflow.config.statistics import STATISTICS, is_relative
from alignflow.logs.memory import MemoryRecord
from alignflow.logs.schema import BOOKKEEPING_COLUMNS, ParsedLog, Resolution, Sentinel, column_order, is_cross_entropy

Verdict = Literal["pass", "fail"]
# The fewest steps both logs must share (or all of the shorter log's, when it has fewer) for a verdict to pass.
DEFAULT_MIN_OVERLAP = 10
# Metrics whose printed value may lag or lead by a step (MindFormers prints the next step's lr).
SHIFTABLE = frozenset({"lr"})
# Below this share of an average, its largest terms do not "drive" it: the error is spread over the run.
SPREAD_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class CriterionResult:
    """One criterion evaluated: the statistic's value (signed), pass/fail and why."""

    criterion: Criterion
    value: float
    passed: bool
    note: str = ""
    below_resolution: bool = False
    value_text: str = ""  # the value in the report's notation (formatting.fmt_stat), the same in every view
    drivers: tuple[Driver, ...] = ()  # failed criteria: the steps that contribute most to the value
    first_outside: int | None = None  # the first judged step whose error leaves this criterion's band
    evaluated: bool = True  # False: the logs cannot answer it (step 1 printed by neither, a zero reference)
    steps_used: tuple[int, ...] = ()  # the steps a step_rel criterion was evaluated at

    @property
    def status(self) -> Literal["pass", "fail", "not evaluated"]:
        return "not evaluated" if not self.evaluated else "pass" if self.passed else "fail"

    @property
    def metric(self) -> str:
        return self.criterion.metric

    @property
    def statistic(self) -> str:
        return self.criterion.statistic

    @property
    def threshold(self) -> float:
        return self.criterion.threshold

    def to_json(self) -> dict[str, Any]:
        c = self.criterion
        return {
            "metric": c.metric, "statistic": c.statistic, "value": finite_or_none(self.value),
            "threshold": c.threshold, "passed": self.passed, "label": criterion_label(c), "note": self.note,
            "absolute": c.absolute, "inclusive": c.inclusive,
            "steps": list(self.steps_used) if self.steps_used else c.steps, "exclude_steps": c.exclude_steps,
            "source": c.source, "below_resolution": self.below_resolution, "evaluated": self.evaluated,
            "status": self.status,
            "value_text": self.value_text or fmt_stat(self.value, c.statistic, None),
            "threshold_text": fmt_threshold(c), "unit": "%" if is_relative(c.statistic) else c.metric,
            "drivers": [d.to_json() for d in self.drivers], "first_outside": self.first_outside,
        }

    def driver_text(self) -> str:
        """`driven by steps 57, 58, 60 (41% of the value); first outside its band at step 41`, or ''."""
        parts = []
        if self.drivers:
            steps = ", ".join(str(d.step) for d in self.drivers)
            share = sum(d.contribution for d in self.drivers) / self.value if self.value else math.nan
            averaged = STATISTICS[self.statistic].reduce == "mean"
            plural = "s" if len(self.drivers) > 1 else ""
            if averaged and math.isfinite(share) and share < SPREAD_SHARE:
                parts.append(f"spread over the run: the largest terms, step{plural} {steps}, make "
                             f"{share * 100:.0f}% of the value")
            else:
                parts.append(f"driven by step{plural} {steps}"
                             + (f" ({share * 100:.0f}% of the value)" if averaged and math.isfinite(share) else ""))
        if self.first_outside is not None:
            parts.append(f"first outside its band at step {self.first_outside}")
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class MetricComparison:
    """The statistics of one metric over every step both logs have (no exclusions)."""

    metric: str
    stats: ErrorStats
    at_steps: dict[str, dict[int, float]]  # statistics at chosen steps (step_rel): their value at each
    not_compared: int  # steps in both logs where either value is missing or not finite
    shift: int  # reference step paired with test step s is s + shift (lr tolerance)
    resolution: float | None  # one unit of the coarser side's last printed digit, at the reference's magnitude
    resolution_text: str
    perplexity: Perplexity | None
    magnitude: float | None = None  # median |reference| over the compared steps
    divergence: Divergence | None = None  # the first step where the error leaves its band (curve level)
    band: Band | None = None  # the band itself, per compared step: what the figures shade (one source with the text)

    def to_json(self) -> dict[str, Any]:
        s = self.stats
        out: dict[str, Any] = {stat.name: finite_or_none(s.get(stat.name)) for stat in STATISTICS.values()
                               if stat.reduce != "at_steps"}
        out |= {name: {str(k): finite_or_none(v) for k, v in at.items()} for name, at in self.at_steps.items()}
        out |= {"n": s.n, "not_compared": self.not_compared}
        out |= {f"{stat.name}_step": s.step_of(stat.name) for stat in STATISTICS.values() if stat.shows_step}
        out |= {
            "shift": self.shift, "resolution": finite_or_none(self.resolution),
            "resolution_text": self.resolution_text, "magnitude": finite_or_none(self.magnitude),
            "divergence": self.divergence.to_json() if self.divergence else None,
        }
        if self.perplexity is not None:
            out["perplexity"] = self.perplexity.to_json()
        return out


@dataclass(frozen=True, slots=True)
class StepCoverage:
    """Which steps both logs have, and which only one has (never silently dropped)."""

    compared: int
    only_test: tuple[int, ...]
    only_reference: tuple[int, ...]
    first: int | None
    last: int | None
    excluded: tuple[int, ...] = ()  # common steps a sentinel took out of the statistics (skipped steps)
    gaps: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)  # per side, inside first..last
    min_overlap: int = 0  # the fewest compared steps the verdict accepts

    def to_json(self) -> dict[str, Any]:
        return {"compared": self.compared, "only_test": list(self.only_test),
                "only_reference": list(self.only_reference), "first": self.first, "last": self.last,
                "excluded": list(self.excluded), "gaps": {k: [list(g) for g in v] for k, v in self.gaps.items()},
                "min_overlap": self.min_overlap}


@dataclass(frozen=True, slots=True, eq=False)
class Comparison:
    """The outcome of comparing a test log with a reference log."""

    verdict: Verdict
    criteria: tuple[CriterionResult, ...]
    metrics: dict[str, MetricComparison]
    steps: StepCoverage
    performance: Performance
    aligned: pd.DataFrame
    test: ParsedLog
    reference: ParsedLog
    reasons: tuple[str, ...] = field(default=())
    require: tuple[str, ...] = ()  # what both runs had to show (`checkpoint_loaded`)
    memory: MemoryComparison = field(default_factory=lambda: MemoryComparison(None, None))  # per rank, both sides

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def sentinels(self) -> dict[str, tuple[Sentinel, ...]]:
        return {"test": self.test.sentinels, "reference": self.reference.sentinels}

    @property
    def metrics_only_test(self) -> tuple[str, ...]:
        return _only_in(self.test, self.reference)

    @property
    def metrics_only_reference(self) -> tuple[str, ...]:
        return _only_in(self.reference, self.test)

    def to_json(self) -> dict[str, Any]:
        """The `alignflow compare --json` document (issue 6 shape, plus performance, inputs and reasons)."""
        return {
            "verdict": self.verdict,
            "criteria": [c.to_json() for c in self.criteria],
            "metrics": {m: mc.to_json() for m, mc in self.metrics.items()},
            "steps": self.steps.to_json(),
            "sentinels": {side: [s.to_json() for s in found] for side, found in self.sentinels.items()},
            "performance": self.performance.to_json(),
            "metrics_only_test": list(self.metrics_only_test),
            "metrics_only_reference": list(self.metrics_only_reference),
            "reasons": list(self.reasons),
            "require": list(self.require),
            "memory": self.memory.to_json(),
            "inputs": {"test": _input_json(self.test), "reference": _input_json(self.reference)},
        }


def _input_json(parsed: ParsedLog) -> dict[str, Any]:
    return {
        "source": parsed.source, "format": parsed.fmt, "variant": parsed.variant, "rank": parsed.rank,
        "steps": len(parsed.frame), "max_steps": parsed.max_steps, "repeated_steps": list(parsed.repeated_steps),
        "restarts": [{"line": r.line_no, "from_step": r.from_step, "to_step": r.to_step} for r in parsed.restarts],
        "resolution": {c: r.to_json() for c, r in parsed.resolution.items()},
        "first_interval": parsed.first_interval.to_json() if parsed.first_interval else None,
    }


def comparable_metrics(parsed: ParsedLog) -> list[str]:
    """Columns that are numerics of the training (not bookkeeping or speed)."""
    return [c for c in parsed.frame.columns if c not in BOOKKEEPING_COLUMNS]


def compare(
    test: ParsedLog, reference: ParsedLog, criteria: Sequence[Criterion], *, lr_step_tolerance: int = 1,
    perf_warmup_steps: int = DEFAULT_WARMUP_STEPS, noise_floor: Mapping[str, float] | None = None,
    require: Collection[str] = (), min_overlap: int | None = None,
    memory: tuple[Sequence[MemoryRecord], Sequence[MemoryRecord]] = ((), ()),
) -> Comparison:
    """Compare `test` against `reference` (error = test - reference) and judge it by `criteria`.

    `noise_floor` (metric -> absolute per-step self-noise of the reference side) widens each metric's band
    (alignflow.compare.divergence); without it the band is the criteria's thresholds and the printed resolution.
    `require` is what both runs must show (`"checkpoint_loaded"`: a loaded checkpoint; see `check_sentinels`).
    `min_overlap` is the fewest steps both logs must have in common for any verdict but FAIL (default: 10, or
    every step of the shorter log when it has fewer). Steps a sentinel excludes (a skipped step) are not compared.
    `memory`: the memory reports of the test and the reference log (`alignflow.logs.memory.memory_lines`), judged
    by criteria on `memory_max_rank` / `memory_avg_rank` (`alignflow.compare.memory`).
    """
    if lr_step_tolerance < 0 or perf_warmup_steps < 0:
        raise ValueError("lr_step_tolerance and perf_warmup_steps must be >= 0")
    if min_overlap is not None and min_overlap < 1:
        raise ValueError("min_overlap must be >= 1")
    tf, rf = test.frame, reference.frame
    t_metrics, r_metrics = comparable_metrics(test), comparable_metrics(reference)
    both = column_order([m for m in t_metrics if m in r_metrics])
    excluded = sorted({*test.excluded_steps, *reference.excluded_steps})
    coverage, judged = _coverage(test, reference, excluded, min_overlap)
    pairs: dict[str, Pairs] = {}
    metrics: dict[str, MetricComparison] = {}
    for m in both:
        pairs[m], metrics[m] = _metric(m, test, reference, excluded, judged, lr_step_tolerance, criteria)
    mem = compare_memory(*memory)
    results = tuple(_evaluate_memory(c, mem) if c.metric in MEMORY_METRICS else
                    _evaluate(c, pairs, metrics, test, reference, t_metrics, r_metrics) for c in criteria)
    resolutions = {m: (test.resolution.get(m), reference.resolution.get(m)) for m in both}
    found = curve_level(pairs, criteria, resolutions, noise_floor)
    metrics = {m: dataclasses.replace(mc, band=found[m][0], divergence=found[m][1]) for m, mc in metrics.items()}
    results = tuple(_with_curve_level(r, pairs, metrics, resolutions, noise_floor) for r in results)
    reasons = _reasons(results, {"test": test, "reference": reference}, coverage, criteria, tuple(require))
    return Comparison(
        verdict="fail" if reasons else "pass", criteria=results, metrics=metrics, steps=coverage,
        performance=compare_performance(tf, rf, perf_warmup_steps),
        aligned=_aligned(tf, rf, both, metrics, _only_in(test, reference), _only_in(reference, test)), test=test,
        reference=reference, reasons=tuple(reasons), require=tuple(require), memory=mem,
    )


def _coverage(test: ParsedLog, reference: ParsedLog, excluded: Sequence[int],
              min_overlap: int | None) -> tuple[StepCoverage, pd.Index]:
    """Which steps both logs have, and the common steps the statistics judge (those no sentinel excluded)."""
    tf, rf = test.frame, reference.frame
    skipped = pd.Index(excluded, dtype=tf.index.dtype)
    common = tf.index.intersection(rf.index)
    excluded_common = tuple(int(s) for s in common.intersection(pd.Index(excluded, dtype=common.dtype)))
    first, last = (int(common.min()), int(common.max())) if len(common) else (None, None)
    coverage = StepCoverage(
        compared=len(common) - len(excluded_common), only_test=tuple(int(s) for s in tf.index.difference(rf.index)),
        only_reference=tuple(int(s) for s in rf.index.difference(tf.index)), first=first, last=last,
        excluded=excluded_common, gaps=gaps_within({"test": test, "reference": reference}, first, last),
        min_overlap=min_overlap if min_overlap is not None else min(
            DEFAULT_MIN_OVERLAP, len(tf.index.difference(skipped)), len(rf.index.difference(skipped))),
    )
    return coverage, common.difference(pd.Index(excluded_common, dtype=common.dtype))


def _metric(m: str, test: ParsedLog, reference: ParsedLog, excluded: Sequence[int], judged: pd.Index,
            lr_step_tolerance: int, criteria: Sequence[Criterion]) -> tuple[Pairs, MetricComparison]:
    """One metric's pairs (the learning rate's shifted when that pairs it better) and statistics."""
    tf, rf = test.frame, reference.frame
    t_steps, r_steps = tf.index.to_numpy(dtype=np.int64), rf.index.to_numpy(dtype=np.int64)
    tv = tf[m].to_numpy(dtype=float, na_value=np.nan)
    rv = rf[m].to_numpy(dtype=float, na_value=np.nan)
    if m in SHIFTABLE and lr_step_tolerance > 0:
        shift, pairs = best_shift(t_steps, tv, r_steps, rv, lr_step_tolerance)
    else:
        shift, pairs = 0, paired(t_steps, tv, r_steps, rv)
    pairs = pairs.without(excluded)
    on_common = np.isfinite(tf[m].reindex(judged).to_numpy(dtype=float, na_value=np.nan)) & np.isfinite(
        rf[m].reindex(judged).to_numpy(dtype=float, na_value=np.nan))
    quantum, text, magnitude = _resolution(test.resolution.get(m), reference.resolution.get(m), pairs)
    text += "".join(f"; {x}" for x in _deaveraged(m, test, reference))
    return pairs, MetricComparison(
        metric=m, stats=error_statistics(pairs), at_steps=_at_steps(m, pairs, criteria),
        not_compared=int((~on_common).sum()), shift=shift, resolution=quantum, resolution_text=text,
        perplexity=perplexity(pairs) if is_cross_entropy(m) else None, magnitude=magnitude,
    )


def _only_in(parsed: ParsedLog, other: ParsedLog) -> tuple[str, ...]:
    """The comparable metrics of `parsed` that `other` does not log, in canonical order."""
    theirs = set(comparable_metrics(other))
    return tuple(column_order([m for m in comparable_metrics(parsed) if m not in theirs]))


def _deaveraged(metric: str, test: ParsedLog, reference: ParsedLog, steps: Sequence[int] | None = None) -> list[str]:
    """Which cells of `metric` were de-averaged (Megatron's first interval) and how much coarser they are."""
    out = []
    for side, parsed in (("test", test), ("reference", reference)):
        cells = parsed.first_interval.corrected_cells(metric) if parsed.first_interval else {}
        if steps is not None:
            cells = {s: f for s, f in cells.items() if s in steps}
        if cells:
            out.append(f"{side} step {', '.join(map(str, cells))} de-averaged from Megatron's first interval "
                       f"(rounding error up to {max(cells.values()):.3g}x the printed one)")
    return out


def _resolution(
    t: Resolution | None, r: Resolution | None, pairs: Pairs
) -> tuple[float | None, str, float | None]:
    """The coarser side's printed quantum at the reference's typical magnitude, how each side prints, that magnitude."""
    text = f"test: {t.describe() if t else 'unknown'}, reference: {r.describe() if r else 'unknown'}"
    if not len(pairs.reference):
        return None, text, None
    magnitude = float(np.median(np.abs(pairs.reference)))
    quanta = [res.quantum(magnitude) for res in (t, r) if res is not None]
    return (max(quanta) if quanta else None), text, magnitude


def _at_steps(metric: str, pairs: Pairs, criteria: Sequence[Criterion]) -> dict[str, dict[int, float]]:
    """Each statistic at chosen steps, at the steps the metric's criteria choose and the first compared step."""
    first = {int(pairs.steps[0])} if len(pairs.steps) else set()
    return {stat.name: values_at(pairs, stat, sorted(first | {s for c in criteria if c.metric == metric
                                                               and c.statistic == stat.name for s in c.steps or []}))
            for stat in STATISTICS.values() if stat.reduce == "at_steps"}


def _evaluate(
    c: Criterion, pairs: dict[str, Pairs], metrics: dict[str, MetricComparison], test: ParsedLog,
    reference: ParsedLog, t_metrics: list[str], r_metrics: list[str],
) -> CriterionResult:
    if c.metric not in pairs:
        missing = [side for side, cols in (("test", t_metrics), ("reference", r_metrics)) if c.metric not in cols]
        have = ", ".join(column_order(sorted(set(t_metrics) & set(r_metrics)))) or "none"
        return CriterionResult(c, math.nan, False, f"{c.metric} is not in the {' and '.join(missing)} log "
                               f"(metrics in both: {have})")
    p = pairs[c.metric].without(c.exclude_steps)
    notes: list[str] = []
    used: tuple[int, ...] = ()
    if c.at_steps:
        steps, notes, skip = step_rel_steps(c, p, test, reference)
        if skip:
            return CriterionResult(c, math.nan, False, "; ".join(notes), evaluated=False)
        rels = values_at(p, STATISTICS[c.statistic], steps)
        absent = [s for s, v in rels.items() if math.isnan(v)]
        value = math.nan if absent else max(rels.values())
        used = tuple(steps)
        if absent:
            notes.append(f"step {', '.join(map(str, absent))} not compared (missing on a side or excluded)")
        ref_at = [abs(pair[1]) for s in steps if (pair := p.at(s)) is not None]
        magnitude = min(ref_at) if ref_at else math.nan
        notes += _deaveraged(c.metric, test, reference, steps)
    else:
        if c.exclude_steps:  # statistics over fewer steps than the metric's own
            stats = error_statistics(p)
            magnitude = float(np.median(np.abs(p.reference))) if len(p.reference) else math.nan
        else:
            stats = metrics[c.metric].stats
            known = metrics[c.metric].magnitude
            magnitude = known if known is not None else math.nan
        value = stats.get(c.statistic)
        if stats.n == 0:
            notes.append("no step has the metric on both sides")
    zero = zero_reference(c, test.resolution.get(c.metric), reference.resolution.get(c.metric), magnitude)
    if zero:
        return CriterionResult(c, value, False, "; ".join([*notes, zero]), evaluated=False, steps_used=used)
    check = abs(value) if c.absolute else value
    passed = math.isfinite(check) and (check <= c.threshold if c.inclusive else check < c.threshold)
    below = _below_resolution(c, test.resolution.get(c.metric), reference.resolution.get(c.metric), magnitude)
    if below:
        notes.append(below)
    return CriterionResult(c, value, passed, "; ".join(notes), bool(below), steps_used=used)


def _evaluate_memory(c: Criterion, mem: MemoryComparison) -> CriterionResult:
    """A criterion on `memory_max_rank` / `memory_avg_rank` (`alignflow.compare.memory.MEMORY_METRICS`)."""
    if c.exclude_steps or c.steps:
        return CriterionResult(c, math.nan, False, f"{c.metric} is one figure per run: steps do not apply")
    why = mem.why_not()
    if why:
        return CriterionResult(c, math.nan, False, f"{c.metric}: {why}")
    relative = is_relative(c.statistic)
    value = mem.value(c.metric, relative)
    check = abs(value) if c.absolute else value
    passed = math.isfinite(check) and (check <= c.threshold if c.inclusive else check < c.threshold)
    change = mem.change
    assert change is not None
    field_name = MEMORY_METRICS[c.metric]
    note = (f"{change.test.metric}: test {getattr(change.test, field_name):.2f} MiB (ranks "
            f"{', '.join(map(str, change.test.ranks))}), reference {getattr(change.reference, field_name):.2f} MiB "
            f"(ranks {', '.join(map(str, change.reference.ranks))})")
    return CriterionResult(c, value, passed, note)


def _with_curve_level(
    r: CriterionResult, pairs: Mapping[str, Pairs], metrics: Mapping[str, MetricComparison],
    resolutions: Mapping[str, tuple[Resolution | None, Resolution | None]], noise_floor: Mapping[str, float] | None,
) -> CriterionResult:
    """The result with its display value and, when it failed, the steps that drive it and where it diverges."""
    mc = metrics.get(r.metric)
    text = fmt_stat(r.value, r.statistic, mc.resolution if mc else None, mc.magnitude if mc else None)
    if r.passed or not r.evaluated or r.metric not in pairs:
        return dataclasses.replace(r, value_text=text)
    p = pairs[r.metric].without(r.criterion.exclude_steps)
    t, ref = resolutions.get(r.metric, (None, None))
    floor = (noise_floor or {}).get(r.metric)
    return dataclasses.replace(r, value_text=text, drivers=drivers(r.criterion, p, r.value),
                               first_outside=criterion_first_outside(r.criterion, p, t, ref, floor))


def _below_resolution(c: Criterion, t: Resolution | None, r: Resolution | None, magnitude: float) -> str:
    """A note when the threshold is finer than one unit of the coarser log's last printed digit."""
    if not math.isfinite(magnitude):
        return ""
    quanta = [(res.quantum(magnitude), side, res) for side, res in (("test", t), ("reference", r)) if res]
    if not quanta:
        return ""
    quantum, side, res = max(quanta, key=lambda q: q[0])
    limit = quantum / (magnitude + REL_EPS) if is_relative(c.statistic) else quantum
    if c.threshold >= limit:
        return ""
    return (f"threshold tighter than the logs' resolution: the {side} log prints {c.metric} with "
            f"{res.describe()} (one unit = {limit:.3g}{' relative' if is_relative(c.statistic) else ''})")


def _reasons(
    results: Sequence[CriterionResult], logs: dict[str, ParsedLog], coverage: StepCoverage,
    criteria: Sequence[Criterion], require: tuple[str, ...] = (),
) -> list[str]:
    reasons: list[str] = []
    if not criteria:
        reasons.append("no criteria given: nothing can pass")
    elif not any(r.evaluated for r in results):
        reasons.append("no criterion could be evaluated: "
                       + "; ".join(f"{criterion_label(r.criterion)}: {r.note}" for r in results))
    if coverage.compared == 0:
        reasons.append("no step is in both logs" + (" (but excluded)" if coverage.excluded else ""))
    elif coverage.compared < coverage.min_overlap:
        reasons.append(f"only {coverage.compared} step(s) compared; at least {coverage.min_overlap} needed "
                       "(min_overlap: 10 steps, or every step of the shorter log)")
    for r in results:
        if r.evaluated and not r.passed:
            why = "; ".join(x for x in (r.driver_text(), r.note) if x)
            reasons.append(f"{criterion_label(r.criterion)} failed: value {r.value_text or 'n/a'}"
                           + (f" ({why})" if why else ""))
    for side, parsed in logs.items():
        fatal = parsed.fatal_under(require)
        if fatal:
            kinds = sorted({s.kind for s in fatal})
            reasons.append(f"{len(fatal)} fatal sentinel line(s) in the {side} log: {', '.join(kinds)}")
        for name in parsed.missing(require):
            reasons.append(f"the {side} log never shows {name} (required)")
    return reasons


def _aligned(
    tf: pd.DataFrame, rf: pd.DataFrame, both: list[str], metrics: dict[str, MetricComparison],
    only_test: Sequence[str], only_reference: Sequence[str],
) -> pd.DataFrame:
    """Every step of either log, one row each: both values, the error and relative error of each metric."""
    idx = tf.index.union(rf.index)
    data: dict[str, Any] = {"in_test": idx.isin(tf.index), "in_reference": idx.isin(rf.index)}
    for m in both:
        tv = tf[m].reindex(idx).to_numpy(dtype=float, na_value=np.nan)
        rv = rf[m].reindex(idx).to_numpy(dtype=float, na_value=np.nan)
        shift = metrics[m].shift
        rs = rf[m].reindex(idx + shift).to_numpy(dtype=float, na_value=np.nan) if shift else rv
        data[f"{m}_test"], data[f"{m}_reference"] = tv, rv
        data[f"{m}_error"] = tv - rs
        data[f"{m}_rel_error"] = relative_error(tv, rs)
    for m in only_test:
        data[f"{m}_test"] = tf[m].reindex(idx).to_numpy(dtype=float, na_value=np.nan)
    for m in only_reference:
        data[f"{m}_reference"] = rf[m].reindex(idx).to_numpy(dtype=float, na_value=np.nan)
    for side, frame in (("test", tf), ("reference", rf)):
        if "step_time_ms" in frame.columns:
            data[f"step_time_ms_{side}"] = frame["step_time_ms"].reindex(idx).to_numpy(dtype=float, na_value=np.nan)
    return pd.DataFrame(data, index=pd.Index(idx, name="step"))
