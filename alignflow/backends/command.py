"""The `command` backend: any trainer, from a launch template the pipeline fills in.

A side alignflow has no renderer for — a trainer's own script, MindSpeed-MM's FSDP2 entry, torchtitan — is its
command line with placeholders, a declared log format and declared checkpoint formats:

```yaml
gpu:
  kind: command
  launch: [torchrun, --nproc_per_node, "{nproc}", train.py, --load, "{load}", --data, "{data}",
           --steps, "{steps}", --seed, "{seed}", --lr, "{lr}"]
  log: {regex: 'step (?P<step>\\d+) loss (?P<lm_loss>\\S+) grad_norm (?P<grad_norm>\\S+)'}   # or {format: megatron}
  checkpoint: {loads: hf, saves: hf}
  loaded_line: "loaded checkpoint"          # the log says the weights were loaded, or the run is invalid
  settings: {model.num_layers: 2, opt.beta2: 0.95}   # what preflight compares (it cannot read the script)
```

Placeholders (`PLACEHOLDERS`): the runner's `{python}`, `{out}` (the job's own directory, also its working
directory), `{in:NAME}`; the training's `{data}` (the indexed dataset's path prefix), `{load}` (the checkpoint it
starts from), `{save}` (where a base training saves), `{steps}`, `{seed}`, `{lr}`, `{micro_batch_size}`,
`{global_batch_size}`, `{seq_length}`, `{data_sha256}`; the launch's `{nproc}` (processes per node), `{nnodes}`,
`{world}`. `{{` and `}}` are literal braces. The side's `env` values take the same placeholders. An unknown
placeholder is refused when the experiment is loaded; a `{load}` in a training that loads nothing, or a `{save}` in
one that saves nothing, when it is rendered.

Preflight reads the values the template passes (`{seed}` is the experiment's seed: the rows `train.init_seed` and
`data.seed`, ...) and the declared `settings`; a row neither gives is listed as not checked, not as agreeing.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from alignflow.backends.launch import layout_for
from alignflow.backends.registry import Backend, SideFormats, own_config, register
from alignflow.backends.template import CommandTemplate, DeclaredSettings, TrainSpec
from alignflow.config.experiment import Experiment
from alignflow.config.sides import SideConfig
from alignflow.errors import ConfigError
from alignflow.logs import formats
from alignflow.logs.declared import regex_format
from alignflow.pipeline import CheckpointFormat

RUNNER = ("python", "out")  # filled by the runner once the host is known (`alignflow.runner.placeholders`)
PLACEHOLDERS = ("data", "load", "save", "steps", "seed", "lr", "micro_batch_size", "global_batch_size", "seq_length",
                "data_sha256", "nproc", "nnodes", "world")
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
# what a placeholder passes, in preflight's names (alignflow.preflight.rules): the template states these values
_PASSES = {"steps": ("train.steps",), "seed": ("train.init_seed", "data.seed"), "lr": ("opt.lr",),
           "micro_batch_size": ("train.micro_batch_size",), "global_batch_size": ("train.global_batch_size",),
           "seq_length": ("model.seq_length", "data.seq_length")}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CommandLog(_Strict):
    """Where the trainer's log is and how to read it."""

    format: str | None = Field(
        None, description="A log format alignflow reads (the trainer prints that family's step lines): the name of "
        "a registered one (alignflow.logs.formats).")
    regex: str | None = Field(
        None, description="Or a regular expression of one step line whose named groups are canonical columns: "
        "`step` (required), `max_steps`, `lm_loss`, `grad_norm`, `lr`, ...")
    path: str = Field("stdout", description="The log: the job's stdout, or a path relative to `{out}`.")

    @model_validator(mode="after")
    def _one(self) -> CommandLog:
        if (self.format is None) == (self.regex is None):
            raise ValueError("give exactly one of format (a known log format) and regex (a declared one)")
        if self.format is not None:
            formats.check_name(self.format)
        if self.regex is not None:
            regex_format(self.regex)  # compiles, names the step and at least one column
        return self


class CommandCheckpoint(_Strict):
    """The checkpoint formats the trainer reads and writes."""

    loads: CheckpointFormat = Field(description="The format `{load}` is given in (the pipeline converts the base to "
                                    "it where needed): hf, mindformers, megatron, torch_dist, dcp.")
    saves: CheckpointFormat | None = Field(None, description="The format a base training writes at `{save}` (None: "
                                           "the side cannot train the base).")


class CommandConfig(SideConfig):
    """Any trainer: a launch template, its log format, its checkpoint formats and its declared settings."""

    kind: Literal["command"] = Field("command", description="A trainer given as a command line.")
    launch: list[str] = Field(min_length=1, description="argv template (see the placeholders in the backend's "
                              "documentation); `[bash, -c, SCRIPT]` for a shell script.")
    log: CommandLog = Field(description="The trainer's log and its format.")
    checkpoint: CommandCheckpoint = Field(description="The checkpoint formats it loads and saves.")
    loaded_line: str | None = Field(None, description="Text a log contains when the checkpoint was loaded; a training "
                                    "that loads one and never prints it fails (a silently random start).")
    settings: dict[str, Any] = Field(default_factory=dict, description="The trainer's settings in preflight's names "
                                     "(`alignflow preflight --json` lists them: model.num_layers, opt.beta2, ...), "
                                     "compared with the other side's.")
    code_version: str | None = Field(None, description="What versions the trainer (part of each step's cache key); "
                                     "default: the launch template itself.")

    @field_validator("launch")
    @classmethod
    def _placeholders(cls, launch: list[str]) -> list[str]:
        _check_placeholders(launch)
        return launch

    @field_validator("env")
    @classmethod
    def _env_placeholders(cls, env: dict[str, str]) -> dict[str, str]:
        _check_placeholders(list(env.values()))
        return env


