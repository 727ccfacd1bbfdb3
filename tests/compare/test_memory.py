"""Per-rank memory statistics as seed 004 reports them (docs/seeds.md#memory-per-rank): each rank's peak, the
maximum and the mean over ranks, and the saving `(off - on) / off`."""

from __future__ import annotations

import pytest

from alignflow.compare.memory import memory_change, memory_summary, merge_ranks, saving_percent
from alignflow.logs.memory import MemoryRecord, memory_lines

GIB = 1024.0


def _rec(rank: int | None, step: int | None, max_allocated: float | None, **kw: float) -> MemoryRecord:
    return MemoryRecord(rank=rank, step=step, label="", source="megatron", line=0, max_allocated_mb=max_allocated,
                        **kw)


def test_each_ranks_peak_then_max_rank_and_avg_rank() -> None:
    recs = [_rec(0, 1, 100.0), _rec(0, 2, 120.0), _rec(1, 1, 150.0), _rec(1, 2, 140.0), _rec(2, 2, 80.0)]
    s = memory_summary(recs)
    assert s is not None
    assert s.metric == "max_allocated_mb"
    assert s.per_rank == ((0, 120.0), (1, 150.0), (2, 80.0))
    assert s.max_rank == 150.0
    assert s.avg_rank == pytest.approx((120 + 150 + 80) / 3)
    assert s.peak_rank == 1
    assert s.to_json()["per_rank"] == {"0": 120.0, "1": 150.0, "2": 80.0}


def test_seed_004_chunkloss_row() -> None:
    # GLM-4.5V FSDP2 report: ChunkLoss off -> static, max-rank 1.178923 -> 0.712448 GiB, avg-rank 1.147315 -> 0.686491
    off = memory_summary([_rec(0, 1, 1.178923 * GIB), _rec(1, 1, 1.115707 * GIB)])
    on = memory_summary([_rec(0, 1, 0.712448 * GIB), _rec(1, 1, 0.660534 * GIB)])
    assert off is not None
    assert on is not None
    change = memory_change(off, on)
    assert round(change.max_rank_saving, 3) == 39.568
    assert round(change.avg_rank_saving, 3) == 40.165
    assert saving_percent(100.0, 110.0) == pytest.approx(-10.0)  # more memory: a negative saving


def test_measures_are_not_mixed_and_a_rank_comes_from_its_file() -> None:
    reserved_only = memory_summary([_rec(0, 1, None, max_reserved_mb=10.0)])
    allocated = memory_summary([_rec(0, 1, 5.0)])
    assert reserved_only is not None
    assert allocated is not None
    assert reserved_only.metric == "max_reserved_mb"
    with pytest.raises(ValueError, match="compare one measure"):
        memory_change(allocated, reserved_only)
    assert memory_summary([_rec(0, 1, None)]) is None
    worker = ["Used peak memory usage (without fragments): 300M", "Actual peak memory usage (with fragments): 320M"]
    merged = merge_ranks({0: memory_lines(worker), 1: memory_lines([w.replace("300", "310") for w in worker])})
    s = memory_summary(merged)
    assert s is not None
    assert s.per_rank == ((0, 300.0), (1, 310.0))
    assert s.sources == ("mindspore",)
