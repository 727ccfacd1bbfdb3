"""What each job step runs: the command of a training or a conversion, derived from the step and the sides' backends.

The step itself (host role, inputs, outputs and their paths under `{out}`, time limit, which side it trains and which
checkpoint it loads, which formats it converts) is declared once in the experiment's derived pipeline
(`alignflow.pipeline`, `alignflow.backends.registry.pipeline_for`); this module only turns such a step into a
command: a training through its side's backend, a conversion through `alignflow convert`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from alignflow import pipeline
from alignflow.backends import render_training
from alignflow.backends.launch import layout_for
from alignflow.backends.registry import pipeline_for
from alignflow.backends.template import CommandTemplate, TrainSpec
from alignflow.codeversion import code_version_for
from alignflow.config.experiment import Experiment
from alignflow.config.hosts import Host
from alignflow.errors import ConfigError, PipelineError
from alignflow.pipeline import SIDES, CheckpointFormat, Side


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


def data_placeholder(experiment: Experiment) -> str:
    """What the trainings are given as their data path: the file, or `<dir>/<prefix>` for indexed data."""
    prefix = experiment.data.prefix
    return "{in:data}" + (f"/{prefix}" if prefix else "")


def train_spec(experiment: Experiment, step: str, side: Side, steps: int, load: str | None, save: str | None, *,
               data_sha256: str, host: Host | None) -> TrainSpec:
    """A training of `side`, laid out on `host` (its nodes and devices; None: the experiment's layout, one node)."""
    layout = layout_for(experiment.parallel(side), host, side=side)
    role = host.role if host is not None and host.role in ("ascend", "cuda") else None
    return TrainSpec(step, side, steps, data_placeholder(experiment), data_sha256, load, save, layout, role=role)


def _checkpoint_output(spec: pipeline.StepSpec) -> str:
    return next(o.path for o in spec.outputs if pipeline.ARTIFACTS[o.artifact].kind == "checkpoint")


def _train(experiment: Experiment, spec: pipeline.StepSpec, data_sha256: str, host: Host | None) -> StepCommand:
    assert spec.side is not None
    base = spec.training == "base"
    steps = experiment.training.base_steps if base else experiment.training.steps
    load = "{in:" + spec.load + "}" if spec.load else None
    save = "{out}/" + _checkpoint_output(spec) if base else None
    train = train_spec(experiment, spec.name, spec.side, steps, load, save, data_sha256=data_sha256, host=host)
    return StepCommand(render_training(experiment, train), expect_steps=steps)


def megatron_target(experiment: Experiment, fmt: CheckpointFormat) -> tuple[str, str]:
    """(flavour, megatron-core version) of the Megatron checkpoint the sides that load `fmt` need: their
    `transformer_impl` and `megatron_version` (local and 0.16 for a side that states neither)."""
    pipe = pipeline_for(experiment)
    wanted: dict[tuple[str, str], list[Side]] = {}
    for s in SIDES:
        if pipe.load(s.name) != pipeline.checkpoint_artifact(fmt):
            continue
        cfg = experiment.side(s.name)
        impl = str(getattr(cfg, "transformer_impl", "local"))
        wanted.setdefault(("te" if impl == "transformer_engine" else "local",
                           str(getattr(cfg, "megatron_version", "0.16"))), []).append(s.name)
    if len(wanted) > 1:
        raise ConfigError(f"{experiment.source or experiment.name}: both sides load one converted {fmt} checkpoint "
                          "but name different Megatron flavours or versions ("
                          + "; ".join(f"{', '.join(sides)}: {f} {v}" for (f, v), sides in wanted.items())
                          + "); make them agree")
    return next(iter(wanted), ("local", "0.16"))


def megatron_layout_flags(experiment: Experiment) -> list[str]:
    """`alignflow convert megatron`'s format and layout flags for the layout of the sides that load the converted
    Megatron checkpoint (`conversion.format`; none for a single file): torch_dist for any layout, or legacy files
    for exactly the loading sides' tp / pp / ep (both sides loading it must then agree on them)."""
    from alignflow.convert.layout import megatron_checkpoint_layout

    conv = experiment.conversion
    assert conv is not None
    pipe = pipeline_for(experiment)
    wanted: dict[tuple[str, int, int, int], list[Side]] = {}
    for s in SIDES:
        if pipe.load(s.name) == pipeline.checkpoint_artifact("megatron"):
            fmt, p = megatron_checkpoint_layout(conv.format, experiment.parallel(s.name))
            wanted.setdefault((fmt, p.tp, p.pp, p.ep), []).append(s.name)
    if len(wanted) > 1:
        raise ConfigError(f"{experiment.source or experiment.name}: both sides load one converted Megatron checkpoint "
                          "but their layouts need different files ("
                          + "; ".join(f"{', '.join(sides)}: "
                                      + (f if f == "torch_dist" else f"legacy files for tp {tp} pp {pp} ep {ep}")
                                      for (f, tp, pp, ep), sides in wanted.items())
                          + "); set `conversion.format: torch_dist`, which loads at any layout")
    fmt, tp, pp, ep = next(iter(wanted), ("torch", 1, 1, 1))
    if fmt == "torch_dist":
        return ["--ckpt-format", "torch_dist"]
    return [f for flag, n in (("--tp", tp), ("--pp", pp), ("--ep", ep)) if n != 1 for f in (flag, str(n))]


def _convert(experiment: Experiment, spec: pipeline.StepSpec) -> StepCommand:
    assert spec.converts is not None
    src, dst = spec.converts
    source = "{in:" + spec.inputs[0] + "}"
    out = "{out}/" + _checkpoint_output(spec)
    code = code_version_for(("convert",))
    if spec.name == "convert_bf16":
        return StepCommand(CommandTemplate(
            argv=("{python}", "-m", "alignflow", "convert", "bf16", source, out, "--json"),
            log_format="megatron", code_version=code))
    conv = experiment.conversion
    if conv is None:  # pipeline_for refuses this before any step is rendered
        raise ConfigError(f"{experiment.source or experiment.name}: {spec.name} needs `conversion: {{spec: ...}}`")
    flavor, version = megatron_target(experiment, dst)
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
    # torch_dist is written by `convert megatron --ckpt-format torch_dist` (megatron-core's dist_checkpointing)
    argv = ["{python}", "-m", "alignflow", "convert", "megatron" if dst == "torch_dist" else dst, source, out,
            "--from", src, "--spec", spec_arg, "--flavor", flavor, "--megatron-version", version,
            "--model", "{out}/model.json", "--json"]
    if dst in ("megatron", "torch_dist"):
        argv[-1:-1] = ["--iteration", str(conv.iteration)]
        argv[-1:-1] = megatron_layout_flags(experiment) if dst == "megatron" else ["--ckpt-format", "torch_dist"]
    # the bf16 export is bf16 throughout (anything else is a broken export); a given base keeps its own dtypes
    argv[-1:-1] = ["--source-dtype", "bfloat16" if spec.inputs[0] == "bf16_ckpt" else "any"]
    return StepCommand(CommandTemplate(argv=tuple(argv), log_format="megatron", code_version=code, files=files))


def step_command(experiment: Experiment, step: str, *, data_sha256: str, host: Host | None = None) -> StepCommand:
    """The command of one job step of `experiment` on `host`, with the experiment's `steps.<name>` overrides."""
    spec = pipeline_for(experiment).step(step)
    if spec.training is not None:
        cmd = _train(experiment, spec, data_sha256, host)
    elif spec.converts is not None:
        cmd = _convert(experiment, spec)
    else:
        raise PipelineError(f"step '{step}' has no command (its executor is {spec.executor})")
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
    return pipeline.known_step(step).timeout_s


def retry_on(experiment: Experiment, step: str) -> frozenset[str]:
    """How a job of the step may end and still be retried with a new job (`steps.<name>.retry_on`)."""
    override = experiment.steps.get(step)
    return frozenset(override.retry_on) if override is not None else frozenset()
