"""The two rendered sides of an experiment, exactly as the pipeline will launch them.

Preflight does not re-derive the configurations from the experiment: it takes the NPU reload training's rendered
YAML and the GPU training's argv from the same `step_command` the runner launches, so what it checks is what
runs (template, alignflow's overrides, `npu.overrides`, `gpu.extra_args`, per-step command overrides). The
environment each job gets is the host's `env` (when an inventory is given) overlaid with the command's own, as the
transport exports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from alignflow.backends.commands import megatron_layout_flags, step_command
from alignflow.config.experiment import Experiment
from alignflow.config.placement import Placement
from alignflow.errors import ConfigError
from alignflow.preflight.layout import launcher_world
from alignflow.preflight.values import DataFile

DATA_PLACEHOLDER = "{in:data}"
TWIN_GPU_MODULE = "alignflow.twin.torch_train"
SIDE_STEPS = ("npu_reload_train", "gpu_train")
"""The steps whose rendered commands preflight compares (their hosts add their env)."""


@dataclass(frozen=True, slots=True)
class DataBinding:
    """What a data path in a rendered config refers to."""

    sha256: str | None  # the experiment's data file, when its fingerprint is known before the run
    host_paths: Mapping[str, str] = field(default_factory=dict)  # role -> where the same data already lives

    def bind(self, path: str, role: str) -> DataFile:
        """`{in:data}[/prefix]` and a declared host path are the experiment's data; anything else is not."""
        if path == DATA_PLACEHOLDER or path.startswith(DATA_PLACEHOLDER + "/"):
            return DataFile(path, self.sha256, True, path[len(DATA_PLACEHOLDER):])
        declared = self.host_paths.get(role)
        if declared and (path == declared or path.startswith(declared.rstrip("/") + "/")):
            return DataFile(path, self.sha256, True, path[len(declared.rstrip("/")):])
        return DataFile(path, None, False)


@dataclass(frozen=True, slots=True)
class NpuSide:
    """The NPU training as rendered: its YAML (as a mapping) and its environment."""

    kind: Literal["mindformers", "twin"]
    config: Mapping[str, Any]
    env: Mapping[str, str]
    env_source: str
    source: str
    world: int = 1  # processes its launcher starts (msrun)
    world_source: str = "no launcher: one process"


@dataclass(frozen=True, slots=True)
class GpuSide:
    """The GPU training as rendered: the `pretrain_gpt.py` flags (launcher stripped) and its environment."""

    kind: Literal["megatron", "twin"]
    argv: tuple[str, ...]
    env: Mapping[str, str]
    env_source: str
    source: str
    megatron_version: str = "0.16"  # picks the table of flags Megatron-LM's parser accepts (megatron only)
    world: int = 1  # processes its launcher starts (torchrun)
    world_source: str = "no launcher: one process"
    extensions: tuple[str, ...] | None = None  # what the GPU host has (gpu.extensions)
    convert_argv: tuple[str, ...] | None = None  # the convert_megatron command: the checkpoint the training loads
    model: Any = None  # the experiment's ModelConfig: what megatron-core builds at the training's layout


def render_sides(
    experiment: Experiment, *, placement: Placement | None = None, data_sha256: str | None = None,
) -> tuple[NpuSide, GpuSide, DataBinding]:
    """Render the NPU reload training and the GPU training of `experiment` (no host is contacted), on their hosts
    of `placement` when given (a run's, or `place` over an inventory: `SIDE_STEPS`)."""
    sha = data_sha256 or experiment.data.sha256
    hosts = {step: placement.host(step) if placement is not None else None for step in SIDE_STEPS}
    npu_host, gpu_host = hosts["npu_reload_train"], hosts["gpu_train"]
    npu_cmd = step_command(experiment, "npu_reload_train", data_sha256=sha or "", host=npu_host)
    gpu_cmd = step_command(experiment, "gpu_train", data_sha256=sha or "", host=gpu_host)
    where = experiment.source or experiment.name
    text = npu_cmd.template.files.get("config.yaml")
    if text is None:
        raise ConfigError(f"{where}: npu_reload_train renders no config.yaml; preflight has nothing to read")
    config = yaml.safe_load(text)
    if not isinstance(config, dict):
        raise ConfigError(f"{where}: the rendered NPU config is not a mapping")
    npu_env, gpu_env = dict(npu_cmd.template.env), dict(gpu_cmd.template.env)
    npu_env_src = gpu_env_src = "command env; no hosts file given"
    if npu_host is not None and gpu_host is not None:
        npu_env, gpu_env = {**npu_host.env, **npu_env}, {**gpu_host.env, **gpu_env}
        npu_env_src, gpu_env_src = f"host {npu_host.name} + command env", f"host {gpu_host.name} + command env"
    template = experiment.npu.template if experiment.npu.kind == "mindformers" else "the twin's renderer"
    npu = NpuSide(experiment.npu.kind, config, npu_env, npu_env_src,
                  f"npu_reload_train config.yaml (from {template})", *launcher_world(npu_cmd.template.argv))
    flags = _megatron_flags(experiment, gpu_cmd.template.argv)
    ext = experiment.gpu.extensions
    override = experiment.steps.get("convert_megatron")  # what convert_megatron runs: its flags, or the override
    conv = override.command if override is not None and override.command else megatron_layout_flags(experiment)
    gpu = GpuSide(experiment.gpu.kind, flags, gpu_env, gpu_env_src, "gpu_train command line",
                  experiment.gpu.megatron_version, *launcher_world(gpu_cmd.template.argv),
                  extensions=tuple(ext) if ext is not None else None, convert_argv=tuple(conv),
                  model=experiment.model)
    return npu, gpu, DataBinding(sha, dict(experiment.data.host_paths))


def _megatron_flags(experiment: Experiment, argv: tuple[str, ...]) -> tuple[str, ...]:
    """The flags after the entry point (`pretrain_gpt.py`, or the twin's module), whatever launches it."""
    entry = experiment.gpu.entry if experiment.gpu.kind == "megatron" else TWIN_GPU_MODULE
    if entry in argv:
        return tuple(argv[argv.index(entry) + 1:])
    raise ConfigError(f"{experiment.source or experiment.name}: the gpu_train command does not run {entry} "
                      "(steps.gpu_train.command replaces it?): preflight cannot read its Megatron flags")
