"""Memory across ranks, as seed 004 reports it (docs/seeds.md#memory-per-rank): each rank's peak over the run,
then the maximum over ranks (`max-rank`) and the mean (`avg-rank`); a change between two runs is seed 004's
saving, `(reference - test) / reference x 100 %` (negative: the test run uses more).

The figure is the allocator's peak (`max allocated`, MindSpore's `Used peak memory usage (without fragments)`,
NeMo's `peak_allocated_mem`) unless asked for another; reserved / with-fragments and the host's RSS are other
measures and are reported apart, never mixed (docs/seeds.md#performance-statistics). Pure: records in
(`alignflow.logs.memory`), numbers out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from alignflow.logs.memory import MemoryRecord

METRICS = ("max_allocated_mb", "max_reserved_mb", "allocated_mb", "reserved_mb")


@dataclass(frozen=True, slots=True)
class MemorySummary:
    """One side's memory: each rank's peak of `metric` (MiB), the maximum and the mean over ranks."""

    metric: str
    per_rank: tuple[tuple[int, float], ...]  # (rank, peak), by rank
    sources: tuple[str, ...]

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(r for r, _ in self.per_rank)

    @property
    def max_rank(self) -> float:
        return max(v for _, v in self.per_rank)

    @property
    def avg_rank(self) -> float:
        return sum(v for _, v in self.per_rank) / len(self.per_rank)

    @property
    def peak_rank(self) -> int:
        """The rank whose peak is the maximum (the first of them)."""
        return max(self.per_rank, key=lambda rv: (rv[1], -rv[0]))[0]

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "per_rank": {str(r): v for r, v in self.per_rank},
                "max_rank": self.max_rank, "avg_rank": self.avg_rank, "peak_rank": self.peak_rank,
                "sources": list(self.sources)}


def memory_summary(records: Iterable[MemoryRecord], *, metric: str | None = None,
                   default_rank: int = 0) -> MemorySummary | None:
    """Per-rank peaks of `metric` (default: the first of `METRICS` the records print), over every record of each
    rank; a record without a rank counts as `default_rank` (a one-process log). None when no record prints it."""
    recs = list(records)
    chosen = metric or next((m for m in METRICS if any(r.value(m) is not None for r in recs)), None)
    if chosen is None:
        return None
    peaks: dict[int, float] = {}
    sources: set[str] = set()
    for r in recs:
        v = r.value(chosen)
        if v is None:
            continue
        rank = r.rank if r.rank is not None else default_rank
        peaks[rank] = max(peaks.get(rank, v), v)
        sources.add(r.source)
    if not peaks:
        return None
    return MemorySummary(chosen, tuple(sorted(peaks.items())), tuple(sorted(sources)))


def merge_ranks(per_rank_logs: Mapping[int, Iterable[MemoryRecord]]) -> list[MemoryRecord]:
    """Records of per-rank logs (a rank's own file, e.g. msrun's `worker_<rank>.log`) with the rank filled in where
    the line did not say."""
    out = []
    for rank, recs in per_rank_logs.items():
        for r in recs:
            out.append(r if r.rank is not None else MemoryRecord(
                rank=rank, step=r.step, label=r.label, source=r.source, line=r.line, allocated_mb=r.allocated_mb,
                max_allocated_mb=r.max_allocated_mb, reserved_mb=r.reserved_mb, max_reserved_mb=r.max_reserved_mb,
                pool_mb=r.pool_mb, device_mb=r.device_mb))
    return out


def saving_percent(reference: float, test: float) -> float:
    """Seed 004's memory saving: `(reference - test) / reference x 100` (negative: the test uses more)."""
    if reference <= 0:
        raise ValueError(f"reference memory {reference} MiB: no saving can be relative to it")
    return (reference - test) / reference * 100.0


