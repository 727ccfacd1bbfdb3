"""Host snapshots: the software state that explains precision differences, recorded with every run.

Precision gaps between an NPU run and a GPU run are very often explained by the host: framework versions,
a dirty checkout, a driver, a determinism variable that was not set (docs/orchestration.md#host-snapshots).
The snapshot is taken by `snapshot_probe.py` running on the host with the same env and setup lines as the
step's commands, so it sees what the step sees.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, PlainSerializer

from alignflow.transport.files import Files, module_source

# Distributions whose versions matter for alignment (importlib.metadata names).
PACKAGES: tuple[str, ...] = (
    "mindspore",
    "mindformers",
    "torch",
    "megatron-core",
    "transformer-engine",
    "transformer_engine",
    "numpy",
    "safetensors",
    "alignflow",
)

# Environment variables recorded besides the host's declared `env`: the families that change numerics or
# determinism on Ascend (HCCL/LCCL/MS/ASCEND) and CUDA (NCCL/CUBLAS/CUDA/NVTE/TORCH).
ENV_PREFIXES: tuple[str, ...] = (
    "HCCL_",
    "LCCL_",
    "MS_",
    "ASCEND_",
    "CUSTOM_MATMUL",
    "NCCL_",
    "CUBLAS_",
    "CUDA_",
    "NVTE_",
    "TORCH_",
    "PYTORCH_",
    "OMP_NUM_THREADS",
)


def _aware(taken: datetime) -> datetime:
    """A time recorded without a zone was taken in UTC (every snapshot's clock is)."""
    return taken if taken.tzinfo else taken.replace(tzinfo=UTC)


class HostSnapshot(BaseModel):
    """One host's software state at one moment: `model_dump(mode="json")` is what a run records of it (the store's
    snapshot data), `model_validate` reads that back; `from_probe` reads the host's probe."""

    model_config = ConfigDict(frozen=True, extra="ignore")  # a newer probe's keys are not an error

    host: str
    taken_at: Annotated[datetime, AfterValidator(_aware), PlainSerializer(datetime.isoformat, when_used="json")]
    hostname: str | None = None
    os: str | None = None
    python: dict[str, JsonValue] = Field(default_factory=dict)
    packages: dict[str, str | None] = Field(default_factory=dict)
    repos: dict[str, dict[str, JsonValue]] = Field(default_factory=dict)
    accelerators: dict[str, dict[str, JsonValue]] = Field(default_factory=dict)
    tools: dict[str, str | None] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    declared_env_missing: tuple[str, ...] = ()
    error: str | None = None  # set when the probe itself could not run (e.g. the host's python is missing)
    load: tuple[float, ...] | None = None  # 1/5/15-minute load averages when taken (the report's timing conditions)
    cpus: int | None = None

    @classmethod
    def from_probe(cls, host: str, taken_at: datetime, probe: Mapping[str, JsonValue]) -> HostSnapshot:
        return cls.model_validate({**probe, "host": host, "taken_at": taken_at})

    def summary(self) -> str:
        """One line for `alignflow hosts check`: python, installed frameworks, accelerators, dirty repos."""
        if self.error:
            return f"snapshot failed: {self.error}"
        parts = [f"python {self.python.get('version', '?')}"]
        parts += [f"{k} {v}" for k, v in self.packages.items() if v and k != "alignflow"]
        for name, acc in self.accelerators.items():
            if acc.get("present"):
                out = str(acc.get("output") or acc.get("error") or "").strip().splitlines()
                parts.append(f"{name}: {out[0][:60] if out else 'present'}")
        for name, repo in self.repos.items():
            if repo.get("commit"):
                parts.append(f"{name}@{str(repo['commit'])[:10]}{'+dirty' if repo.get('dirty') else ''}")
            else:
                parts.append(f"{name}: {repo.get('error')}")
        return ", ".join(parts)


def take_snapshot(files: Files) -> HostSnapshot:
    """Python, framework versions, declared repos' commit + dirty flag, accelerators, env (issue 3, item 5).

    The probe runs with the step commands' env and setup lines, so it sees what they see; a probe that cannot
    run is recorded as the snapshot's `error`, never raised (a snapshot explains, it does not gate).
    """
    from alignflow.transport import snapshot_probe

    host = files.host
    request = {"packages": list(PACKAGES), "repos": dict(host.repos), "env_names": sorted(host.env),
               "env_prefixes": list(ENV_PREFIXES)}
    taken_at = datetime.now(UTC)
    done = files.run([files.python(), "-", json.dumps(request)], check=False,
                     input=module_source(snapshot_probe.__file__), timeout_s=120)
    if done.exit_code != 0:
        tail = done.stderr.strip().splitlines()[-3:]
        return HostSnapshot(host=host.name, taken_at=taken_at,
                            error=f"{files.python()} exited {done.exit_code}: " + " | ".join(tail))
    try:
        return HostSnapshot.from_probe(host.name, taken_at, json.loads(done.stdout))
    except (ValueError, KeyError, TypeError) as exc:  # a ValidationError is a ValueError
        return HostSnapshot(host=host.name, taken_at=taken_at, error=f"unreadable probe output: {exc}")
