"""Golden values per side: record a run's per-step values as an experiment's goldens; check a run against them.

`alignflow golden record RUN [--side npu|gpu]` stores, for each side of RUN (and of each variant of a matrix
run), what its training log printed per step — every loss, the grad norm, the step time, the throughput — and
its memory per rank (`alignflow.matrix.memory`), as the next version of that experiment's goldens for that side,
with the run it came from. `alignflow golden check RUN` (and the nightly, for every experiment with goldens)
compares each side with the newest golden version by the experiment's margins (`alignflow.config.golden`: the
Megatron or MindSpeed-LLM defaults, or the experiment's own), and names the first step and metric out of margin.

Pure: `values_of` (a parsed log and its memory -> the values), `check_side` (golden values, actual values, margins
-> a `SideCheck`). Reading the runs' logs and the store is `alignflow.runner.goldens`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from alignflow.config.golden import Margin
from alignflow.matrix.memory import MemoryReport

if TYPE_CHECKING:
    from alignflow.logs.schema import ParsedLog

Values = dict[str, Any]  # {"metrics": {metric: {step: value}}, "memory": {rank: {...}}, "steps": [...]}
_MEMORY_KEYS = {"mem_allocated_mb": "allocated_mb", "mem_max_allocated_mb": "max_allocated_mb"}


def values_of(parsed: ParsedLog, memory: MemoryReport) -> Values:
    """What a golden keeps of one side's log: every numeric column per step (NaN as None) and memory per rank."""
    import numpy as np

    metrics: dict[str, dict[str, float | None]] = {}
    frame = parsed.frame
    for column in frame.columns:
        values = frame[column].to_numpy(dtype=float, na_value=np.nan)
        metrics[str(column)] = {str(int(step)): (float(v) if math.isfinite(v) else None)
                                for step, v in zip(frame.index, values, strict=True)}
    return {"metrics": metrics, "steps": [int(s) for s in frame.index],
            "memory": {str(r.rank): {"allocated_mb": r.allocated_mb, "max_allocated_mb": r.max_allocated_mb,
                                     "source": r.source} for r in memory.ranks.values()}}


@dataclass(frozen=True, slots=True)
class OutOfMargin:
    """One value out of its margin: the metric, the step (None: an aggregate or a memory value), both values."""

    metric: str
    step: int | None
    actual: float | None
    golden: float | None
    allowed: str
    where: str = ""  # `rank 0`, `mean of steps 6-30`

    def text(self) -> str:
        at = f"step {self.step}" if self.step is not None else self.where
        actual = "missing" if self.actual is None else f"{self.actual:.6g}"
        golden = "missing" if self.golden is None else f"{self.golden:.6g}"
        return f"{self.metric} at {at}: {actual} vs golden {golden} ({self.allowed})"

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "step": self.step, "actual": self.actual, "golden": self.golden,
                "allowed": self.allowed, "where": self.where, "text": self.text()}


@dataclass(frozen=True, slots=True)
class SideCheck:
    """One side of one run against its golden values."""

    experiment: str
    side: str
    run_id: str
    golden_version: int | None
    golden_run: str | None
    failures: tuple[OutOfMargin, ...] = ()
    checked: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()  # metrics neither log has (with why)
    note: str = ""

    @property
    def status(self) -> Literal["pass", "fail", "no golden"]:
        if self.golden_version is None:
            return "no golden"
        return "fail" if self.failures else "pass"

    @property
    def first(self) -> OutOfMargin | None:
        """The first value out of margin: the lowest step of the per-step failures (in the margins' metric order
        at that step), else the first aggregate one."""
        per_step = [f for f in self.failures if f.step is not None]
        if per_step:
            return min(per_step, key=lambda f: (f.step or 0))
        return self.failures[0] if self.failures else None

    def to_json(self) -> dict[str, Any]:
        first = self.first
        return {"experiment": self.experiment, "side": self.side, "run_id": self.run_id, "status": self.status,
                "golden_version": self.golden_version, "golden_run": self.golden_run,
                "first": first.to_json() if first else None, "failures": [f.to_json() for f in self.failures],
                "checked": list(self.checked), "skipped": list(self.skipped), "note": self.note}


