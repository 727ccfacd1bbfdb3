"""Backends render one training of one side into a host-independent command template.

The same step code drives the twins and the real frameworks: a backend only decides the argv, the config files,
the environment, where the log lands and which log format it has. Locations are placeholders (`{python}`, `{out}`,
`{in:<artifact>}`) filled in by the runner once the host is known, so that a cache key computed from the template
does not depend on where files happen to live.

Each kind of side is one registered `Backend` (`alignflow.backends.registry`); importing this package registers
alignflow's own — the package is the `alignflow.backends` entry point through which the experiment's
configuration finds them (`alignflow.config.sides`). A new backend is one module imported here (or a package of
its own with an entry in that group).
"""

from __future__ import annotations

from alignflow.backends import command, megatron, mindformers, twin
from alignflow.backends.registry import (
    Backend,
    SideFormats,
    backend,
    backends,
    formats_of,
    own_config,
    pipeline_for,
    register,
    side_backend,
)
from alignflow.backends.template import CommandTemplate, TrainSpec
from alignflow.config.experiment import Experiment
from alignflow.errors import ConfigError
from alignflow.pipeline import Side, side

__all__ = ["BUILTIN", "Backend", "CommandTemplate", "Side", "SideFormats", "TrainSpec", "backend",
           "backends", "formats_of", "own_config", "pipeline_for", "register", "render_training", "side_backend"]

BUILTIN = (twin.TWIN_MINDSPORE, twin.TWIN_TORCH, mindformers.MINDFORMERS, megatron.MEGATRON, command.COMMAND)


def render_training(experiment: Experiment, spec: TrainSpec) -> CommandTemplate:
    """The training `spec` of its side, rendered by that side's backend (on a host whose role it trains on)."""
    found = side_backend(experiment, spec.side)
    role = spec.role or side(spec.side).role
    if role not in found.roles:
        raise ConfigError(f"{experiment.source or experiment.name}: {spec.side}.kind {found.kind} trains on "
                          f"{' or '.join(sorted(found.roles))} hosts; {spec.step} would run on a {role} host")
    return found.render(experiment, spec)
