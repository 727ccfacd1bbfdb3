"""Backends render one training of one side into a host-independent command template.

The same step code drives the reference twin and the real frameworks: a backend only decides the argv, the
config files, the environment, where the log lands and which log format it has. Locations are placeholders
(`{python}`, `{out}`, `{in:<artifact>}`) filled in by the runner once the host is known, so that a cache key
computed from the template does not depend on where files happen to live.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from alignflow.config.experiment import Experiment

Side = Literal["npu", "gpu"]
LogFormat = Literal["mindformers", "megatron"]


@dataclass(frozen=True, slots=True)
class TrainSpec:
    """What one training must do; paths are placeholders."""

    step: str
    side: Side
    steps: int
    data: str  # e.g. "{in:data}"
    data_sha256: str
    load: str | None  # e.g. "{in:bf16_ckpt}"; None = random initialisation (the NPU base training)
    save: str | None  # e.g. "{out}/checkpoint"; None = do not save


@dataclass(frozen=True, slots=True)
class CommandTemplate:
    """A rendered training command, before host paths are filled in."""

    argv: tuple[str, ...]
    log_format: LogFormat
    code_version: str
    files: dict[str, str] = field(default_factory=dict)  # path relative to {out} -> text
    env: dict[str, str] = field(default_factory=dict)
    log: str = "stdout"  # "stdout" or a path relative to {out}
    checkpoint: str | None = None  # path relative to {out} of the checkpoint the training saves
    required_lines: tuple[str, ...] = ()  # substrings a valid log contains (e.g. a successful load)
    code_repo: str | None = None  # host repo (hosts.yaml `repos`) whose commit versions this command


def render_training(experiment: Experiment, spec: TrainSpec) -> CommandTemplate:
    """Dispatch to the side's backend."""
    if spec.side == "npu":
        if experiment.npu.kind == "reference":
            from alignflow.backends.reference import npu_command

            return npu_command(experiment, spec)
        from alignflow.backends.mindformers import npu_command as mf_command

        return mf_command(experiment, spec)
    if experiment.gpu.kind == "reference":
        from alignflow.backends.reference import gpu_command

        return gpu_command(experiment, spec)
    from alignflow.backends.megatron import gpu_command as mg_command

    return mg_command(experiment, spec)
