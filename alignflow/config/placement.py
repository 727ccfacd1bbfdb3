"""Where a step runs: the host of its role in the experiment and the inventory (or the controller)."""

from __future__ import annotations

from pathlib import Path

from alignflow import pipeline
from alignflow.config.experiment import Experiment
from alignflow.config.hosts import Host, Inventory
from alignflow.errors import ConfigError

CONTROLLER = "controller"


def controller_host(inventory: Inventory, state_dir: Path) -> Host:
    """The inventory's controller host, or an implicit local one under the state dir."""
    declared = inventory.by_role("controller")
    if declared:
        return declared[0]
    return Host(name=CONTROLLER, role="controller", transport="local", workdir=str(state_dir / "controller"))


def resolve_host(experiment: Experiment, inventory: Inventory, step_name: str, state_dir: Path) -> Host:
    """The host a step runs on: the step's override, else the experiment's host of the step's role, else the
    inventory's only host of that role."""
    override = experiment.steps.get(step_name)
    if override is not None and override.host:
        return inventory.get(override.host)
    role = pipeline.step(step_name).role
    if role == "controller":
        return controller_host(inventory, state_dir)
    if role in experiment.hosts:
        return inventory.get(experiment.hosts[role])
    candidates = inventory.by_role(role)
    if len(candidates) == 1:
        return candidates[0]
    where = inventory.source or "hosts.yaml"
    if not candidates:
        raise ConfigError(f"{experiment.source}: step {step_name} needs a host with role {role}; {where} has none")
    names = ", ".join(h.name for h in candidates)
    raise ConfigError(f"{experiment.source}: step {step_name} needs a host with role {role}; {where} has several "
                      f"({names}): choose one under `hosts: {{{role}: NAME}}`")
