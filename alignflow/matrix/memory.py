"""Per-rank device memory from a training log, in the frameworks' own lines.

- megatron's `report_memory` (`megatron/training/utils.py`), printed by each rank of data-parallel rank 0 after
  the first iterations: `[Rank R] (after N iterations) memory (MB) | allocated: A | max allocated: M |
  reserved: X | max reserved: Y` (floats; megatron-core 0.19 prints 2 decimals, older ones Python's repr).
  MindSpeed-LLM's CI reads the same line (`tests/test_tools/acquire_json.py`, `memory_pattern`).
- MindSpore's memory statistics at the end of a run (with `MS_MEMORY_STATISTIC=1`, or GLOG_v=1 on Ascend):
  `Used peak memory usage (without fragments): NM` — the peak of what tensors held, megatron's max allocated —
  and `Actual peak memory usage (with fragments): NM` — the peak the pool reserved (MindSpore's dry-run and
  tuning guides). One block per process: the rank is its log's (msrun `worker_<r>.log`) or the line's
  torchrun/srun prefix.

Seed 004's statistics over ranks (docs/seeds.md#performance-statistics): max-rank = the largest per-rank peak,
avg-rank = their mean, in GiB. Each rank's value is its last report (a peak never decreases).

TODO(cards, issue 36): the `cards` engineer parses memory lines in `alignflow.logs` as well; once there, this module
should read its columns instead (the lead unifies them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

_PREFIX = re.compile(r"^(?:\[[A-Za-z_]*(\d+)\]:|\s*(\d+): )")
_MEGATRON = re.compile(
    r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\) \| allocated: ([0-9.eE+-]+) \| "
    r"max allocated: ([0-9.eE+-]+)(?: \| (?:reserved|cached): ([0-9.eE+-]+) \| max (?:reserved|cached): "
    r"([0-9.eE+-]+))?")
_MS_USED = re.compile(r"Used peak memory usage \(without fragments\): (\d+)M")
_MS_ACTUAL = re.compile(r"Actual peak memory usage \(with fragments\): (\d+)M")
MIB_PER_GIB = 1024.0


@dataclass(frozen=True, slots=True)
class RankMemory:
    """One rank's memory in MiB (what the line printed: `MB` in both frameworks means MiB)."""

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
    """Every rank's last memory report of one log."""

    ranks: dict[int, RankMemory] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.ranks

    @property
    def max_rank_gib(self) -> float | None:
        """Seed 004's max-rank: the largest per-rank allocator peak, GiB."""
        return max(r.max_allocated_mb for r in self.ranks.values()) / MIB_PER_GIB if self.ranks else None

    @property
    def avg_rank_gib(self) -> float | None:
        """Seed 004's avg-rank: the mean of the per-rank allocator peaks, GiB."""
        if not self.ranks:
            return None
        return sum(r.max_allocated_mb for r in self.ranks.values()) / len(self.ranks) / MIB_PER_GIB

    def to_json(self) -> dict[str, object]:
        return {"ranks": [r.to_json() for r in sorted(self.ranks.values(), key=lambda r: r.rank)],
                "max_rank_gib": self.max_rank_gib, "avg_rank_gib": self.avg_rank_gib}


def parse_memory(lines: Iterable[str], *, rank: int | None = None) -> MemoryReport:
    """The memory reports of a log (`rank`: the rank of a log without rank prefixes, e.g. msrun's worker_3.log)."""
    ranks: dict[int, RankMemory] = {}
    ms_used: dict[int, tuple[float, int]] = {}
    ms_actual: dict[int, float] = {}
    for line_no, raw in enumerate(lines, 1):
        if "memory" not in raw:
            continue
        text = raw.rstrip("\r\n")
        prefix = _PREFIX.match(text)
        line_rank = int(prefix.group(1) or prefix.group(2)) if prefix else None
        m = _MEGATRON.search(text)
        if m is not None:
            r = int(m.group(1))
            ranks[r] = RankMemory(
                rank=r, allocated_mb=float(m.group(3)), max_allocated_mb=float(m.group(4)),
                reserved_mb=float(m.group(5)) if m.group(5) else None,
                max_reserved_mb=float(m.group(6)) if m.group(6) else None, iteration=int(m.group(2)),
                source="megatron", line_no=line_no)
            continue
        own = line_rank if line_rank is not None else (rank if rank is not None else 0)
        used = _MS_USED.search(text)
        if used is not None:
            ms_used[own] = (float(used.group(1)), line_no)
            continue
        actual = _MS_ACTUAL.search(text)
        if actual is not None:
            ms_actual[own] = float(actual.group(1))
    for r, (used_mb, line_no) in ms_used.items():
        ranks.setdefault(r, RankMemory(rank=r, max_allocated_mb=used_mb, max_reserved_mb=ms_actual.get(r),
                                       source="mindspore", line_no=line_no))
    return MemoryReport(ranks)
