"""The matrix comparison: every variant against its reference, per side, by the one criteria engine; pure.

Seed 004's tables (docs/seeds.md#switch-matrix), one set per group and side: for each switch, its OFF and ON
configs (`00→01`; `03→00` when the variant is the OFF side), the loss errors with OFF as the reference (mean
relative, max absolute, max relative), the grad-norm mean relative error, ms/iter, samples/s and the throughput
change OFF→ON over the group's performance window, P95/P99, the max-rank and avg-rank allocator peaks OFF→ON and
their saving. Definitions (docs/seeds.md#performance-statistics): relative error |test-reference|/(|reference|+1e-8);
samples/s = global batch x 1000 / mean ms/iter; throughput change = samples/s ON / samples/s OFF - 1; memory
saving = (OFF - ON) / OFF, negative when ON uses more.

A training timed on a loaded host (its 1-minute load at least its CPU count when its run started, `TimingConditions`,
the single-run report's rule) measured the sharing as much as the switch: its row keeps both sides' conditions and
its speed change is `timing_unreliable` (issue 47: `+1104 %` on a loaded machine, with no caveat). The memory figures
are allocator peaks, counted rather than timed: the load does not move them.

A side whose training a variant does not change is the reference's own training (reused by its fingerprint): it
has no row, the variant lists it as shared. Each variant has one verdict — `pass` (every changed side passes the
criteria), `fail` (numerics moved, or a training failed or ended with an unknown exit code) or `oom` — and the
matrix passes when every variant shows what it was expected to (`expect:`) and every reference completed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from alignflow.config.criteria import Criterion
from alignflow.config.variants import DEFAULT_GROUP, Matrix
from alignflow.matrix.memory import MemoryReport
from alignflow.matrix.status import TrainingStatus
from alignflow.pipeline import SIDE_NAMES, SIDES

if TYPE_CHECKING:
    from alignflow.compare.comparison import Comparison
    from alignflow.compare.context import TimingConditions
    from alignflow.logs.schema import ParsedLog

Outcome = Literal["pass", "fail", "oom"]
SIDE_ORDER = SIDE_NAMES  # the pipeline's sides, in their order (NPU, then GPU)
_STATUS_RANK = {"oom": 4, "exit code unknown": 3, "failed": 2, "not run": 1, "completed": 0}


@dataclass(frozen=True, slots=True)
class SideTraining:
    """One training of one side: how it ended, its parsed log (None without step lines), memory, identity."""

    status: TrainingStatus
    parsed: ParsedLog | None = None
    memory: MemoryReport = field(default_factory=MemoryReport)
    identity: str | None = None  # the step run that trained it (a cached step's origin): equal = the same training
    run_id: str | None = None
    timing: TimingConditions | None = None  # how its step times were taken (None: not recorded)


@dataclass(frozen=True, slots=True)
class ConfigTrainings:
    """Both sides' trainings of one config of one group."""

    name: str
    sides: Mapping[str, SideTraining]
    run_id: str | None = None


@dataclass(frozen=True, slots=True)
class SidePerf:
    """One training's speed over the window: ms/iter mean, P95, P99, samples/s."""

    ms_per_iter: float | None
    p95: float | None
    p99: float | None
    samples_per_s: float | None

    def to_json(self) -> dict[str, Any]:
        return {"ms_per_iter": _num(self.ms_per_iter), "p95": _num(self.p95), "p99": _num(self.p99),
                "samples_per_s": _num(self.samples_per_s)}


