"""Where each step runs: `place(experiment, inventory) -> Placement`, the one function that decides it.

A run decides its placement once, when it starts (`alignflow.runner.run.start_run`), and records it with its
parameters (`alignflow.store.params.RunParams.placement`); everything after — preflight, the executors, the flow's
task names, the Slurm checks — reads that record. `alignflow preflight` and `alignflow render`, which have no
run, call `place` once for the steps they look at.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from alignflow import pipeline
from alignflow.config.experiment import Experiment
from alignflow.config.hosts import Host, Inventory
from alignflow.errors import ConfigError

CONTROLLER = "controller"


class Placement(BaseModel):
    """The host of each step; a step that has none keeps the reason, raised when something asks for its host (a
    run whose hosts file lacks a GPU host may still run `--only npu_base_train`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hosts: dict[str, Host] = Field(default_factory=dict, description="step -> the host it runs on")
    unplaced: dict[str, str] = Field(default_factory=dict, description="step -> why no host could be chosen")

    def host(self, step: str) -> Host:
        """The host of `step`; `ConfigError` with the reason when it has none."""
        found = self.hosts.get(step)
        if found is not None:
            return found
        if step in self.unplaced:
            raise ConfigError(self.unplaced[step])
        pipeline.known_step(step)  # an unknown name is refused with the list of steps
        raise ConfigError(f"step {step}: not placed (placed: {', '.join(self.hosts) or 'none'})")

    def host_names(self) -> Mapping[str, str]:
        """step -> host name, for the steps that have a host."""
        return {step: host.name for step, host in self.hosts.items()}


def place(experiment: Experiment, inventory: Inventory, *, state_dir: Path | None = None,
          steps: Iterable[str] = pipeline.STEP_NAMES) -> Placement:
    """The host of each of `steps` (default: every step of the pipeline): the step's override, else the
    experiment's host of the step's role, else the inventory's only host of that role; a controller step without a
    declared controller runs on this machine, its workdir under `state_dir` (required for such a step)."""
    hosts: dict[str, Host] = {}
    unplaced: dict[str, str] = {}
    for step in steps:
        try:
            hosts[step] = _resolve(experiment, inventory, step, state_dir)
        except ConfigError as exc:
            unplaced[step] = str(exc)
    return Placement(hosts=hosts, unplaced=unplaced)


def _controller_host(inventory: Inventory, state_dir: Path | None) -> Host:
    """The inventory's controller host, or an implicit local one under the state dir."""
    declared = inventory.by_role("controller")
    if declared:
        return declared[0]
    assert state_dir is not None, "place: a controller step needs the state dir (its implicit host's workdir)"
    return Host(name=CONTROLLER, role="controller", transport="local", workdir=str(state_dir / "controller"))


def _resolve(experiment: Experiment, inventory: Inventory, step_name: str, state_dir: Path | None) -> Host:
    override = experiment.steps.get(step_name)
    if override is not None and override.host:
        return inventory.get(override.host)
    role = pipeline.known_step(step_name).role
    if role == "controller":
        return _controller_host(inventory, state_dir)
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
