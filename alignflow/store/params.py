"""What a run was started with, as typed records, and their one codec into the store (`runs.params`).

A run records everything it needs to be executed again when it starts: the experiment and the inventory as they
were, how it was asked for (`RunOptions`), the steps it walks (`pipeline.Plan`) and where each step runs
(`Placement`, decided once by `alignflow.config.placement.place`). `RunParams` holds them; a noise-floor
measurement (`alignflow.diagnose.noise`) is a run of its own kind (`NoiseRunParams`).

The codec is the only place that reads or writes the stored document, versioned so that a run recorded by an
older alignflow still opens:

- version 1 (no `version` key; alignflow up to issue 34): `experiment_path`, `hosts_path`, `experiment`,
  `inventory`, `options`, `plan` (`reuse_only` added later), `state_dir` — no placement: it was worked out again
  each time a step needed its host, so reading a version 1 run places its steps from its recorded experiment and
  inventory, as that alignflow did; a noise run's document was `{"runs": N}`.
- version 2: `{"version": 2, "kind": "alignment" | "noise", ...}` the fields of the models below, placement
  included.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter, ValidationError, field_serializer

from alignflow import pipeline
from alignflow.config.experiment import Experiment
from alignflow.config.hosts import Inventory
from alignflow.config.placement import Placement, place
from alignflow.errors import StoreError

PARAMS_VERSION = 2


class RunOptions(BaseModel):
    """How a run was asked for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    from_step: str | None = Field(None, description="re-execute this step and everything after it")
    only: tuple[str, ...] = Field((), description="run only these steps (their upstream ones are reused)")
    force: tuple[str, ...] = Field((), description="re-execute these steps and what depends on them")
    parent: str | None = Field(None, description="the run this one re-runs (its artifacts may be reused)")
    trigger: str = Field("cli", description="what started the run: cli, rerun, reproduce, prefect, nightly, ...")
    reuse_parent: bool = Field(False, description="take the parent's artifacts for steps not re-executed")
    reproduce_of: str | None = Field(None, description="re-execute this run's recorded experiment, every step "
                                                       "forced")
    recorded_from: str | None = Field(None, description="run this run's recorded experiment and inventory (not "
                                                        "the files as they are now)")


class RunParams(BaseModel):
    """The parameters of an alignment run, as recorded when it started."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["alignment"] = "alignment"
    experiment_path: str = Field(description="the experiment file, resolved")
    hosts_path: str = Field(description="the inventory file, resolved")
    state_dir: str = Field(description="the state dir the run was started in")
    experiment: Experiment = Field(description="the experiment as the run read it")
    inventory: Inventory = Field(description="the inventory as the run read it")
    options: RunOptions = Field(default_factory=RunOptions, description="how the run was asked for")
    plan: pipeline.Plan = Field(description="the steps the run walks, forced and reuse-only ones")
    placement: Placement = Field(description="the host of each step, decided when the run started")

    @field_serializer("plan")
    def _plan_doc(self, plan: pipeline.Plan) -> dict[str, list[str]]:
        # sets in a fixed order: the same plan is the same document
        return {"steps": list(plan.steps), "forced": sorted(plan.forced), "reuse_only": sorted(plan.reuse_only)}


class NoiseRunParams(BaseModel):
    """The parameters of a noise-floor measurement (`alignflow.diagnose.noise`): how many repeated trainings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["noise"] = "noise"
    runs: int = Field(ge=1, description="how many times the GPU training was repeated")


StoredParams = Annotated[RunParams | NoiseRunParams, Field(discriminator="kind")]
_STORED: TypeAdapter[RunParams | NoiseRunParams] = TypeAdapter(StoredParams)
# a version 1 plan may lack `reuse_only` (added later): the dataclass's default fills it
_PLAN: TypeAdapter[pipeline.Plan] = TypeAdapter(pipeline.Plan)


def encode_params(params: RunParams | NoiseRunParams) -> dict[str, JsonValue]:
    """The document the store keeps for `params` (the current version)."""
    return {"version": PARAMS_VERSION, **params.model_dump(mode="json")}


def decode_params(doc: Mapping[str, JsonValue], *, run: str) -> RunParams | NoiseRunParams:
    """The parameters of run `run` from its stored document, of any version this alignflow knows; `StoreError`
    naming the run when the document does not read (a newer version, or a record this alignflow cannot
    validate)."""
    version = doc.get("version", 1)
    try:
        if version == 1:
            params = _from_version_1(doc, run=run)
        elif version == PARAMS_VERSION:
            params = _STORED.validate_python({k: v for k, v in doc.items() if k != "version"})
        else:
            raise StoreError(f"run {run}: its parameters are of version {version!r}, which this alignflow does not "
                             f"read (it reads 1 to {PARAMS_VERSION}); upgrade alignflow")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise StoreError(f"run {run}: its recorded parameters do not read with this alignflow ({where}: "
                         f"{first['msg']}; {exc.error_count()} problem(s))") from None
    return _with_sources(params)


def experiment_file(doc: Mapping[str, JsonValue]) -> str | None:
    """The experiment file a stored document names (every version keeps it as `experiment_path`), without
    validating the rest: listings show it for runs whose experiment this alignflow no longer reads."""
    path = doc.get("experiment_path")
    return path if isinstance(path, str) else None


def _with_sources(params: RunParams | NoiseRunParams) -> RunParams | NoiseRunParams:
    """The experiment and inventory know the files they were read from (relative paths resolve against them)."""
    if isinstance(params, NoiseRunParams):
        return params
    return params.model_copy(update={
        "experiment": params.experiment.model_copy(update={"source": params.experiment_path}),
        "inventory": params.inventory.model_copy(update={"source": params.hosts_path})})


def _from_version_1(doc: Mapping[str, JsonValue], *, run: str) -> RunParams | NoiseRunParams:
    if "experiment" not in doc:
        if set(doc) == {"runs"}:
            return NoiseRunParams.model_validate({"runs": doc["runs"]})
        raise StoreError(f"run {run}: its parameters name neither an experiment nor noise runs "
                         f"(keys: {', '.join(sorted(doc)) or 'none'})")
    if not isinstance(doc.get("state_dir"), str):
        raise StoreError(f"run {run}: its version 1 parameters lack the state dir")
    experiment_path, hosts_path = str(doc["experiment_path"]), str(doc["hosts_path"])
    experiment = Experiment.model_validate(doc["experiment"]).model_copy(update={"source": experiment_path})
    inventory = Inventory.model_validate(doc["inventory"]).model_copy(update={"source": hosts_path})
    raw_options = doc.get("options")
    # version 1 wrote every option, unset ones as null (`trigger` too, in the first runs)
    options = {k: v for k, v in raw_options.items() if v is not None} if isinstance(raw_options, Mapping) else {}
    return RunParams(
        experiment_path=experiment_path, hosts_path=hosts_path, state_dir=str(doc["state_dir"]),
        experiment=experiment, inventory=inventory, options=RunOptions.model_validate(options),
        plan=_PLAN.validate_python(doc["plan"]),
        placement=place(experiment, inventory, state_dir=Path(str(doc["state_dir"]))))