@dataclass(frozen=True, slots=True)
class Row:
    """One OFF → ON comparison of one side (a line of seed 004's tables)."""

    group: str
    side: str
    switch: str
    off: str
    on: str
    variant: str | None  # the config this row judges (None: an extra pair)
    verdict: Literal["pass", "fail", "oom", "n/a"]
    loss_mean_rel: float | None = None
    loss_max_abs: float | None = None
    loss_max_rel: float | None = None
    grad_norm_mean_rel: float | None = None
    perf_off: SidePerf | None = None
    perf_on: SidePerf | None = None
    throughput_change: float | None = None
    mem_max_off: float | None = None
    mem_max_on: float | None = None
    mem_avg_off: float | None = None
    mem_avg_on: float | None = None
    status_off: TrainingStatus | None = None
    status_on: TrainingStatus | None = None
    failed: tuple[str, ...] = ()  # criteria that failed, with their values
    criteria: tuple[dict[str, Any], ...] = ()  # every criterion's result (CriterionResult.to_json)
    note: str = ""
    timing_off: TimingConditions | None = None
    timing_on: TimingConditions | None = None

    @property
    def configs(self) -> str:
        return f"{short_name(self.off)}→{short_name(self.on)}"

    @property
    def timing_unreliable(self) -> bool:
        """Either side was timed on a loaded host: its ms/iter, samples/s and throughput change measure the load."""
        return any(t is not None and t.loaded for t in (self.timing_off, self.timing_on))

    @property
    def mem_max_saving(self) -> float | None:
        return _saving(self.mem_max_off, self.mem_max_on)

    @property
    def mem_avg_saving(self) -> float | None:
        return _saving(self.mem_avg_off, self.mem_avg_on)

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group, "side": self.side, "switch": self.switch, "off": self.off, "on": self.on,
            "configs": self.configs, "variant": self.variant, "verdict": self.verdict,
            "loss_mean_rel": _num(self.loss_mean_rel), "loss_max_abs": _num(self.loss_max_abs),
            "loss_max_rel": _num(self.loss_max_rel), "grad_norm_mean_rel": _num(self.grad_norm_mean_rel),
            "perf_off": self.perf_off.to_json() if self.perf_off else None,
            "perf_on": self.perf_on.to_json() if self.perf_on else None,
            "throughput_change": _num(self.throughput_change),
            "memory_gib": {"max_rank_off": _num(self.mem_max_off), "max_rank_on": _num(self.mem_max_on),
                           "avg_rank_off": _num(self.mem_avg_off), "avg_rank_on": _num(self.mem_avg_on),
                           "max_rank_saving": _num(self.mem_max_saving),
                           "avg_rank_saving": _num(self.mem_avg_saving)},
            "status_off": self.status_off.to_json() if self.status_off else None,
            "status_on": self.status_on.to_json() if self.status_on else None,
            "failed_criteria": list(self.failed), "criteria": list(self.criteria), "note": self.note,
            "timing_off": self.timing_off.to_json() if self.timing_off else None,
            "timing_on": self.timing_on.to_json() if self.timing_on else None,
            "timing_unreliable": self.timing_unreliable,
        }


@dataclass(frozen=True, slots=True)
class VariantResult:
    """One variant in one group: what it showed, what it was expected to show, and why."""

    group: str
    name: str
    switch: str
    outcome: Outcome
    expect: Outcome
    status: TrainingStatus
    changed_sides: tuple[str, ...]
    shared_sides: tuple[str, ...]
    reasons: tuple[str, ...] = ()
    run_id: str | None = None

    @property
    def as_expected(self) -> bool:
        return self.outcome == self.expect

    @property
    def verdict(self) -> Literal["pass", "fail"]:
        """The variant's own verdict (did its numerics hold and its trainings complete)."""
        return "pass" if self.outcome == "pass" else "fail"

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "name": self.name, "switch": self.switch, "verdict": self.verdict,
                "outcome": self.outcome, "expect": self.expect, "as_expected": self.as_expected,
                "status": self.status.status, "exit_code": self.status.exit_code,
                "changed_sides": list(self.changed_sides),
                "shared_sides": list(self.shared_sides), "reasons": list(self.reasons), "run_id": self.run_id}


@dataclass(frozen=True, slots=True)
class ConfigSummary:
    """One config of one group as a line of the per-config table (seed 004's expanded table, against the
    reference): its status per side and the speed and memory of each side."""

    group: str
    name: str
    sides: Mapping[str, SideTraining]
    perf: Mapping[str, SidePerf | None]

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "name": self.name, "sides": {
            s: {**t.status.to_json(), "run_id": t.run_id, "steps": len(t.parsed.frame) if t.parsed is not None else 0,
                "memory": t.memory.to_json(), "perf": p.to_json() if (p := self.perf.get(s)) else None,
                "timing": t.timing.to_json() if t.timing else None}
            for s, t in self.sides.items()}}


@dataclass(frozen=True, slots=True)
class MatrixResult:
    """The whole matrix: rows per group and side, each variant's outcome, the per-config summary, the verdict."""

    experiment: str
    reference: str
    groups: tuple[str, ...]
    warmup: Mapping[str, int]
    rows: tuple[Row, ...]
    variants: tuple[VariantResult, ...]
    configs: tuple[ConfigSummary, ...]
    verdict: Literal["pass", "fail"]
    reasons: tuple[str, ...]
    criteria: tuple[Criterion, ...]
    side_labels: Mapping[str, str]

    def to_json(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment, "reference": self.reference, "verdict": self.verdict,
            "reasons": list(self.reasons), "groups": [{"name": g, "warmup_steps": self.warmup[g]} for g in self.groups],
            "criteria": [c.model_dump(mode="json") for c in self.criteria],
            "sides": dict(self.side_labels),
            "variants": [v.to_json() for v in self.variants],
            "rows": [r.to_json() for r in self.rows],
            "configs": [c.to_json() for c in self.configs],
        }


