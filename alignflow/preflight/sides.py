"""The two rendered sides of an experiment, exactly as the pipeline will launch them.

Preflight does not re-derive the configurations from the experiment: it takes each side's long training from the
same `step_command` the runner launches and asks that side's backend what its settings are read from
(`Backend.settings`: the rendered MindFormers YAML, the Megatron flags after the entry — on either side, whatever
launches them —, or a `command` side's declared settings), so what it checks is what runs (template, alignflow's
overrides, `<side>.overrides`, `<side>.extra_args`, per-step command overrides). The environment each job gets is
the host's `env` (when an inventory is given) overlaid with the command's own, as the transport exports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from alignflow.backends.commands import megatron_layout_flags, step_command, train_spec
from alignflow.backends.registry import pipeline_for, side_backend
from alignflow.backends.template import MegatronArgs, MindFormersYaml, RenderedSettings
from alignflow.config.experiment import Experiment
from alignflow.config.placement import Placement
from alignflow.pipeline import SIDES, Role, Side
from alignflow.preflight.layout import launcher_world
from alignflow.preflight.values import DataFile

DATA_PLACEHOLDER = "{in:data}"
SIDE_STEPS = tuple(s.training for s in SIDES)
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
class RenderedSide:
    """One side's long training as rendered: what its settings are read from, its environment and launcher."""

    name: Side
    kind: str  # the side's backend
    rendered: RenderedSettings
    env: Mapping[str, str]
    env_source: str
    source: str  # where its configuration came from (for the report)
    world: int = 1  # processes its launcher starts (torchrun, msrun)
    world_source: str = "no launcher: one process"
    role: Role = "cuda"  # the host role it runs on
    real: bool = True  # a real framework (not a twin): held to its host's determinism environment
    convert_argv: tuple[str, ...] | None = None  # the conversion step's command: the checkpoint the side loads
    model: Any = None  # the experiment's ModelConfig: what megatron-core builds at the training's layout

    @property
    def argv(self) -> tuple[str, ...]:
        """The Megatron flags (a side read from Megatron flags only)."""
        assert isinstance(self.rendered, MegatronArgs), f"the {self.name} side is not read from Megatron flags"
        return self.rendered.argv

    @property
    def config(self) -> Mapping[str, Any]:
        """The MindFormers YAML (a side read from one only)."""
        assert isinstance(self.rendered, MindFormersYaml), f"the {self.name} side is not read from a MindFormers YAML"
        return self.rendered.config


def render_sides(
    experiment: Experiment, *, placement: Placement | None = None, data_sha256: str | None = None,
) -> tuple[RenderedSide, RenderedSide, DataBinding]:
    """Render both sides' long trainings of `experiment` (no host is contacted), on their hosts of `placement` when
    given (a run's, or `place` over an inventory: `SIDE_STEPS`): (NPU, GPU, data binding)."""
    sha = data_sha256 or experiment.data.sha256
    sides = []
    for s in SIDES:
        host = placement.host(s.training) if placement is not None else None
        cmd = step_command(experiment, s.training, data_sha256=sha or "", host=host)
        template = cmd.template
        backend = side_backend(experiment, s.name)
        train = train_spec(experiment, s.training, s.name, experiment.training.steps, None, None,
                           data_sha256=sha or "", host=host)
        rendered = backend.settings(experiment, train, template)
        env, env_source = dict(template.env), "command env; no hosts file given"
        if host is not None:
            env, env_source = {**host.env, **env}, f"host {host.name} + command env"
        sources = {MindFormersYaml: f"{s.training} config.yaml (from {getattr(rendered, 'template', '')})",
                   MegatronArgs: f"{s.training} command line"}
        source = sources.get(type(rendered), getattr(rendered, "source", s.training))
        role: Role = host.role if host is not None and host.role in ("ascend", "cuda") else s.role
        sides.append(RenderedSide(s.name, backend.kind, rendered, env, env_source, source,
                                  *launcher_world(template.argv), role=role, real=backend.real,
                                  convert_argv=_convert_argv(experiment, s.name), model=experiment.model))
    npu, gpu = sides
    return npu, gpu, DataBinding(sha, dict(experiment.data.host_paths))


def _convert_argv(experiment: Experiment, side_name: Side) -> tuple[str, ...] | None:
    """What lays out the Megatron checkpoint the side loads: the flags of its conversion step (or that step's
    override), `--ckpt-format torch_dist` for a torch_dist base; None where no step of the run writes it (a given
    or trained legacy base: not checked)."""
    pipe = pipeline_for(experiment)
    fmt = pipe.load_format(side_name)
    made = pipe.producer(pipe.load(side_name))
    if made is not None and made.converts is not None and fmt == "megatron":
        override = experiment.steps.get(made.name)
        return tuple(override.command if override is not None and override.command
                     else megatron_layout_flags(experiment))
    if fmt == "torch_dist":
        return ("--ckpt-format", "torch_dist")
    return None


def megatron_flags(experiment: Experiment, argv: tuple[str, ...] | list[str], side_name: Side = "gpu"
                   ) -> tuple[str, ...]:
    """The Megatron flags of `argv`, a command of the side's backend (the tokens after its entry point —
    `pretrain_gpt.py`, MindSpeed's launcher, the twin's module — whatever launches it)."""
    from dataclasses import replace

    training = next(s for s in SIDES if s.name == side_name).training
    template = step_command(experiment, training, data_sha256="").template
    train = train_spec(experiment, training, side_name, experiment.training.steps, None, None, data_sha256="",
                       host=None)
    rendered = side_backend(experiment, side_name).settings(experiment, train, replace(template, argv=tuple(argv)))
    if not isinstance(rendered, MegatronArgs):
        raise TypeError(f"the {side_name} side ({experiment.side(side_name).kind}) takes no Megatron flags")
    return rendered.argv


_megatron_flags = megatron_flags  # the name the recipe checks and benchmarks use
