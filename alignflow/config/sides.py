"""The side sections of an experiment (`npu:`, `gpu:`): what every side has, and the lookup of each backend's own.

A side section names its backend (`kind: megatron`); the rest of the section is that backend's own config model,
a subclass of `SideConfig` registered with the backend (`alignflow.backends.registry.register`). This layer only
looks the model up by kind: the backends sit above it (they render configurations of the experiment), so they
reach this lookup the way installed plugins do, through the `alignflow.backends` entry point group, which names the
module that registers alignflow's own backends (a third-party package adds its own entry to the same group). A
lookup that misses loads the group once and tries again.

`kind: twin` (and `reference`, its older name) still means the twin of the side it is written under: the
MindSpore twin on the NPU side, the PyTorch twin on the GPU side (experiment files and recorded runs from before
the twins were two backends).
"""

from __future__ import annotations

import importlib.metadata
import threading
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from alignflow.config.hosts import EnvName
from alignflow.config.parallel import ParallelConfig
from alignflow.errors import ConfigError, did_you_mean
from alignflow.pipeline import SIDE_NAMES, side

BUILTIN_BACKENDS = "alignflow.backends"  # the package that registers alignflow's own backends
ENTRY_POINT_GROUP = "alignflow.backends"
LEGACY_TWIN = ("twin", "reference")
LEGACY_KEYS = frozenset({"entry", "template", "msrun", "overrides", "torchrun", "transformer_impl",
                         "megatron_version", "extensions", "extra_args"})
"""The keys of the side sections from before the backends (one model per side, every key dumped into a run's
record): a `kind: twin` section's keys of these that its twin's model lacks are dropped, so a recorded run of that
time still opens; any other unknown key is still refused."""


class SideConfig(BaseModel):
    """What every side section holds, whatever its backend; a backend's own model adds its fields."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = Field(description="The side's backend (`alignflow backends` lists them): twin-mindspore, twin-torch, "
                      "mindformers, megatron, command.")
    env: dict[EnvName, str] = Field(default_factory=dict, description="Extra environment for the side's trainings.")
    repo: str | None = Field(None, description="Name under the host's `repos:` whose git commit versions the side "
                             "(part of each step's cache key).")
    parallel: ParallelConfig | None = Field(None, description="The side's layout; default: training.parallel.")

    @classmethod
    def model_for(cls, data: Any) -> type[BaseModel]:
        """The model that validates the section `data` (its backend's own, by its `kind`): what the did-you-mean
        of an unknown key of the section offers (`alignflow.config.yamlsource`)."""
        kind = data.get("kind") if isinstance(data, dict) else None
        if isinstance(kind, str) and kind not in LEGACY_TWIN:
            try:
                return side_config_model(kind)
            except ConfigError:
                return cls
        return cls


class _Kind(BaseModel):
    """A side section's `kind` alone, checked first, so that an unknown backend is reported at its `kind:` line."""

    kind: str

    @field_validator("kind")
    @classmethod
    def _registered(cls, value: str) -> str:
        try:
            side_config_model(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return value


_MODELS: dict[str, type[SideConfig]] = {}
ExperimentCheck = Callable[[Any], list[tuple[tuple[str, ...], str]]]
"""`(experiment) -> [(key path, message)]`: what the backends find wrong with an experiment's pair of sides (a
pipeline that would convert without a conversion spec), reported where the file is read (`alignflow.config.names`)
at the line of the key path."""
_CHECKS: list[ExperimentCheck] = []
_loaded = threading.Lock()
_plugins_loaded: list[bool] = []


def register_side_config(kind: str, model: type[SideConfig]) -> None:
    """Make `kind` a valid side backend whose section `model` validates (a backend registers once)."""
    known = _MODELS.get(kind)
    if known is not None and known is not model:
        raise ValueError(f"side backend {kind!r} is already registered (by {known.__module__})")
    _MODELS[kind] = model


def register_experiment_check(check: ExperimentCheck) -> None:
    """Run `check` on every experiment read (the backends register what they derive from the two sides)."""
    if check not in _CHECKS:
        _CHECKS.append(check)


def experiment_checks() -> list[ExperimentCheck]:
    """Every registered experiment check (the backends' entry points loaded)."""
    _load_plugins()
    return list(_CHECKS)


def _load_plugins() -> None:
    with _loaded:
        if _plugins_loaded:
            return
        # alignflow's own backends are loaded by name too: a stale `alignflow.egg-info` earlier on sys.path (a
        # checkout's root, before the reinstall that added the entry point) must not leave a run without sides
        importlib.import_module(BUILTIN_BACKENDS)
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if entry.value != BUILTIN_BACKENDS:
                entry.load()
        _plugins_loaded.append(True)


def side_kinds() -> list[str]:
    """Every registered backend kind."""
    _load_plugins()
    return sorted(_MODELS)


def side_config_model(kind: str) -> type[SideConfig]:
    """The config model of backend `kind`; a clear error listing the registered ones."""
    if kind not in _MODELS:
        _load_plugins()
    try:
        return _MODELS[kind]
    except KeyError:
        known = sorted(_MODELS)
        if not known:
            raise ConfigError(f"no side backend is registered (the `{ENTRY_POINT_GROUP}` entry points of the "
                              "installed packages name none): reinstall alignflow (`pip install -e .`)") from None
        raise ConfigError(f"unknown side backend {kind!r}{did_you_mean(kind, known)}; backends: "
                          f"{', '.join(known)}") from None


def parse_side(value: Any, side_name: str) -> SideConfig:
    """The side section `value` (None: the side's default) validated by its backend's model."""
    if isinstance(value, SideConfig):
        return value
    data = dict(value) if isinstance(value, dict) else {} if value is None else value
    if not isinstance(data, dict):
        raise ValueError(f"the {side_name} section must be a mapping with a `kind`")
    kind = data.get("kind")
    if kind is None or kind in LEGACY_TWIN:
        data["kind"] = side(side_name).default_kind if side_name in SIDE_NAMES else kind
    _Kind.model_validate({"kind": data["kind"]})  # an unknown backend: a located error (`npu.kind: ...`)
    model = side_config_model(str(data["kind"]))
    if kind in LEGACY_TWIN:  # a section (or a recorded run's) of before the twins were two backends
        data = {k: v for k, v in data.items() if k in model.model_fields or k not in LEGACY_KEYS}
    return model.model_validate(data)
