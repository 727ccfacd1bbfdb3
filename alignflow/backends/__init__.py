"""Backends render one training of one side into a host-independent command template.

The same step code drives the twin and the real frameworks: a backend only decides the argv, the
config files, the environment, where the log lands and which log format it has. Locations are placeholders
(`{python}`, `{out}`, `{in:<artifact>}`) filled in by the runner once the host is known, so that a cache key
computed from the template does not depend on where files happen to live.
"""

from __future__ import annotations

from alignflow.backends import megatron, mindformers, twin
from alignflow.backends.template import CommandTemplate, LogFormat, Side, TrainSpec
from alignflow.config.experiment import Experiment

__all__ = ["CommandTemplate", "LogFormat", "Side", "TrainSpec", "render_training"]


def render_training(experiment: Experiment, spec: TrainSpec) -> CommandTemplate:
    """Dispatch to the side's backend."""
    if spec.side == "npu":
        if experiment.npu.kind == "twin":
            return twin.npu_command(experiment, spec)
        return mindformers.npu_command(experiment, spec)
    if experiment.gpu.kind == "twin":
        return twin.gpu_command(experiment, spec)
    return megatron.gpu_command(experiment, spec)
