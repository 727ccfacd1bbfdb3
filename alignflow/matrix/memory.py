"""Per-rank device memory of one training, as the matrix tables and the goldens read it.

The lines are read by `alignflow.logs.memory` (megatron's `report_memory` per rank, MindSpore's end-of-run
statistics with `MS_MEMORY_STATISTIC=1`, a launcher's rank prefix) and the statistics over ranks are
`alignflow.compare.memory`'s (each rank's allocator peak, max-rank, avg-rank): one place each, shared with the pair
comparison. This module keeps only the matrix's view of them: each rank's last report (what a golden stores per
rank) and seed 004's max-rank / avg-rank of the allocator peak (`max allocated`, MindSpore's `Used peak memory
usage (without fragments)`) in GiB (docs/seeds.md#performance-statistics).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from alignflow.compare.memory import MemorySummary, memory_summary
from alignflow.logs.memory import MemoryRecord, memory_lines

MIB_PER_GIB = 1024.0
PEAK = "max_allocated_mb"  # seed 004's figure: the allocator's peak


@dataclass(frozen=True, slots=True)
class RankMemory:
    """One rank's last memory report in MiB (what the line printed: `MB` in both frameworks means MiB)."""

    rank: int
    max_allocated_mb: float
    allocated_mb: float | None = None
    reserved_mb: float | None = None
    max_reserved_mb: float | None = None
    iteration: int | None = None  # megatron: the iteration the report followed; MindSpore: None (end of run)
    source: str = "megatron"  # megatron | mindspore
    line_no: int = 0

    def to_json(self) -> dict[str, object]:
        return {"rank": self.rank, "allocated_mb": self.allocated_mb, "max_allocated_mb": self.max_allocated_mb,
                "reserved_mb": self.reserved_mb, "max_reserved_mb": self.max_reserved_mb,
                "iteration": self.iteration, "source": self.source, "line": self.line_no}


@dataclass(frozen=True, slots=True)
class MemoryReport:
    """Every rank's last memory report of one log, and the allocator peaks over ranks."""

    ranks: dict[int, RankMemory] = field(default_factory=dict)
    summary: MemorySummary | None = None  # `alignflow.compare.memory` of the allocator peak

    @property
    def empty(self) -> bool:
        return not self.ranks

    @property
    def max_rank_gib(self) -> float | None:
        """Seed 004's max-rank: the largest per-rank allocator peak, GiB."""
        return self.summary.max_rank / MIB_PER_GIB if self.summary is not None else None

    @property
    def avg_rank_gib(self) -> float | None:
        """Seed 004's avg-rank: the mean of the per-rank allocator peaks, GiB."""
        return self.summary.avg_rank / MIB_PER_GIB if self.summary is not None else None

    def to_json(self) -> dict[str, object]:
        return {"ranks": [r.to_json() for r in sorted(self.ranks.values(), key=lambda r: r.rank)],
                "max_rank_gib": self.max_rank_gib, "avg_rank_gib": self.avg_rank_gib}


def memory_report(records: Iterable[MemoryRecord], *, default_rank: int = 0) -> MemoryReport:
    """The matrix's view of parsed records (`alignflow.logs.memory`); a record without a rank is `default_rank`'s."""
    recs = [r for r in records if r.max_allocated_mb is not None]
    ranks: dict[int, RankMemory] = {}
    for r in recs:  # in log order: the last report of a rank wins (a peak never decreases)
        rank = r.rank if r.rank is not None else default_rank
        assert r.max_allocated_mb is not None
        ranks[rank] = RankMemory(rank=rank, max_allocated_mb=r.max_allocated_mb, allocated_mb=r.allocated_mb,
                                 reserved_mb=r.reserved_mb, max_reserved_mb=r.max_reserved_mb, iteration=r.step,
                                 source=r.source, line_no=r.line)
    return MemoryReport(ranks, memory_summary(recs, metric=PEAK, default_rank=default_rank))


def parse_memory(lines: Iterable[str], *, rank: int | None = None) -> MemoryReport:
    """The memory reports of a log (`rank`: the rank of a log without rank prefixes, e.g. msrun's worker_3.log)."""
    return memory_report(memory_lines(lines, rank=rank), default_rank=rank if rank is not None else 0)