def short_name(config: str) -> str:
    """Seed 004's config numbers: `01_ring_cp2` -> `01`; a name without a number prefix stays whole."""
    head, sep, _ = config.partition("_")
    return head if sep and head.isdigit() else config


def side_perf(parsed: ParsedLog | None, warmup: int) -> SidePerf | None:
    if parsed is None:
        return None
    from alignflow.compare.performance import side_performance

    p = side_performance(parsed.frame, warmup)
    if p is None:
        return None
    return SidePerf(p.ms_per_iter_mean, p.ms_per_iter_p95, p.ms_per_iter_p99, p.samples_per_s)


def compare_matrix(matrix: Matrix, trainings: Mapping[str, Mapping[str, ConfigTrainings]], *,
                   criteria: Sequence[Criterion], experiment: str = "",
                   side_labels: Mapping[str, str] | None = None) -> MatrixResult:
    """Judge every variant of `matrix` against its group's reference (`trainings[group][config]`)."""
    labels = dict(side_labels or {s.name: s.label for s in SIDES})
    rows: list[Row] = []
    variants: list[VariantResult] = []
    summaries: list[ConfigSummary] = []
    reasons: list[str] = []
    groups = tuple(matrix.group_names)
    cache: dict[tuple[str, str], SidePerf | None] = {}
    for group in groups:
        warmup = matrix.warmup(group)
        trained = trainings.get(group, {})
        ref = trained.get(matrix.reference)
        names = [matrix.reference, *matrix.configs_in(group)]
        for name in names:
            t = trained.get(name)
            if t is not None:
                summaries.append(ConfigSummary(group, name, t.sides, {
                    s: cache.setdefault((group, f"{name}:{s}"), side_perf(tr.parsed, warmup))
                    for s, tr in t.sides.items()}))
        where = f" in group {group}" if group != DEFAULT_GROUP else ""
        if ref is None:
            reasons.append(f"reference {matrix.reference}{where}: not trained")
        else:
            bad = [f"{labels.get(s, s)} {t.status.status}" for s, t in ref.sides.items() if not t.status.completed]
            if bad:
                reasons.append(f"reference {matrix.reference}{where}: {', '.join(bad)}")
        for name in matrix.configs_in(group):
            config = matrix.configs[name]
            t = trained.get(name)
            result, own_rows = _variant(matrix, group, name, t, ref, criteria, warmup, labels)
            rows += own_rows
            variants.append(result)
            if not result.as_expected:
                reasons.append(f"{name}{where}: {result.outcome}, expected {config.expect}"
                               + (f" ({'; '.join(result.reasons)})" if result.reasons else ""))
        for pair in matrix.pairs:
            if pair.groups is not None and group not in pair.groups:
                continue
            off, on = trained.get(pair.off), trained.get(pair.on)
            if off is None or on is None:
                continue
            for side in _sides(off, on):
                if _same(off.sides[side], on.sides[side]):
                    continue
                rows.append(_row(group, side, pair.switch or f"{pair.off} → {pair.on}", pair.off, pair.on, None,
                                 off.sides[side], on.sides[side], criteria, warmup))
    verdict: Literal["pass", "fail"] = "fail" if reasons else "pass"
    return MatrixResult(experiment=experiment, reference=matrix.reference, groups=groups,
                        warmup={g: matrix.warmup(g) for g in groups}, rows=tuple(rows), variants=tuple(variants),
                        configs=tuple(summaries), verdict=verdict, reasons=tuple(reasons), criteria=tuple(criteria),
                        side_labels=labels)


def _sides(*configs: ConfigTrainings) -> list[str]:
    present = set.intersection(*(set(c.sides) for c in configs)) if configs else set()
    return [s for s in SIDE_ORDER if s in present] + sorted(present - set(SIDE_ORDER))


def _same(a: SideTraining, b: SideTraining) -> bool:
    """The same training: both completed by one step run (a variant's side reused from the reference)."""
    return a.status.completed and b.status.completed and a.identity is not None and a.identity == b.identity


