"""Memory lines as the frameworks print them -> per-rank records in MiB (alignflow.logs.memory).

The Megatron lines are a real Megatron-LM core_v0.19.1 run's (tests/data/logs/megatron_core_v0.19_h200.log, H200);
the MindSpore block is `AscendMemAdapter::DevMemStatistics`' format with MindFormers' documented figures; NeMo's
and ms-swift's fields come through the step parser.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from alignflow.logs import parse_log
from alignflow.logs.memory import MIB, memory_from_steps, memory_lines


def test_megatron_report_memory_lines_of_a_real_run(repo_root: Path) -> None:
    lines = (repo_root / "tests/data/logs/megatron_core_v0.19_h200.log").read_text().splitlines()
    recs = memory_lines(lines)
    assert [(r.rank, r.step) for r in recs] == [(0, 1), (0, 2), (0, 3)]
    first = recs[0]
    assert first.source == "megatron"
    assert first.label == "(after 1 iterations)"
    assert (first.allocated_mb, first.max_allocated_mb, first.reserved_mb, first.max_reserved_mb) == (
        78.41, 81.96, 100.0, 100.0)
    assert recs[1].max_allocated_mb == 86.37
    assert lines[first.line - 1].startswith("[Rank 0] (after 1 iterations) memory (MB)")
    # "Theoretical memory footprints: ... MB" and "Activation memory footprint" are estimates, not reports
    assert all("Theoretical" not in lines[r.line - 1] for r in recs)


def test_ranks_torchrun_prefixes_saves_and_the_device_field() -> None:
    lines = [
        "[default3]:[Rank 3] (after 10 iterations) memory (MB) | allocated: 1.5 | max allocated: 2.25 | reserved: 4.0 "
        "| max reserved: 8.0 | total device memory used: 100.00",
        "[1]:[Rank 1] (before save_checkpoint for iteration 30) memory (MB) | allocated: 1.0 | max allocated: 3.0 | "
        "reserved: 4.0 | max reserved: 4.0",
        "[Rank 2] (after 1 iterations) memory (MB) | allocated: 1.0 |",  # cut: not a report
    ]
    recs = memory_lines(lines)
    assert [(r.rank, r.step, r.max_allocated_mb, r.device_mb) for r in recs] == [(3, 10, 2.25, 100.0),
                                                                                   (1, 30, 3.0, None)]
    assert recs[1].label == "(before save_checkpoint for iteration 30)"


def test_mindspore_end_of_run_statistics_take_the_logs_rank() -> None:
    lines = ["[INFO] DEVICE(123,ffff,python):2026-01-01-00:00:00.000.000 [mem_adapter.cc:99] Device MOC memory size: "
             "65536M", "MindSpore Used memory size: 59392M", "MindSpore memory base address: 0xffffe9dc1407",
             "Used peak memory usage (without fragments): 23716M", "Actual peak memory usage (with fragments): 26244M",
             "step 1 loss 2.0"]
    (rec,) = memory_lines(lines, rank=5)
    assert rec.rank == 5
    assert rec.source == "mindspore"
    assert (rec.max_allocated_mb, rec.max_reserved_mb, rec.pool_mb, rec.device_mb) == (23716, 26244, 59392, 65536)
    assert rec.line == 1
    two = memory_lines([*lines[:5], "Device HBM memory size: 62432M",
                        "Used peak memory usage (without fragments): 48874M"])  # two runs in one log: two records
    assert [r.max_allocated_mb for r in two] == [23716, 48874]


def test_nemo_and_ms_swift_memory_fields_of_the_step_lines() -> None:
    nemo = parse_log(["Training epoch 0, iteration 0/9 | lr: 1e-05 | global_step: 0 | reduced_train_loss: 11.03 | "
                      "memory/peak_allocated_mem: 12.35 | memory/peak_reserved_mem: 14.5",
                      "Training epoch 0, iteration 1/9 | lr: 1e-05 | global_step: 1 | reduced_train_loss: 10.9"])
    recs = memory_from_steps(nemo.frame, rank=0, source="nemo")
    assert len(recs) == 1  # the second line printed no memory
    assert recs[0].step == 1
    assert recs[0].max_allocated_mb == pytest.approx(12.35e9 / MIB)
    assert recs[0].max_reserved_mb == pytest.approx(14.5e9 / MIB)
    swift = parse_log(["[2026-01-01 00:00:00.000000] iteration        1/      10 | consumed samples:            4 | "
                       "elapsed time per iteration (ms): 1.0 | learning rate: 1.000000E-03 | global batch size:     4 "
                       "| lm loss: 6.791943E+00 | memory(GiB): 17.13 | loss scale: 1.0 | grad norm: 2.239 | number "
                       "of skipped iterations:   0 | number of nan iterations:   0 |"])
    (rec,) = memory_from_steps(swift.frame, rank=None, source="ms-swift")
    assert rec.max_reserved_mb == pytest.approx(17.13 * 1024)
    assert rec.max_allocated_mb is None
