"""What each pipeline step runs, as a host-independent template, and where its outputs land under `{out}`."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from alignflow.backends import CommandTemplate, TrainSpec, render_training
from alignflow.config.experiment import Experiment
from alignflow.errors import ConfigError, PipelineError
from alignflow.runner.cache import code_version_for

# Default wall-clock limits; `steps.<name>.timeout_s` in the experiment overrides them.
DEFAULT_TIMEOUT_S = {
    "npu_base_train": 24 * 3600.0,
    "convert_bf16": 4 * 3600.0,
    "convert_megatron": 4 * 3600.0,
    "gpu_train": 24 * 3600.0,
    "npu_reload_train": 24 * 3600.0,
    "early_gate": 2 * 3600.0,
}


@dataclass(frozen=True, slots=True)
class StepCommand:
    """A step's template plus its declared outputs (artifact name -> path relative to `{out}`)."""

    template: CommandTemplate
    outputs: dict[str, str]
    expect_steps: int | None = None  # a training log must hold exactly these steps
    log_source: str | None = None  # metrics label ("npu_base", "gpu", "npu")


def step_command(experiment: Experiment, step: str, *, data_sha256: str) -> StepCommand:
    """The command of one step of `experiment` (trainings through their backend, conversions through the CLI)."""
    training = experiment.training
    override = experiment.steps.get(step)
    data = data_placeholder(experiment)
    if step == "npu_base_train":
        spec = TrainSpec(step, "npu", training.base_steps, data, data_sha256, None, "{out}/checkpoint")
        cmd = StepCommand(render_training(experiment, spec), {"base_ckpt": "checkpoint", "npu_base_log": "train.log"},
                          expect_steps=training.base_steps, log_source="npu_base")
    elif step == "npu_reload_train":
        spec = TrainSpec(step, "npu", training.steps, data, data_sha256, "{in:bf16_ckpt}", None)
        cmd = StepCommand(render_training(experiment, spec), {"npu_log": "train.log"},
                          expect_steps=training.steps, log_source="npu")
    elif step == "gpu_train":
        spec = TrainSpec(step, "gpu", training.steps, data, data_sha256, "{in:megatron_ckpt}", None)
        cmd = StepCommand(render_training(experiment, spec), {"gpu_log": "train.log"},
                          expect_steps=training.steps, log_source="gpu")
    elif step == "convert_bf16":
        template = CommandTemplate(
            argv=("{python}", "-m", "alignflow", "convert", "bf16", "{in:base_ckpt}", "{out}/bf16", "--json"),
            log_format="megatron",
            code_version=code_version_for(("convert",)),
        )
        cmd = StepCommand(template, {"bf16_ckpt": "bf16"})
    elif step == "convert_megatron":
        conv = experiment.conversion
        flavor = "te" if experiment.gpu.transformer_impl == "transformer_engine" else "local"
        files = {"model.json": json.dumps(experiment.model.model_dump(mode="json"), sort_keys=True, indent=1)}
        spec_arg = conv.spec
        if conv.spec.endswith((".yaml", ".yml")):
            # A spec file of the experiment's own travels with the command (the CPU host may be another machine),
            # and its text is part of the cache key: editing the spec re-runs the conversion and what follows.
            spec_path = experiment.resolve_path(conv.spec)
            if not spec_path.is_file():
                raise ConfigError(f"{experiment.source}: conversion.spec {conv.spec} not found ({spec_path})")
            files["spec.yaml"] = spec_path.read_text(encoding="utf-8")
            spec_arg = "{out}/spec.yaml"
        template = CommandTemplate(
            argv=("{python}", "-m", "alignflow", "convert", "megatron", "{in:bf16_ckpt}", "{out}/megatron",
                  "--spec", spec_arg, "--flavor", flavor, "--megatron-version", experiment.gpu.megatron_version,
                  "--iteration", str(conv.iteration), "--model", "{out}/model.json", "--json"),
            log_format="megatron",
            code_version=code_version_for(("convert",)),
            files=files,
        )
        cmd = StepCommand(template, {"megatron_ckpt": "megatron"})
    else:
        raise PipelineError(f"step '{step}' has no command (it runs on the controller)")
    if override is not None and override.command is not None:
        cmd = replace(cmd, template=replace(cmd.template, argv=tuple(override.command)))
    if override is not None and override.env:
        cmd = replace(cmd, template=replace(cmd.template, env={**cmd.template.env, **override.env}))
    return cmd


def data_placeholder(experiment: Experiment) -> str:
    """What the trainings are given as their data path: the file, or `<dir>/<prefix>` for indexed data."""
    prefix = experiment.data.prefix
    return "{in:data}" + (f"/{prefix}" if prefix else "")


def timeout_for(experiment: Experiment, step: str) -> float:
    override = experiment.steps.get(step)
    if override is not None and override.timeout_s is not None:
        return override.timeout_s
    return DEFAULT_TIMEOUT_S.get(step, 3600.0)