def check_side(golden: Values, actual: Values, margins: Mapping[str, Margin], *, experiment: str, side: str,
               run_id: str, version: int | None = None, golden_run: str | None = None) -> SideCheck:
    """Every metric of `margins` of one side against its golden values (pure)."""
    failures: list[OutOfMargin] = []
    checked: list[str] = []
    skipped: list[str] = []
    for metric, margin in margins.items():
        if metric in _MEMORY_KEYS:
            found = _check_memory(metric, margin, golden.get("memory") or {}, actual.get("memory") or {})
        else:
            found = _check_metric(metric, margin, (golden.get("metrics") or {}).get(metric),
                                  (actual.get("metrics") or {}).get(metric))
        if found is None:
            skipped.append(f"{metric}: in neither log")
            continue
        checked.append(metric)
        failures += found
    return SideCheck(experiment, side, run_id, version, golden_run, tuple(failures), tuple(checked), tuple(skipped))


def _within(actual: float, golden: float, margin: Margin) -> bool:
    if margin.deterministic:
        return actual == golden
    allowed = margin.atol + margin.rtol * abs(golden)
    if margin.one_sided == "higher":
        return actual - golden <= allowed
    if margin.one_sided == "lower":
        return golden - actual <= allowed
    return abs(actual - golden) <= allowed


def _allowed(margin: Margin) -> str:
    if margin.deterministic:
        return "deterministic: must be equal"
    parts = [f"rtol {margin.rtol:g}"] if margin.rtol else []
    parts += [f"atol {margin.atol:g}"] if margin.atol else []
    side = {"higher": ", only an increase counts", "lower": ", only a decrease counts"}.get(margin.one_sided or "", "")
    return " + ".join(parts) + side


def _check_metric(metric: str, margin: Margin, golden: Mapping[str, float | None] | None,
                  actual: Mapping[str, float | None] | None) -> list[OutOfMargin] | None:
    if golden is None and actual is None:
        return None
    if golden is None:
        return [OutOfMargin(metric, None, None, None, "not in the golden values: record a new version",
                            "the golden run")]
    steps = sorted(int(s) for s in golden)[margin.warmup_steps:]
    if margin.skip_last and steps:
        steps = steps[:-1]
    actual = actual or {}
    if margin.aggregate == "mean":
        g = _mean(golden.get(str(s)) for s in steps)
        a = _mean(actual.get(str(s)) for s in steps)
        where = f"mean of steps {steps[0]}-{steps[-1]}" if steps else "mean (no step after the warm-up)"
        if g is None or a is None or not _within(a, g, margin):
            return [OutOfMargin(metric, None, a, g, _allowed(margin), where)]
        return []
    out = []
    for step in steps:
        g, a = golden.get(str(step)), actual.get(str(step))
        if g is None and a is None:
            continue
        if g is None or a is None or not (math.isfinite(a) and math.isfinite(g)) or not _within(a, g, margin):
            out.append(OutOfMargin(metric, step, a, g, _allowed(margin)))
    return out


def _mean(values: Iterable[float | None]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def _check_memory(metric: str, margin: Margin, golden: Mapping[str, Mapping[str, Any]],
                  actual: Mapping[str, Mapping[str, Any]]) -> list[OutOfMargin] | None:
    key = _MEMORY_KEYS[metric]
    ranks = sorted({r for r in golden if golden[r].get(key) is not None}
                   | {r for r in actual if actual[r].get(key) is not None}, key=int)
    if not ranks:
        return None
    out = []
    for rank in ranks:
        g, a = (golden.get(rank) or {}).get(key), (actual.get(rank) or {}).get(key)
        if g is None or a is None or not _within(float(a), float(g), margin):
            out.append(OutOfMargin(metric, None, None if a is None else float(a), None if g is None else float(g),
                                   _allowed(margin), f"rank {rank}"))
    return out


@dataclass(frozen=True, slots=True)
class GoldenCheck:
    """Every side checked of a run (and of its matrix's variants)."""

    run_id: str
    sides: tuple[SideCheck, ...] = field(default=())

    @property
    def passed(self) -> bool:
        return all(s.status == "pass" for s in self.sides) and any(s.status == "pass" for s in self.sides)

    @property
    def verdict(self) -> Literal["pass", "fail", "no golden"]:
        if not any(s.golden_version is not None for s in self.sides):
            return "no golden"
        return "fail" if any(s.status == "fail" for s in self.sides) else "pass"

    def reasons(self) -> list[str]:
        """One line per side out of margin: `demo gpu: lm_loss at step 2: ... (golden v1 from run X)`."""
        out = []
        for s in self.sides:
            if s.status == "fail" and s.first is not None:
                more = f"; {len(s.failures) - 1} more value(s) out of margin" if len(s.failures) > 1 else ""
                out.append(f"{s.experiment} {s.side}: first out of margin: {s.first.text()}{more} (golden "
                           f"v{s.golden_version} from run {s.golden_run})")
        return out

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "verdict": self.verdict, "reasons": self.reasons(),
                "sides": [s.to_json() for s in self.sides]}
