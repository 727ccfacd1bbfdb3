"""What each job step runs: one builder per step, producing a host-independent command template.

The step itself (host role, inputs, outputs and their paths under `{out}`, time limit) is declared once in
`alignflow.pipeline.STEPS`; a builder only decides the command. Adding a step is its `StepSpec` plus, for a `job`
step, its builder here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace

from alignflow import pipeline
from alignflow.backends import render_training
from alignflow.backends.launch import layout_for
from alignflow.backends.template import CommandTemplate, Side, TrainSpec
from alignflow.codeversion import code_version_for
from alignflow.config.experiment import Experiment
from alignflow.config.hosts import Host
from alignflow.errors import ConfigError, PipelineError


@dataclass(frozen=True, slots=True)
class StepCommand:
    """A job step's template, and how many training steps its log must hold (None: not a training)."""

    template: CommandTemplate
    expect_steps: int | None = None

    def outputs(self, spec: pipeline.StepSpec) -> dict[str, str]:
        """The step's outputs (artifact -> path relative to `{out}`); a training log the backend writes somewhere
        other than stdout is found where the backend says."""
        log = self.template.log
        return {o.artifact: (log if o.path == "train.log" and log != "stdout" else o.path) for o in spec.outputs}


Builder = Callable[[Experiment, str, Host | None], StepCommand]
"""`(experiment, data_sha256, host) -> StepCommand`; the host (None: not known yet) decides a training's layout."""


def data_placeholder(experiment: Experiment) -> str:
    """What the trainings are given as their data path: the file, or `<dir>/<prefix>` for indexed data."""
    prefix = experiment.data.prefix
    return "{in:data}" + (f"/{prefix}" if prefix else "")


def train_spec(experiment: Experiment, step: str, side: Side, steps: int, load: str | None, save: str | None, *,
               data_sha256: str, host: Host | None) -> TrainSpec:
    """A training of `side`, laid out on `host` (its nodes and devices; None: the experiment's layout, one node)."""
    layout = layout_for(experiment.parallel(side), host, side=side)
    return TrainSpec(step, side, steps, data_placeholder(experiment), data_sha256, load, save, layout)


def _train(experiment: Experiment, data_sha256: str, host: Host | None, step: str, side: Side, steps: int,
           load: str | None, save: str | None) -> StepCommand:
    spec = train_spec(experiment, step, side, steps, load, save, data_sha256=data_sha256, host=host)
    return StepCommand(render_training(experiment, spec), expect_steps=steps)


def _npu_base_train(experiment: Experiment, data_sha256: str, host: Host | None) -> StepCommand:
    return _train(experiment, data_sha256, host, "npu_base_train", "npu", experiment.training.base_steps, None,
                  "{out}/checkpoint")


def _gpu_train(experiment: Experiment, data_sha256: str, host: Host | None) -> StepCommand:
    return _train(experiment, data_sha256, host, "gpu_train", "gpu", experiment.training.steps,
                  "{in:megatron_ckpt}", None)


def _npu_reload_train(experiment: Experiment, data_sha256: str, host: Host | None) -> StepCommand:
    return _train(experiment, data_sha256, host, "npu_reload_train", "npu", experiment.training.steps,
                  "{in:bf16_ckpt}", None)


def _convert_bf16(experiment: Experiment, data_sha256: str, host: Host | None) -> StepCommand:
    return StepCommand(CommandTemplate(
        argv=("{python}", "-m", "alignflow", "convert", "bf16", "{in:base_ckpt}", "{out}/bf16", "--json"),
        log_format="megatron",
        code_version=code_version_for(("convert",)),
    ))


def megatron_layout_flags(experiment: Experiment) -> list[str]:
    """`alignflow convert megatron`'s format and layout flags for the GPU side's layout (none for a single file)."""
    from alignflow.convert.layout import megatron_checkpoint_layout

    fmt, p = megatron_checkpoint_layout(experiment.conversion.format, experiment.parallel("gpu"))
    if fmt == "torch_dist":
        return ["--ckpt-format", "torch_dist"]
    return [f for flag, n in (("--tp", p.tp), ("--pp", p.pp), ("--ep", p.ep)) if n != 1 for f in (flag, str(n))]


def _convert_megatron(experiment: Experiment, data_sha256: str, host: Host | None) -> StepCommand:
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
    return StepCommand(CommandTemplate(
        argv=("{python}", "-m", "alignflow", "convert", "megatron", "{in:bf16_ckpt}", "{out}/megatron",
              "--spec", spec_arg, "--flavor", flavor, "--megatron-version", experiment.gpu.megatron_version,
              "--iteration", str(conv.iteration), "--model", "{out}/model.json",
              *megatron_layout_flags(experiment), "--json"),
        log_format="megatron",
        code_version=code_version_for(("convert",)),
        files=files,
    ))


BUILDERS: dict[str, Builder] = {
    "npu_base_train": _npu_base_train,
    "convert_bf16": _convert_bf16,
    "convert_megatron": _convert_megatron,
    "gpu_train": _gpu_train,
    "npu_reload_train": _npu_reload_train,
}


def step_command(experiment: Experiment, step: str, *, data_sha256: str, host: Host | None = None) -> StepCommand:
    """The command of one job step of `experiment` on `host`, with the experiment's `steps.<name>` overrides."""
    spec = pipeline.step(step)
    builder = BUILDERS.get(spec.name)
    if builder is None:
        raise PipelineError(f"step '{step}' has no command (its executor is {spec.executor})")
    cmd = builder(experiment, data_sha256, host)
    override = experiment.steps.get(step)
    if override is not None and override.command is not None:
        cmd = replace(cmd, template=replace(cmd.template, argv=tuple(override.command)))
    if override is not None and override.env:
        cmd = replace(cmd, template=replace(cmd.template, env={**cmd.template.env, **override.env}))
    return cmd


def timeout_for(experiment: Experiment, step: str) -> float:
    """The step's time limit: `steps.<name>.timeout_s` of the experiment, else the step's declared one."""
    override = experiment.steps.get(step)
    if override is not None and override.timeout_s is not None:
        return override.timeout_s
    return pipeline.step(step).timeout_s


def retry_on(experiment: Experiment, step: str) -> frozenset[str]:
    """How a job of the step may end and still be retried with a new job (`steps.<name>.retry_on`)."""
    override = experiment.steps.get(step)
    return frozenset(override.retry_on) if override is not None else frozenset()
