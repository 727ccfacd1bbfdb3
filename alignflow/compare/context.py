"""What a report knows of the run beyond the logs: plain data the caller passes in (the compare step builds it from
the run's record; `alignflow compare` on two files has none of it and the report leaves those sections out).

Plain values only, so the comparison package never reads the store: `alignflow.runview.report_context(view)`
turns a recorded run into one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# Snapshot keys that change between any two snapshots and explain nothing (when, how long).
VOLATILE_SNAPSHOT_KEYS = ("taken_at", "latency_ms", "uptime", "duration_s", "load", "memory_free")
# A host whose 1-minute load average reaches its CPU count has more runnable processes than cores: a training there
# shares them, and its step time measures the sharing as much as the framework.
LOADED_PER_CPU = 1.0
# Two timings whose shares of time spent beside other steps on their machine differ by more than this are unlike.
SHARED_TOLERANCE = 0.1


@dataclass(frozen=True, slots=True)
class StepRow:
    """One step of the run as the report shows it."""

    step: str
    status: str
    host: str | None = None
    duration_s: float | None = None
    exit_code: int | None = None
    note: str = ""  # the error of a failed step, where a cached step's outputs come from


@dataclass(frozen=True, slots=True)
class FingerprintRow:
    """One input or output of the run with its sha256."""

    name: str
    sha256: str
    size_bytes: int | None = None
    where: str = ""  # host:path
    step: str = ""  # the step that produced it ("" for a run input such as the data file)


@dataclass(frozen=True, slots=True)
class TimingConditions:
    """Under what one side's step times were measured, as the run's records tell it (None: not recorded)."""

    device: str | None = None  # what the host reports: "NVIDIA H100 80GB HBM3 x8", "CPU (no npu-smi, no nvidia-smi)"
    machine: str | None = None  # the host's hostname: two hosts of hosts.yaml may be one machine
    measured_in: str | None = None  # the run whose training wrote the log
    cached: bool = False  # the training was reused from `measured_in`, an earlier run: timed then, not now
    beside: tuple[str, ...] = ()  # steps of that run that ran on the same machine at the same time
    shared: float | None = None  # the share of the training's time during which one of them ran (0..1)
    load_1m: float | None = None  # the host's 1-minute load average when that run started
    cpus: int | None = None

    @property
    def load_per_cpu(self) -> float | None:
        return self.load_1m / self.cpus if self.load_1m is not None and self.cpus else None

    @property
    def loaded(self) -> bool | None:
        """The host was busier than its cores when the run started (None: the load was not recorded)."""
        per_cpu = self.load_per_cpu
        return None if per_cpu is None else per_cpu >= LOADED_PER_CPU

    def describe(self) -> str:
        """`CPU (no npu-smi, no nvidia-smi) on vm; measured in run 5622de9be3ae (cached); beside gpu_train; ...`."""
        parts = [f"{self.device or 'device not recorded'}" + (f" on {self.machine}" if self.machine else "")]
        if self.measured_in:
            parts.append(f"timed in run {self.measured_in}" + (" (cached: an earlier run)" if self.cached else ""))
        if self.beside:
            share = f" for {self.shared * 100:.0f}% of its time" if self.shared is not None else ""
            parts.append(f"beside {', '.join(self.beside)} on the same machine{share}")
        else:
            parts.append("alone on its machine among the run's steps")
        if self.load_1m is not None:
            parts.append(f"load {self.load_1m:.2f} on {self.cpus or '?'} CPU(s) when the run started"
                         + (" (loaded)" if self.loaded else ""))
        return "; ".join(parts)

    def to_json(self) -> dict[str, object]:
        return {"device": self.device, "machine": self.machine, "measured_in": self.measured_in,
                "cached": self.cached, "beside": list(self.beside), "shared": self.shared, "load_1m": self.load_1m,
                "cpus": self.cpus,
                "loaded": self.loaded, "text": self.describe()}


@dataclass(frozen=True, slots=True)
class ReportContext:
    """The run around a comparison: id, experiment, steps, fingerprints, both sides' host snapshots."""

    run_id: str | None = None
    experiment: str | None = None
    description: str | None = None
    generated_at: datetime | None = None
    steps: tuple[StepRow, ...] = ()
    fingerprints: tuple[FingerprintRow, ...] = ()
    snapshots: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # side label -> a HostSnapshot as JSON
    timing: Mapping[str, TimingConditions] = field(default_factory=dict)  # side label -> how its step times were taken


def flatten(data: Any, prefix: str = "") -> dict[str, str]:
    """`{"packages": {"torch": "2.6"}}` -> `{"packages.torch": "2.6"}`; lists joined with commas."""
    out: dict[str, str] = {}
    if isinstance(data, Mapping):
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(data, list | tuple):
        out[prefix] = ",".join(str(x) for x in data)
    else:
        out[prefix] = "" if data is None else str(data)
    return out


@dataclass(frozen=True, slots=True)
class EnvRow:
    """One snapshot setting across the sides (`values` in the order of the sides)."""

    key: str
    values: tuple[str, ...]

    @property
    def differs(self) -> bool:
        return len(set(self.values)) > 1


SECTION_ORDER = ("packages", "repos", "env", "declared_env_missing", "python", "accelerators", "tools", "os",
                 "hostname", "error")


def environment_rows(snapshots: Mapping[str, Mapping[str, Any]]) -> list[EnvRow]:
    """Every setting of the sides' snapshots, in section order (packages, repos, env, ...); missing = `—`. The host
    name itself heads each side's column, so it is no row."""
    flat = {side: flatten({k: v for k, v in snap.items() if k not in (*VOLATILE_SNAPSHOT_KEYS, "host")})
            for side, snap in snapshots.items()}
    keys = sorted({k for f in flat.values() for k in f if not k.endswith(VOLATILE_SNAPSHOT_KEYS)},
                  key=lambda k: (_section_rank(k), k))
    return [EnvRow(k, tuple(f.get(k, "—") for f in flat.values())) for k in keys]


def _section_rank(key: str) -> int:
    head = key.split(".", 1)[0]
    return SECTION_ORDER.index(head) if head in SECTION_ORDER else len(SECTION_ORDER)
