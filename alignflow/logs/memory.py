"""Device-memory figures in training logs, as the frameworks print them -> `MemoryRecord`s in MiB.

- **Megatron-LM** `report_memory` (megatron/training/utils.py; `utils/common_utils.py` from core_v0.19): after the
  first iterations (and around checkpoint saves), every rank of data-parallel rank 0 prints
  `[Rank N] (after K iterations) memory (MB) | allocated: X | max allocated: X | reserved: X | max reserved: X`
  (`{}` of the float, MB = 2**20 bytes of `torch.cuda.memory_allocated()` etc.; `| device usage: X` on torch >= 2.6,
  `| total device memory used: X` with `--log-device-memory-used`; early Megatron-LM `cached` / `max cached` for
  reserved).
- **MindSpore** (MindFormers logs no memory of its own; MindSpore's Ascend memory adapter prints its pool at the
  end of a run with `GLOG_v=1` or `MS_MEMORY_STATISTIC=1`, `AscendMemAdapter::DevMemStatistics`): `Device MOC|HBM
  memory size: NM`, `MindSpore Used memory size: NM`, `Used peak memory usage (without fragments): NM` (the
  allocator's peak: taken as max allocated) and `Actual peak memory usage (with fragments): NM` (with fragmentation:
  taken as max reserved); M = 2**20 bytes (`kMBToByte`). A launcher's rank prefix (torchrun `--tee`, srun
  `--label`) names the block's rank in a merged log.
- **NeMo 2** `MemoryMonitor` (nemo/lightning/pytorch/callbacks/memory_callback.py) logs `memory/peak_allocated_mem`,
  `memory/peak_reserved_mem`, ... in GB (10**9 bytes) into the step line: columns of the parsed step frame.
- **ms-swift** logs `memory(GiB)` (`max_memory_reserved`, 2 decimals; its Megatron trainer the maximum over the
  model-parallel group): the `memory_gib` column of the step frame.

Records are pure data; statistics over ranks (per-rank peak, max-rank, avg-rank, seed 004's memory saving) are
`alignflow.compare.memory`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

MIB = 2**20
# `[Rank 3] (after 2 iterations) memory (MB) | allocated: 1.0 | max allocated: 2.0 | reserved: 3.0 | max reserved: 4.0`
_NUM = r"[\d.]+(?:e[-+]?\d+)?"  # str.format's `{}` of a float
_MEGATRON = re.compile(
    rf"\[Rank (?P<rank>\d+)\] (?P<label>.*?)\s*memory \(MB\) \| allocated: (?P<allocated>{_NUM}) \| max allocated: "
    rf"(?P<max_allocated>{_NUM}) \| (?:reserved|cached): (?P<reserved>{_NUM}) \| max (?:reserved|cached): "
    rf"(?P<max_reserved>{_NUM})"
    rf"(?: \| (?:total device memory used|device usage): (?P<device>{_NUM}))?")
# the rank a launcher put before a line: torchrun's `--tee` (`[default3]:`, or `[3]:` with alignflow's prefix
# template) and srun's `--label` (`3: `)
_PREFIX = re.compile(r"^(?:\[[A-Za-z_]*(\d+)\]:|\s*(\d+): )")
_AFTER = re.compile(r"after (\d+) iterations?|for iteration (\d+)")
_MINDSPORE = re.compile(r"(?P<what>Device (?:MOC|HBM) memory size|MindSpore Used memory size|Used peak memory usage "
                        r"\(without fragments\)|Actual peak memory usage \(with fragments\)): (?P<value>\d+)M\b")
_MS_FIELD = {"Used peak memory usage (without fragments)": "max_allocated_mb",
             "Actual peak memory usage (with fragments)": "max_reserved_mb",
             "MindSpore Used memory size": "pool_mb"}
# Step-frame columns (parsed step lines) that are memory, and how many MiB one printed unit is.
STEP_COLUMNS: dict[str, tuple[str, float]] = {
    "memory_gib": ("max_reserved_mb", 1024.0),  # ms-swift: max_memory_reserved in GiB
    "memory_peak_allocated_mem": ("max_allocated_mb", 1e9 / MIB),  # NeMo MemoryMonitor: GB
    "memory_peak_reserved_mem": ("max_reserved_mb", 1e9 / MIB),
    "memory_current_allocated_mem": ("allocated_mb", 1e9 / MIB),
    "memory_current_reserved_mem": ("reserved_mb", 1e9 / MIB),
}


@dataclass(frozen=True, slots=True)
class MemoryRecord:
    """One memory report of one rank, in MiB; a figure the framework does not print is None."""

    rank: int | None
    step: int | None  # the iteration it was taken after (None: the end of the run)
    label: str
    source: str  # megatron | mindspore | nemo | ms-swift
    line: int  # 1-based line of the log (0: from the step frame)
    allocated_mb: float | None = None
    max_allocated_mb: float | None = None
    reserved_mb: float | None = None
    max_reserved_mb: float | None = None
    pool_mb: float | None = None  # MindSpore's pool ("MindSpore Used memory size")
    device_mb: float | None = None  # the device's memory (MindSpore) or what is used of it (Megatron's option)

    def value(self, metric: str) -> float | None:
        v: Any = getattr(self, metric)
        return None if v is None else float(v)

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


def memory_lines(lines: Iterable[str], *, rank: int | None = None) -> list[MemoryRecord]:
    """The memory reports of a log (Megatron's per-rank lines, MindSpore's end-of-run statistics); `rank` is the
    log's rank where its lines do not say (MindSpore's; msrun writes one `worker_<rank>.log` per rank)."""
    out: list[MemoryRecord] = []
    ms: dict[int | None, dict[str, float]] = {}  # the open MindSpore block of each rank, and its first line
    ms_line: dict[int | None, int] = {}
    for n, text in enumerate(lines, start=1):
        if "memory (MB)" in text:
            m = _MEGATRON.search(text)
            if m is not None:
                after = _AFTER.search(m.group("label"))
                step = int(after.group(1) or after.group(2)) if after else None
                device = m.group("device")
                out.append(MemoryRecord(
                    rank=int(m.group("rank")), step=step, label=m.group("label").strip(), source="megatron", line=n,
                    allocated_mb=float(m.group("allocated")), max_allocated_mb=float(m.group("max_allocated")),
                    reserved_mb=float(m.group("reserved")), max_reserved_mb=float(m.group("max_reserved")),
                    device_mb=float(device) if device is not None else None))
                continue
        if "memory" in text and "M" in text:
            m = _MINDSPORE.search(text)
            if m is not None:
                prefix = _PREFIX.match(text)
                own = int(prefix.group(1) or prefix.group(2)) if prefix else rank
                what, value = m.group("what"), float(m.group("value"))
                block = ms.setdefault(own, {})
                if what.startswith("Device") and block:  # a new block starts: close the previous one
                    out.append(_mindspore_record(block, own, ms_line[own]))
                    block = ms[own] = {}
                if not block:
                    ms_line[own] = n
                block["device_mb" if what.startswith("Device") else _MS_FIELD[what]] = value
    for own, block in ms.items():
        if block:
            out.append(_mindspore_record(block, own, ms_line[own]))
    return out


def _mindspore_record(fields: dict[str, float], rank: int | None, line: int) -> MemoryRecord:
    return MemoryRecord(rank=rank, step=None, label="end of run (MindSpore memory statistics)", source="mindspore",
                        line=line, **fields)


def memory_from_steps(frame: Any, *, rank: int | None, source: str) -> list[MemoryRecord]:
    """Memory columns of a parsed step frame (NeMo's MemoryMonitor, ms-swift's `memory(GiB)`), one record per step
    that prints one."""
    present = [c for c in STEP_COLUMNS if c in frame.columns]
    out = []
    for step, row in frame[present].iterrows() if present else ():
        fields: dict[str, float] = {}
        for column in present:
            value = row[column]
            if value == value:  # not NaN: this step printed it
                name, factor = STEP_COLUMNS[column]
                fields[name] = float(value) * factor
        if fields:
            out.append(MemoryRecord(rank=rank, step=int(step), label=f"step {int(step)}", source=source, line=0,
                                    **fields))
    return out