def _variant(matrix: Matrix, group: str, name: str, trained: ConfigTrainings | None, ref: ConfigTrainings | None,
             criteria: Sequence[Criterion], warmup: int, labels: Mapping[str, str]
             ) -> tuple[VariantResult, list[Row]]:
    config = matrix.configs[name]
    switch = config.switch or name
    if trained is None or ref is None:
        missing = "the variant" if trained is None else "its reference"
        status = TrainingStatus("not run", reason=f"{missing} was not trained")
        return VariantResult(group, name, switch, "fail", config.expect, status, (), (), (status.reason,)), []
    rows: list[Row] = []
    changed, shared = [], []
    for side in _sides(trained, ref):
        v, r = trained.sides[side], ref.sides[side]
        if _same(v, r):
            shared.append(side)
            continue
        changed.append(side)
        off, on = (ref, trained) if config.direction == "off_on" else (trained, ref)
        rows.append(_row(group, side, switch, off.name, on.name, name, off.sides[side], on.sides[side], criteria,
                         warmup))
    statuses = [trained.sides[s].status for s in changed] or [trained.sides[s].status for s in trained.sides]
    worst = max(statuses, key=lambda st: _STATUS_RANK[st.status])
    why: list[str] = []
    outcome: Outcome
    if worst.status == "oom":
        outcome = "oom"
        why += [f"{labels.get(s, s)}: out of memory: {trained.sides[s].status.reason}" for s in changed
                if trained.sides[s].status.status == "oom"]
    elif worst.status != "completed":
        outcome = "fail"
        why += [f"{labels.get(s, s)}: {trained.sides[s].status.status}: {trained.sides[s].status.reason}"
                for s in changed if not trained.sides[s].status.completed]
    else:
        bad = [r for r in rows if r.verdict != "pass"]
        outcome = "fail" if bad else "pass"
        why += [f"{labels.get(r.side, r.side)}: {'; '.join(r.failed) or r.note}" for r in bad]
    if not changed:
        why.append("changes no training: both sides are the reference's")
    return VariantResult(group, name, switch, outcome, config.expect, worst, tuple(changed), tuple(shared),
                         tuple(why), trained.run_id), rows


def _row(group: str, side: str, switch: str, off_name: str, on_name: str, variant: str | None, off: SideTraining,
         on: SideTraining, criteria: Sequence[Criterion], warmup: int) -> Row:
    base: dict[str, Any] = dict(
        group=group, side=side, switch=switch, off=off_name, on=on_name, variant=variant, status_off=off.status,
        status_on=on.status, mem_max_off=off.memory.max_rank_gib, mem_max_on=on.memory.max_rank_gib,
        mem_avg_off=off.memory.avg_rank_gib, mem_avg_on=on.memory.avg_rank_gib, timing_off=off.timing,
        timing_on=on.timing)
    if off.parsed is None or on.parsed is None:
        which = [n for n, t in ((off_name, off), (on_name, on)) if t.parsed is None]
        ends = [t.status.status for t in (off, on) if not t.status.completed]
        verdict: Literal["pass", "fail", "oom", "n/a"] = "oom" if "oom" in ends else "fail" if ends else "n/a"
        return Row(**base, verdict=verdict, perf_off=side_perf(off.parsed, warmup),
                   perf_on=side_perf(on.parsed, warmup),
                   note=f"no step lines from {', '.join(which)}" + (f" ({', '.join(ends)})" if ends else ""))
    from alignflow.compare.comparison import compare

    result = compare(on.parsed, off.parsed, criteria, perf_warmup_steps=warmup)
    return _row_from(result, base)


def _row_from(result: Comparison, base: dict[str, Any]) -> Row:
    lm = result.metrics.get("lm_loss")
    gn = result.metrics.get("grad_norm")
    perf = result.performance

    def sp(p: Any) -> SidePerf | None:
        return None if p is None else SidePerf(p.ms_per_iter_mean, p.ms_per_iter_p95, p.ms_per_iter_p99,
                                                p.samples_per_s)

    return Row(**base, verdict=result.verdict,
               loss_mean_rel=_finite(lm.stats.get("mean_rel")) if lm else None,
               loss_max_abs=_finite(lm.stats.get("max_abs")) if lm else None,
               loss_max_rel=_finite(lm.stats.get("max_rel")) if lm else None,
               grad_norm_mean_rel=_finite(gn.stats.get("mean_rel")) if gn else None,
               perf_off=sp(perf.reference), perf_on=sp(perf.test), throughput_change=_finite(perf.throughput_change),
               failed=result.reasons,
               criteria=tuple(c.to_json() for c in result.criteria))


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _num(value: float | None) -> float | None:
    return _finite(value)


def _saving(off: float | None, on: float | None) -> float | None:
    if off is None or on is None or off == 0:
        return None
    return (off - on) / off