@dataclass(frozen=True, slots=True)
class MemoryChange:
    """A row of seed 004's per-rank memory table: max-rank and avg-rank, reference -> test, and the savings."""

    reference: MemorySummary
    test: MemorySummary

    @property
    def max_rank_saving(self) -> float:
        return saving_percent(self.reference.max_rank, self.test.max_rank)

    @property
    def avg_rank_saving(self) -> float:
        return saving_percent(self.reference.avg_rank, self.test.avg_rank)

    def to_json(self) -> dict[str, Any]:
        return {"reference": self.reference.to_json(), "test": self.test.to_json(),
                "max_rank_saving_percent": self.max_rank_saving, "avg_rank_saving_percent": self.avg_rank_saving}


def memory_change(reference: MemorySummary, test: MemorySummary) -> MemoryChange:
    """The change from `reference` to `test`; both must measure the same thing (`ValueError` otherwise: an
    allocator peak against a reserved one is not a saving)."""
    if reference.metric != test.metric:
        raise ValueError(f"memory measured as {reference.metric} on one side and {test.metric} on the other; "
                         "compare one measure (docs/seeds.md#performance-statistics: allocator, device and host "
                         "memory apart)")
    return MemoryChange(reference, test)


# Criteria on memory: `memory_max_rank` / `memory_avg_rank`, each side's figure over its ranks. A relative statistic
# (`max_rel`, `mean_rel`, `step_rel`: one value, so all alike) is the change `(test - reference) / reference`, an
# absolute one (`me`, `max_abs`, ...) the difference `test - reference` in MiB; `absolute: false` keeps the sign
# (a criterion that only bounds an increase).
MEMORY_METRICS = {"memory_max_rank": "max_rank", "memory_avg_rank": "avg_rank"}


@dataclass(frozen=True, slots=True)
class MemoryComparison:
    """Both sides' per-rank memory (either may have printed none) and, when both did in one measure, the change."""

    test: MemorySummary | None
    reference: MemorySummary | None

    @property
    def change(self) -> MemoryChange | None:
        if self.test is None or self.reference is None or self.test.metric != self.reference.metric:
            return None
        return MemoryChange(self.reference, self.test)

    def why_not(self) -> str:
        """Why there is no change to judge ('' when there is one)."""
        missing = [side for side, s in (("test", self.test), ("reference", self.reference)) if s is None]
        if missing:
            return f"the {' and '.join(missing)} log prints no memory report"
        if self.change is None:
            assert self.test is not None
            assert self.reference is not None
            return (f"the sides measure different things (test {self.test.metric}, reference "
                    f"{self.reference.metric})")
        return ""

    def value(self, metric: str, relative: bool) -> float:
        """`metric` (`MEMORY_METRICS`) of test against reference: the relative change or the difference in MiB."""
        change = self.change
        if change is None:
            raise ValueError(self.why_not())
        field = MEMORY_METRICS[metric]
        t, r = float(getattr(change.test, field)), float(getattr(change.reference, field))
        return (t - r) / r if relative else t - r

    def to_json(self) -> dict[str, Any]:
        change = self.change
        out: dict[str, Any] = {"test": self.test.to_json() if self.test else None,
                               "reference": self.reference.to_json() if self.reference else None}
        if change is not None:
            out |= {"max_rank_change_percent": -change.max_rank_saving, "avg_rank_change_percent":
                    -change.avg_rank_saving, "max_rank_saving_percent": change.max_rank_saving,
                    "avg_rank_saving_percent": change.avg_rank_saving}
        else:
            out["note"] = self.why_not()
        return out


def compare_memory(test: Iterable[MemoryRecord], reference: Iterable[MemoryRecord]) -> MemoryComparison:
    """Per-rank memory of both logs, each in the first measure of `METRICS` both print (else each its own)."""
    t, r = list(test), list(reference)
    both = next((m for m in METRICS if any(x.value(m) is not None for x in t)
                 and any(x.value(m) is not None for x in r)), None)
    return MemoryComparison(memory_summary(t, metric=both), memory_summary(r, metric=both))
