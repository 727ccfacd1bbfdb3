"""A run of one experiment: host resolution, transports, data, and the bookkeeping around every step.

`RunSession` is the core the Prefect tasks adapt (each task re-opens the session by run id, so a task is
self-contained across retries and processes). Everything a run needs to be executed again is recorded when it
starts: the experiment and inventory as they were, the plan, the trigger and the parent run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alignflow import pipeline
from alignflow.config.experiment import Experiment, check_hosts, load_experiment
from alignflow.config.hosts import Host, Inventory, load_hosts
from alignflow.errors import ConfigError, FingerprintMismatch, PipelineError
from alignflow.fingerprint import Fingerprinter, HashMemo
from alignflow.runner.artifacts import ArtifactRef
from alignflow.runner.cache import code_version_for

log = logging.getLogger(__name__)

CONTROLLER = "controller"
Events = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How a run was asked for."""

    from_step: str | None = None
    only: tuple[str, ...] = ()
    force: tuple[str, ...] = ()
    parent: str | None = None
    trigger: str = "cli"
    reuse_parent: bool = False  # take the parent's artifacts for steps that are not re-executed
    reproduce_of: str | None = None  # re-execute this run's recorded experiment, every step forced

    def to_dict(self) -> dict[str, Any]:
        return {"from_step": self.from_step, "only": list(self.only), "force": list(self.force),
                "parent": self.parent, "trigger": self.trigger, "reuse_parent": self.reuse_parent,
                "reproduce_of": self.reproduce_of}


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What happened to one step of a run."""

    step: str
    status: str  # ran | cached | failed | skipped
    artifacts: dict[str, ArtifactRef] = field(default_factory=dict)
    step_run_id: str | None = None
    cache_key: str | None = None
    verdict: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "status": self.status, "step_run_id": self.step_run_id,
                "cache_key": self.cache_key, "verdict": self.verdict,
                "artifacts": {k: v.to_dict() for k, v in self.artifacts.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepOutcome:
        return cls(step=data["step"], status=data["status"], step_run_id=data.get("step_run_id"),
                   cache_key=data.get("cache_key"), verdict=data.get("verdict"),
                   artifacts={k: ArtifactRef.from_dict(v) for k, v in data.get("artifacts", {}).items()})


def default_state_dir() -> Path:
    """`$ALIGNFLOW_STATE_DIR`, else `./.alignflow` (resolved at call time; see `alignflow.state`)."""
    from alignflow.state import state_dir

    return state_dir()


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


def prepare_data(experiment: Experiment, *, memo: HashMemo | None) -> ArtifactRef:
    """The data file on the controller: generated when the experiment says how and it is absent; its sha256
    checked against the declared one (a different file must never be trained on silently)."""
    path = experiment.resolve_path(experiment.data.path)
    if not path.exists():
        gen = experiment.data.generate
        if gen is None:
            raise ConfigError(f"{experiment.source}: data.path {path} does not exist and data.generate is not set")
        from alignflow.reference.data import make_data

        log.info("generating %d tokens of twin data into %s", gen.tokens, path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            sha256 = make_data(path, gen.tokens, gen.seed)  # invalid settings raise ConfigError
        except OSError as exc:
            raise PipelineError(f"{experiment.source}: cannot generate data.path {path}: {exc}") from exc
        size = path.stat().st_size
    else:
        fp = Fingerprinter(memo).fingerprint(path)
        sha256, size = fp.sha256, fp.size
    declared = experiment.data.sha256
    if declared is not None and sha256 != declared:
        raise FingerprintMismatch(
            f"{path}: sha256 {sha256} differs from the declared data.sha256 {declared}; "
            "both sides must read the same data file", expected=declared, actual=sha256)
    return ArtifactRef(name="data", host=CONTROLLER, path=str(path), sha256=sha256, size=size, kind="data")


def load_run_inputs(experiment_path: str | Path, hosts_path: str | Path) -> tuple[Experiment, Inventory]:
    """Load and cross-check the experiment and the inventory."""
    inventory = load_hosts(hosts_path)
    experiment = load_experiment(experiment_path, inventory)
    check_hosts(experiment, inventory)
    return experiment, inventory


def plan_for(experiment: Experiment, options: RunOptions) -> pipeline.Plan:
    gate = experiment.gate.enabled
    if gate is None:
        gate = experiment.npu.kind != "reference" or experiment.gpu.kind != "reference"
    return pipeline.plan(enabled_optional=["early_gate"] if gate else [], from_step=options.from_step,
                         only=options.only, force=options.force)


def compare_code_version() -> str:
    return code_version_for(("logs", "compare"))
