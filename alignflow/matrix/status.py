"""How one training of a matrix ended: completed, out of memory, failed, or with an unknown exit code.

Seed 004 reports every run's status beside its numbers: runs that completed and exited 0, capacity probes that ran
out of device memory (their OOM logs kept), and a run whose log reached its last step but whose exit code was
never recorded (the container was replaced) — its numbers are used, its exit is not called normal (section 6.4).

Out-of-memory is recognised from the frameworks' own messages, on either side:

| framework | message | where it comes from |
|---|---|---|
| PyTorch (CUDA) | `CUDA out of memory. Tried to allocate ...` (`torch.OutOfMemoryError`) | CUDACachingAllocator.cpp |
| PyTorch (Ascend: torch_npu, MindSpeed) | `NPU out of memory. Tried to allocate ...` | torch_npu's allocator |
| PyTorch (CPU) | `DefaultCPUAllocator: can't allocate memory` | c10/core/impl/alloc_cpu.cpp |
| CUDA runtime | `CUDA error: out of memory` | cudaErrorMemoryAllocation |
| MindSpore (Ascend) | `Out of Memory!!! Request memory size: ...B, Memory Statistic:` | ascend_memory_adapter.cc |
| MindSpore (any device) | `Device(id:N) memory isn't enough and alloc failed, kernel name: ...` | runtime actors |
| MindSpore (memory pool) | `... plus alloc size : N is more than total mem size : N.` | mem_dynamic_allocator.cc |
| CANN | `Memory_Allocation_Failure(EL0004)` | Ascend runtime error codes |

torch raised `torch.OutOfMemoryError` from 2.5, `torch.cuda.OutOfMemoryError` before, a `RuntimeError` before 1.13:
the message is the same.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Status = Literal["completed", "oom", "failed", "exit code unknown", "not run"]

OOM_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("PyTorch CUDA caching allocator", re.compile(r"CUDA out of memory\. Tried to allocate")),
    ("torch_npu caching allocator", re.compile(r"NPU out of memory\. Tried to allocate")),
    ("torch.OutOfMemoryError", re.compile(r"\b(?:torch\.(?:cuda\.)?)?OutOfMemoryError\b")),
    ("PyTorch CPU allocator", re.compile(r"DefaultCPUAllocator: can't allocate memory")),
    ("CUDA runtime", re.compile(r"CUDA error: out of memory")),
    ("MindSpore Ascend allocator", re.compile(r"Out of Memory!!! Request memory size")),
    ("MindSpore runtime", re.compile(r"memory isn't enough and alloc failed|Memory not enough:")),
    ("MindSpore memory pool", re.compile(r"is more than total mem size")),
    ("CANN runtime", re.compile(r"Memory_Allocation_Failure\(EL0004\)")),
)


@dataclass(frozen=True, slots=True)
class TrainingStatus:
    """A training's end: its status, exit code, the line that says why, and where that line came from."""

    status: Status
    exit_code: int | None = None
    reason: str = ""
    step_run_id: str | None = None
    reused: bool = False  # the step reused an earlier training (cached): completed, not run again

    @property
    def completed(self) -> bool:
        return self.status == "completed"

    def to_json(self) -> dict[str, object]:
        return {"status": self.status, "exit_code": self.exit_code, "reason": self.reason,
                "step_run_id": self.step_run_id, "reused": self.reused}


REASON_CHARS = 300  # a reason's length in the matrix's tables
OOM_CHARS = 1000  # an out-of-memory line whole: torch's is ~520 characters with its documentation URL


def clip(text: str, limit: int = REASON_CHARS) -> str:
    """`text` in at most `limit` characters, cut between words (then " …"), never inside a path or URL (issue 47:
    OOM messages cut mid-path)."""
    if len(text) <= limit:
        return text
    head = text[:limit - 2]
    cut = head.rfind(" ")
    return (head[:cut] if cut > 0 else head).rstrip() + " …"


def oom_line(texts: Iterable[str]) -> tuple[str, str] | None:
    """The first out-of-memory line in `texts` and the allocator that printed it, or None."""
    for text in texts:
        for line in text.splitlines():
            for who, pattern in OOM_PATTERNS:
                if pattern.search(line):
                    return who, clip(line.strip(), OOM_CHARS)
    return None


def classify(*, step_status: str | None, exit_code: int | None, error: str | None = None,
             texts: Iterable[str] = (), step_run_id: str | None = None) -> TrainingStatus:
    """The status of one training from its step record (status `ran` / `cached` / `failed` / ..., exit code, error)
    and the text it left (its stderr and stdout tails, its log)."""
    if step_status is None:
        why = clip((error or "").strip().splitlines()[0]) if error else "an earlier step failed"
        return TrainingStatus("not run", reason=f"never started: {why}", step_run_id=step_run_id)
    if step_status == "cancelled":
        return TrainingStatus("failed", exit_code, f"cancelled: {clip((error or '').strip())}",
                              step_run_id=step_run_id)
    if step_status in ("ran", "cached"):
        return TrainingStatus("completed", exit_code if exit_code is not None else 0, step_run_id=step_run_id,
                              reused=step_status == "cached")
    if step_status in ("running", "pending"):
        return TrainingStatus("exit code unknown", None, "still running when the matrix was compared",
                              step_run_id=step_run_id)
    found = oom_line([error or "", *texts])
    if found is not None:
        return TrainingStatus("oom", exit_code, f"{found[1]} ({found[0]})", step_run_id=step_run_id)
    why = clip((error or "").strip().splitlines()[0]) if error else step_status
    if exit_code is None:
        # the process is gone without an exit-code file (a lost job, a replaced container): whatever its log says,
        # its exit is not known to be normal (docs/seeds.md#switch-matrix)
        return TrainingStatus("exit code unknown", None, why, step_run_id=step_run_id)
    return TrainingStatus("failed", exit_code, why, step_run_id=step_run_id)
