"""The side backends: one typed bundle per kind, registered by name and looked up, never branched on.

Everything alignflow knows about one trainer as a side of an alignment is one `Backend` (torchtitan's `TrainSpec`
registry is the model): its experiment section (`config`), the host roles it trains on, its log and checkpoint
formats, how it renders a training (argv, env, config files), what preflight reads its settings from, how it
dumps for `diagnose` and how `preflight --check-hosts` probes its host. A module registers its backend once
(`register`); everything per side — the pipeline's conversion steps, the gate, diagnose, preflight, the report,
the exports — is derived from the two sides' backends and the pipeline's steps, so a new trainer is one module.

```python
backend = side_backend(experiment, "npu")          # the NPU side's bundle (its `kind`)
template = backend.render(experiment, train_spec)   # what one training runs
pipe = pipeline_for(experiment)                     # the steps, derived from the checkpoint formats
```
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar

from alignflow.backends.template import CommandTemplate, RenderedSettings, TrainSpec
from alignflow.config.experiment import Experiment
from alignflow.config.sides import SideConfig, register_experiment_check, register_side_config, side_config_model
from alignflow.errors import ConfigError
from alignflow.pipeline import (
    CONVERTED_ONLY_WITH,
    SIDES,
    CheckpointFormat,
    Formats,
    Pipeline,
    Role,
    Side,
    checkpoint_artifact,
    derive,
    not_converted,
    side,
)

if TYPE_CHECKING:
    from alignflow.config.hosts import Host
    from alignflow.config.parallel import ParallelConfig
    from alignflow.logs.formats import LogFormatSpec
    from alignflow.transport import Transport


@dataclass(frozen=True, slots=True)
class SideFormats:
    """What a side reads and writes: its log format, the checkpoint formats its trainings load (preferred first: a
    conversion produces the first) and the one a base training saves (None: it cannot train the base)."""

    log: str | LogFormatSpec  # a registered log format's name, or a declared one
    loads: tuple[CheckpointFormat, ...]
    saves: CheckpointFormat | None


Renderer = Callable[[Experiment, TrainSpec], CommandTemplate]
"""`(experiment, training) -> template`: one training of the side (its config is `experiment.side(spec.side)`)."""
SettingsReader = Callable[[Experiment, TrainSpec, CommandTemplate], RenderedSettings]
"""`(experiment, training, its template) -> what preflight reads the side's effective settings from`."""
HostProbe = Callable[[Experiment, Side, "Host", "Transport"], list[str]]
"""`(experiment, side, its host, that host's transport) -> problems` (empty: the trainer is there as declared)."""


@dataclass(frozen=True, slots=True)
class Backend:
    """One kind of side."""

    kind: str
    title: str
    config: type[SideConfig]
    roles: frozenset[Role]  # host roles it trains on (ascend: an NPU host, cuda: a GPU host)
    formats: Callable[[SideConfig], SideFormats]
    render: Renderer
    settings: SettingsReader
    dumps: Literal["native", "msprobe"] | None = None  # native: the twin dumps itself; msprobe: `diagnose-setup`
    probe: HostProbe | None = None
    real: bool = True  # a real framework (not a twin): the early gate runs by default

    def formats_of(self, experiment: Experiment, side_name: Side) -> SideFormats:
        return self.formats(experiment.side(side_name))


_BACKENDS: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    """Register `backend` (and its experiment section) under its kind; returns it."""
    known = _BACKENDS.get(backend.kind)
    if known is not None and known != backend:
        raise ValueError(f"side backend {backend.kind!r} is already registered")
    register_side_config(backend.kind, backend.config)
    _BACKENDS[backend.kind] = backend
    return backend


def backend(kind: str) -> Backend:
    """The backend registered as `kind` (an error lists the registered ones)."""
    side_config_model(kind)  # loads the registered backends; a clear error for an unknown kind
    return _BACKENDS[kind]


def backends() -> list[Backend]:
    """Every registered backend, by kind."""
    from alignflow.config.sides import side_kinds

    return [_BACKENDS[k] for k in side_kinds() if k in _BACKENDS]


def side_backend(experiment: Experiment, side_name: Side) -> Backend:
    """The backend of the experiment's side `side_name`."""
    return backend(experiment.side(side_name).kind)


C = TypeVar("C", bound=SideConfig)


def own_config(experiment: Experiment, side_name: Side, model: type[C]) -> C:
    """The side's section as its backend's own model (a backend's renderer reads its fields through this)."""
    cfg = experiment.side(side_name)
    assert isinstance(cfg, model), f"{side_name}: a {type(cfg).__name__}, not a {model.__name__}"
    return cfg


def megatron_version_of(experiment: Experiment) -> str:
    """The megatron-core version whose names the experiment's Megatron-kind side uses (the first side that states
    one; 0.16, the oldest supported, when none does): the MTP inner layer's name follows it."""
    for s in SIDES:
        version = getattr(experiment.side(s.name), "megatron_version", None)
        if isinstance(version, str):
            return version
    return "0.16"


def formats_of(experiment: Experiment) -> Formats:
    """The formats the experiment's pipeline is derived from: the base's (given, or what the NPU side's backend
    saves) and what each side loads."""
    found = _formats_or_problem(experiment)
    if isinstance(found, Formats):
        return found
    raise ConfigError(f"{experiment.source or experiment.name}: {found[1]}")


