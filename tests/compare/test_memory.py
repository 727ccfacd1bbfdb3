"""Per-rank memory statistics as seed 004 reports them (docs/seeds.md#memory-per-rank): each rank's peak, the
maximum and the mean over ranks, and the saving `(off - on) / off`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alignflow.compare.comparison import Comparison, compare
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


def _mem_lines(peaks: dict[int, float], prefix: bool = True) -> list[str]:
    """Megatron's report_memory line of each rank, as a rank-prefixed torchrun log holds them."""
    return [(f"[{r}]:" if prefix else "") + f"[Rank {r}] (after 1 iterations) memory (MB) | allocated: {v / 2} | "
            f"max allocated: {v} | reserved: {v * 2} | max reserved: {v * 2}" for r, v in peaks.items()]


def _compared(test_peaks: dict[int, float] | None, ref_peaks: dict[int, float] | None, threshold: str,
              **kw: object) -> Comparison:
    from alignflow.config.criteria import Criterion
    from alignflow.logs import parse_log
    from tests.logfixtures import make_run, megatron_lines

    run = make_run(20, seed=3)
    test_lines = megatron_lines(run) + (_mem_lines(test_peaks) if test_peaks else [])
    ref_lines = megatron_lines(run) + (_mem_lines(ref_peaks) if ref_peaks else [])
    rule = Criterion.model_validate({"metric": "memory_max_rank", "statistic": "max_rel", "threshold": threshold,
                                     "inclusive": True, **kw})
    return compare(parse_log(test_lines), parse_log(ref_lines), [rule],
                   memory=(memory_lines(test_lines), memory_lines(ref_lines)))


def test_a_memory_max_rank_criterion_judges_the_change_of_the_largest_ranks_peak() -> None:
    ref = {0: 1000.0, 1: 800.0, 2: 1000.0, 3: 1200.0}
    within = _compared({0: 1000.0, 1: 800.0, 2: 1000.0, 3: 1250.0}, ref, "5%")  # +4.17 % of rank 3
    assert within.verdict == "pass", within.reasons
    result = within.criteria[0]
    assert result.value == pytest.approx(50.0 / 1200.0)
    assert "ranks 0, 1, 2, 3" in result.note
    doc = within.to_json()
    assert doc["memory"]["test"]["per_rank"] == {"0": 1000.0, "1": 800.0, "2": 1000.0, "3": 1250.0}
    assert doc["memory"]["reference"]["max_rank"] == 1200.0
    assert doc["memory"]["max_rank_change_percent"] == pytest.approx(50.0 / 12.0)

    over = _compared({0: 1000.0, 1: 800.0, 2: 1000.0, 3: 1300.0}, ref, "5%")  # +8.3 %
    assert over.verdict == "fail"
    assert any("memory_max_rank" in r for r in over.reasons)
    # a drop passes a criterion that only bounds an increase (signed), fails the two-sided one
    lower = {r: v * 0.9 for r, v in ref.items()}
    assert _compared(lower, ref, "5%", absolute=False).verdict == "pass"
    assert _compared(lower, ref, "5%").verdict == "fail"


def test_a_memory_criterion_without_memory_on_a_side_fails_saying_which() -> None:
    result = _compared({0: 10.0}, None, "5%")
    assert result.verdict == "fail"
    assert "the reference log prints no memory report" in result.criteria[0].note
    assert result.to_json()["memory"]["reference"] is None


def test_the_report_shows_memory_per_rank_of_each_side(tmp_path: Path) -> None:
    from alignflow.compare.report import write_report

    comparison = _compared({0: 900.0, 1: 950.0}, {0: 1000.0, 1: 1000.0}, "10%")
    files = write_report(comparison, tmp_path, title="t", labels=("NPU", "GPU"), plots=False)
    html = files.html.read_text(encoding="utf-8")
    assert 'id="memory-table"' in html
    assert "0: 900.00, 1: 950.00" in html
    assert "950.00 (rank 1)" in html
    assert "max-rank -5.00%" in html
    assert "## Memory per rank" in files.markdown.read_text(encoding="utf-8")
    assert json.loads(files.json.read_text(encoding="utf-8"))["memory"]["test"]["max_rank"] == 950.0