def _check_placeholders(texts: list[str]) -> None:
    unknown = sorted({name for arg in texts for name in _names(arg)
                      if name not in (*RUNNER, *PLACEHOLDERS) and not name.startswith("in:")})
    if unknown:
        raise ValueError(f"unknown placeholder(s) {', '.join('{' + n + '}' for n in unknown)}; known: "
                         f"{', '.join('{' + n + '}' for n in (*RUNNER, *PLACEHOLDERS))}, {{in:NAME}} "
                         "({{ and }} for literal braces)")


def _names(arg: str) -> list[str]:
    return [m.group(1) for m in _TOKEN.finditer(arg) if m.group(1) is not None]


def _fill(arg: str, values: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name is None:
            return m.group(0)[0]
        if name in values:
            return values[name]
        return m.group(0)  # the runner's: {python}, {out}, {in:NAME}

    return _TOKEN.sub(sub, arg)


def _log_format(cfg: CommandConfig) -> str | formats.LogFormatSpec:
    if cfg.log.regex is not None:
        return regex_format(cfg.log.regex)
    assert cfg.log.format is not None
    return cfg.log.format


def _values(experiment: Experiment, spec: TrainSpec) -> dict[str, str]:
    training = experiment.training
    layout = spec.layout or layout_for(experiment.parallel(spec.side), None, side=spec.side)
    values = {"data": spec.data, "steps": str(spec.steps), "seed": str(training.seed), "lr": repr(training.lr),
              "micro_batch_size": str(training.micro_batch_size),
              "global_batch_size": str(training.global_batch_size), "seq_length": str(experiment.model.seq_length),
              "data_sha256": spec.data_sha256, "nproc": str(layout.per_node), "nnodes": str(layout.nodes),
              "world": str(layout.world)}
    if spec.load is not None:
        values["load"] = spec.load
    if spec.save is not None:
        values["save"] = spec.save
    return values


def _command(experiment: Experiment, spec: TrainSpec) -> CommandTemplate:
    cfg = own_config(experiment, spec.side, CommandConfig)
    used = {name for arg in (*cfg.launch, *cfg.env.values()) for name in _names(arg)}
    for name, given, what in (("load", spec.load, "loads no checkpoint (it trains the base from scratch)"),
                              ("save", spec.save, "saves no checkpoint")):
        if name in used and given is None:
            raise ConfigError(f"{experiment.source or experiment.name}: {spec.side}.launch uses {{{name}}}, but "
                              f"{spec.step} {what}")
    if spec.save is not None and "save" not in used:
        raise ConfigError(f"{experiment.source or experiment.name}: {spec.step} trains the base checkpoint: "
                          f"{spec.side}.launch must write it at {{save}}")
    values = _values(experiment, spec)
    argv = tuple(_fill(arg, values) for arg in cfg.launch)
    required = (cfg.loaded_line,) if spec.load is not None and cfg.loaded_line else ()
    return CommandTemplate(
        argv=argv,
        log_format=_log_format(cfg),
        code_version=cfg.code_version or "command " + " ".join(cfg.launch),
        env={name: _fill(value, values) for name, value in cfg.env.items()},
        log=cfg.log.path,
        checkpoint="checkpoint" if spec.save is not None else None,
        required_lines=required,
        code_repo=cfg.repo,
    )


def _settings(experiment: Experiment, spec: TrainSpec, template: CommandTemplate) -> DeclaredSettings:
    cfg = own_config(experiment, spec.side, CommandConfig)
    values = _values(experiment, spec)
    used = {name for arg in cfg.launch for name in _names(arg)}
    passed: dict[str, Any] = {}
    for name, settings in _PASSES.items():
        if name in used:
            for setting in settings:
                passed[setting] = (_number(values[name]), f"{{{name}}} in {spec.side}.launch")
    if "data" in used:
        passed["data.file"] = (spec.data, f"{{data}} in {spec.side}.launch")
    declared = {key: (value, f"{spec.side}.settings.{key}") for key, value in cfg.settings.items()}
    return DeclaredSettings({**passed, **declared}, f"{spec.step}: {spec.side}.launch and {spec.side}.settings")


def _number(text: str) -> int | float:
    return int(text) if text.isdigit() else float(text)


def _formats(cfg: SideConfig) -> SideFormats:
    assert isinstance(cfg, CommandConfig)
    return SideFormats(log=_log_format(cfg), loads=(cfg.checkpoint.loads,), saves=cfg.checkpoint.saves)


COMMAND = register(Backend(
    kind="command", title="any trainer, from a launch template", config=CommandConfig,
    roles=frozenset({"ascend", "cuda"}), formats=_formats, render=_command, settings=_settings,
))