def _formats_or_problem(experiment: Experiment) -> Formats | tuple[tuple[str, ...], str]:
    loads = {s.name: side_backend(experiment, s.name).formats_of(experiment, s.name).loads for s in SIDES}
    if experiment.base is not None:
        return Formats(base=experiment.base.format, base_trained=False, loads=loads)
    base_side = side("npu")
    saves = side_backend(experiment, base_side.name).formats_of(experiment, base_side.name).saves
    if saves is None:
        return ((base_side.name, "kind"),
                f"{base_side.name}.kind: the {base_side.label} side's backend ({experiment.npu.kind}) cannot save "
                "the base checkpoint it would train; give the experiment a `base: {path, format}` both sides "
                "start from")
    return Formats(base=saves, base_trained=True, loads=loads)


def _pipeline_or_problem(experiment: Experiment) -> Pipeline | tuple[tuple[str, ...], str]:
    formats = _formats_or_problem(experiment)
    if not isinstance(formats, Formats):
        return formats
    pipe = derive(formats)
    conversions = [s for s in pipe.steps if s.converts is not None and s.converts[0] != s.converts[1]]
    for step in conversions:
        assert step.converts is not None
        why = not_converted(*step.converts)
        if why is not None:
            fmt = next(f for f in step.converts if f in CONVERTED_ONLY_WITH)
            loc = _converting_key(experiment, formats, fmt)
            return (loc, f"{'.'.join(loc)}: {step.name} would convert {step.converts[0]} -> {step.converts[1]}: "
                         f"{why}")
    if conversions and experiment.conversion is None:
        step = conversions[0]
        assert step.converts is not None
        target = step.converts[1]
        # where the need comes from: the given base's format, or the side that loads the converted format
        loc = _converting_key(experiment, formats, step.converts[0] if experiment.base is not None else target)
        return (loc, f"{'.'.join(loc)}: {step.name} converts {step.converts[0]} -> {target} (the sides load "
                     "other formats than the base's): the experiment needs `conversion: {spec: <model family>}` "
                     "(`alignflow convert specs`)")
    for step in conversions:
        assert step.converts is not None
        if step.converts[1] == "megatron" and step.converts[0] != "mindformers":
            problem = _distributed_from_other(experiment, pipe, step.name, step.converts[0])
            if problem is not None:
                return problem
    return pipe


def _distributed_from_other(experiment: Experiment, pipe: Pipeline, step: str, source: CheckpointFormat
                            ) -> tuple[tuple[str, ...], str] | None:
    """A converted Megatron checkpoint of many ranks (torch_dist, or legacy files per tp / pp / ep) is written from
    MindFormers only (megatron-core's own layout, `alignflow.convert.engine`); from another format, one legacy file."""
    from alignflow.convert.layout import megatron_checkpoint_layout

    conv = experiment.conversion
    assert conv is not None
    for s in SIDES:
        if pipe.load(s.name) != checkpoint_artifact("megatron"):
            continue
        fmt, p = megatron_checkpoint_layout(conv.format, experiment.parallel(s.name))
        if fmt == "torch_dist" or (p.tp, p.pp, p.ep) != (1, 1, 1):
            loc = (s.name, "parallel") if conv.format == "auto" else ("conversion", "format")
            layout = "torch_dist" if fmt == "torch_dist" else f"legacy files for tp {p.tp} pp {p.pp} ep {p.ep}"
            return (loc, f"{'.'.join(loc)}: {step} would write {layout} from a {source} checkpoint for the "
                         f"{s.name} side's layout; alignflow writes a Megatron checkpoint of many ranks from "
                         "MindFormers only (from another format: one legacy file, tp = pp = ep = 1)")
    return None


def _converting_key(experiment: Experiment, formats: Formats, fmt: CheckpointFormat) -> tuple[str, ...]:
    """Where a conversion from or to `fmt` comes from: the given base's format, else the side that loads `fmt`."""
    if experiment.base is not None and (experiment.base.format == fmt or all(
            formats.loads[s.name][0] != fmt for s in SIDES)):
        return ("base", "format")
    return next(((s.name, "kind") for s in SIDES if formats.loads[s.name][0] == fmt), ("npu", "kind"))


def pipeline_for(experiment: Experiment) -> Pipeline:
    """The experiment's steps, derived from its checkpoint formats; `ConfigError` for a conversion it would need
    without a spec to convert with."""
    found = _pipeline_or_problem(experiment)
    if isinstance(found, Pipeline):
        return found
    raise ConfigError(f"{experiment.source or experiment.name}: {found[1]}")


def pipeline_problems(experiment: Experiment) -> list[tuple[tuple[str, ...], str]]:
    """What keeps the experiment's pipeline from being derived, located (`alignflow.config.names` reports it at
    the key's line when the file is read)."""
    found = _pipeline_or_problem(experiment)
    return [] if isinstance(found, Pipeline) else [found]


register_experiment_check(pipeline_problems)


def megatron_load_format(experiment: Experiment, spec: TrainSpec, parallel: ParallelConfig) -> str:
    """The `--ckpt-format` of a Megatron-kind training laid out as `parallel`: the format of the checkpoint it loads
    (a torch_dist one as such; the converted Megatron checkpoint as `conversion.format` lays it out for this layout;
    a given or trained legacy one as `torch`), `torch` for a training from scratch (what a base training saves)."""
    from alignflow.convert.layout import megatron_checkpoint_layout

    if spec.load is None:
        return "torch"
    pipe = pipeline_for(experiment)
    fmt = pipe.load_format(spec.side)
    if fmt == "torch_dist":
        return "torch_dist"
    if pipe.load(spec.side) == checkpoint_artifact("megatron") and experiment.conversion is not None:
        return megatron_checkpoint_layout(experiment.conversion.format, parallel)[0]
    return "torch"
