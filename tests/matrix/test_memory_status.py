"""Per-rank memory and run status from the frameworks' own lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from alignflow.matrix.memory import parse_memory
from alignflow.matrix.status import classify, oom_line
from alignflow.twin.logformats import megatron_memory_line
from alignflow.twin.memory import (
    mindspore_memory_statistic,
    mindspore_oom_message,
    torch_oom_message,
    twin_memory,
)
from alignflow.twin.presets import TwinSpec, twin_spec


def test_a_real_megatron_log_gives_rank_0_last_report(repo_root: Path) -> None:
    lines = (repo_root / "tests" / "data" / "logs" / "megatron_core_v0.19_h200.log").read_text().splitlines()
    report = parse_memory(lines)
    (rank,) = report.ranks.values()
    # the last of the three reports (after 1, 2 and 3 iterations): a peak never decreases
    assert (rank.rank, rank.iteration, rank.allocated_mb, rank.max_allocated_mb) == (0, 3, 78.41, 86.38)
    assert (rank.reserved_mb, rank.max_reserved_mb) == (104.0, 104.0)
    assert report.max_rank_gib == pytest.approx(86.38 / 1024)


def test_max_rank_and_avg_rank_follow_seed_004() -> None:
    lines = [
        "[0]:[Rank 0] (after 1 iterations) memory (MB) | allocated: 100.0 | max allocated: 729.5 | reserved: 800 | "
        "max reserved: 800",
        "[1]:[Rank 1] (after 1 iterations) memory (MB) | allocated: 100.0 | max allocated: 702.9 | reserved: 800 | "
        "max reserved: 800",
        # megatron before 0.17 printed Python's float repr and `cached`
        "[Rank 2] (after 1 iterations) memory (MB) | allocated: 100.0 | max allocated: 690.1234567 | cached: 800.0 "
        "| max cached: 812.0",
    ]
    report = parse_memory(lines)
    assert sorted(report.ranks) == [0, 1, 2]
    assert report.max_rank_gib == pytest.approx(729.5 / 1024)
    assert report.avg_rank_gib == pytest.approx((729.5 + 702.9 + 690.1234567) / 3 / 1024)
    assert report.ranks[2].max_reserved_mb == 812.0


def test_mindspore_statistics_are_the_rank_of_their_log_or_prefix() -> None:
    block = ["Device HBM memory size: 62432M", "MindSpore Used memory size: 59392M",
             "MindSpore memory base address: 0", "Used peak memory usage (without fragments): 48874M",
             "Actual peak memory usage (with fragments): 48900M"]
    own = parse_memory(block, rank=3)
    assert list(own.ranks) == [3]
    assert (own.ranks[3].max_allocated_mb, own.ranks[3].max_reserved_mb, own.ranks[3].source) == (48874, 48900,
                                                                                                  "mindspore")
    prefixed = parse_memory([f"[5]:{line}" for line in block])
    assert list(prefixed.ranks) == [5]
    assert parse_memory(["no memory here"]).empty


@pytest.fixture
def spec(repo_root: Path) -> TwinSpec:
    """The demo matrix's twin (read from the experiment: the packaged presets' loader imports torch)."""
    from alignflow.config import load_experiment

    return twin_spec(load_experiment(repo_root / "experiments" / "demo-matrix.yaml").model)


def test_the_twins_lines_read_back_as_their_model(spec: TwinSpec) -> None:
    m = twin_memory(spec, micro_batch_size=2)
    mib = 2**20
    line = megatron_memory_line(0, 1, allocated=m.static / mib, max_allocated=m.peak / mib,
                                reserved=m.reserved / mib, max_reserved=m.reserved / mib)
    assert parse_memory([line]).ranks[0].max_allocated_mb == pytest.approx(m.peak / mib)
    stats = parse_memory(mindspore_memory_statistic(m, max_device_memory_mb=59392))
    assert stats.ranks[0].max_allocated_mb >= m.peak / 2**20


def test_the_memory_model_has_the_switches_sign(spec: TwinSpec) -> None:
    base = twin_memory(spec, micro_batch_size=4)
    assert twin_memory(spec, micro_batch_size=4, recompute_num_layers=1).peak < base.peak
    assert twin_memory(spec, micro_batch_size=4, fused_swiglu=True).peak < base.peak
    assert twin_memory(spec, micro_batch_size=2).peak < base.peak
    assert twin_memory(spec, micro_batch_size=2).static == base.static


# The frameworks' own out-of-memory messages (alignflow.matrix.status cites where each comes from).
OOMS = [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.19 "
    "GiB of which 2.06 MiB is free.",
    "RuntimeError: CUDA out of memory. Tried to allocate 384.00 MiB (GPU 0; 14.76 GiB total capacity; 11.04 GiB "
    "already allocated; 259.75 MiB free; 11.10 GiB reserved in total by PyTorch)",
    "RuntimeError: NPU out of memory. Tried to allocate 22.00 MiB (NPU 0; 60.97 GiB total capacity; 10.24 GiB "
    "already allocated; 10.24 GiB current active; 19.52 MiB free; 10.65 GiB reserved in total by PyTorch)",
    "Out of Memory!!! Request memory size: 33100113920B, Memory Statistic:",
    "[ERROR] ... Device(id:0) memory isn't enough and alloc failed, kernel name: Default/MatMul-op1, alloc size: "
    "1048576B.",
    "[ERROR] PRE_ACT(145615,fffbdf67f120,python):2025-01-12-09:48:13.703.514 [mindspore/ccsrc/backend/common/"
    "mem_reuse/mem_dynamic_allocator.cc:392] AddMemBlockAndMemBufByEagerFree] TotalUsedMemStatistics : 24725382656 "
    "plus TotalUsedByEventMemStatistics : 0 and plus alloc size : 100555779072 is more than total mem size : "
    "61079552000.",
    "Memory_Allocation_Failure(EL0004): Failed to allocate memory requested by GE module.",
]


@pytest.mark.parametrize("text", OOMS)
def test_each_frameworks_oom_is_recognised(text: str) -> None:
    status = classify(step_status="failed", exit_code=1, error="cuda: step gpu_train exited(1)",
                      texts=["Traceback (most recent call last):", text])
    assert status.status == "oom"
    assert oom_line([text]) is not None


def test_the_twins_oom_messages_are_the_frameworks() -> None:
    assert oom_line([torch_oom_message(1 << 20, capacity=10 << 20, allocated=9 << 20)]) is not None
    assert oom_line([mindspore_oom_message(1 << 20, max_device_memory=10 << 20, used=9 << 20)]) is not None


def test_other_ends_are_failed_unknown_or_not_run() -> None:
    assert classify(step_status="ran", exit_code=0).status == "completed"
    cached = classify(step_status="cached", exit_code=None)
    assert (cached.status, cached.reused, cached.exit_code) == ("completed", True, 0)
    failed = classify(step_status="failed", exit_code=1, error="ascend: step npu_reload_train exited(1): "
                      "ValueError: bad", texts=["a memory word but no OOM"])
    assert (failed.status, failed.exit_code) == ("failed", 1)
    lost = classify(step_status="failed", exit_code=None, error="cuda: step gpu_train lost; job dir /x")
    assert (lost.status, lost.exit_code) == ("exit code unknown", None)
    never = classify(step_status=None, exit_code=None, error="gpu layout needs 2 devices")
    assert never.status == "not run"
    assert "gpu layout" in never.reason


def test_a_real_torch_oom_line_is_kept_whole_and_a_long_reason_is_cut_between_words() -> None:
    # issue 47: the reasons were cut at 300 characters, mid-path ("…/cuda.html#environment-vari")
    line = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
            "79.10 GiB of which 1.06 MiB is free. Process 12345 has 79.09 GiB memory in use. Of the allocated memory "
            "78.00 GiB is allocated by PyTorch, and 300.00 MiB is reserved by PyTorch but unallocated. If reserved "
            "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
            "fragmentation.  See documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
    status = classify(step_status="failed", exit_code=1, error="cuda: step gpu_train exited(1)", texts=[line])
    assert status.reason is not None
    assert "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)" in status.reason
    path = "/home/you/alignflow/.alignflow/hosts/cuda/jobs/0123456789ab/gpu_train/stderr.log"
    failed = classify(step_status="failed", exit_code=1, error=f"cuda: step gpu_train exited(1): {'x ' * 130}{path}")
    assert failed.reason is not None
    assert len(failed.reason) <= 300
    assert failed.reason.endswith(" …")
    assert "/home/you" not in failed.reason  # the path whole or not at all, never a piece of it
