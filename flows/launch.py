"""The alignment flow as the Prefect UI launches it: typed parameters that render as a clean form.

`flows.alignment.alignment` takes file paths, which suit the CLI; a person in the UI picks an experiment by name.
`build_alignment_flow` makes a flow (same name, `alignment`, so every alignment run is listed together) whose
parameters are:

- `experiment`: an enum of the catalog's names, built when the deployment is made (a dropdown in the UI; the
  server refuses any other value because the deployment enforces its parameter schema); `demo`, the experiment
  `make demo` runs, comes first and is pre-selected when the catalog has it;
- `steps`: a `StepSelection` (re-execute from, only, force) whose step names are the steps a launch can select for
  at least one served experiment, as the planner says (`runnable_steps`: the steps each experiment's pipeline has,
  derived from its checkpoint formats, `alignflow.backends.pipeline_for`; an optional step a launch names is enabled
  for that run, `Pipeline.plan`). The names are inline enums (`Literal`), so
  each dropdown is labelled with its own field's title: the UI names a select after the title of its item schema,
  which for a shared enum definition was `StepName` twice (`Select StepName`);
- `parent`: a `ParentRun` (a run id whose artifacts the new run may reuse; empty for none). The id is checked
  against the store when the run starts (`alignflow.runner.run.check_parent`): an unknown id or a run of another
  experiment ends the flow run `Not started`, its message listing the experiment's recent runs.

Every field has a title and a description; optional fields are left out of the schema's `null` branch
(`SkipJsonSchema[None]`), so the form shows the field itself, not a toggle between it and "None" (issue 19).
Constrained values sit inside pydantic models: Prefect enforces those, not a top-level `Field(ge=...)`
(docs/orchestration.md#g5-top-level-field-constraints-are-not-enforced). No `from __future__ import annotations` in
this module: Prefect builds the form from the real annotations
(docs/orchestration.md#g4-no-future-annotations-in-flow-modules). The flow function is made per catalog, so the
served process pickles it by value into each flow run's subprocess, enum included.
"""

import enum
from pathlib import Path
from typing import Annotated, Any, Literal

from prefect import Flow, flow
from prefect.client.schemas.objects import State
from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, StringConstraints, model_serializer
from pydantic.json_schema import SkipJsonSchema

from alignflow import pipeline
from alignflow.config.catalog import ExperimentCatalog
from alignflow.runner.session import RunOptions
from flows.alignment import alignment as alignment_flow
from flows.hooks import kill_remote_jobs
from flows.states import flow_run_name

DEFAULT_EXPERIMENT = "demo"  # the one `make demo` runs: first in the dropdown, and pre-selected
RunId = Annotated[str, StringConstraints(pattern=r"^([0-9a-f]{4,12})?$")]  # empty: no parent (a cleared field)


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


class FormModel(BaseModel):
    """A sub-form whose empty optional fields are left out of the JSON it is sent as (and of its defaults).

    The UI pre-fills a form from the parameter's default and posts every key it holds; the server validates the
    posted values against the schema, where an optional field is its type alone (no `null` branch, which the UI
    would render as a type toggle). A `null` would then be refused (409), so a `None` is never written."""

    model_config = ConfigDict(extra="forbid")

    @model_serializer(mode="wrap")
    def _without_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


def step_selection(steps: tuple[str, ...]) -> type[FormModel]:
    """The `steps` sub-form, offering `steps`."""
    StepChoice: Any = Literal[steps]  # an inline enum in the schema, under each field's own title

    class StepSelection(FormModel):
        """Which steps run. Everything else still comes from the cache when its inputs are unchanged."""

        model_config = ConfigDict(extra="forbid", title="Steps")

        from_step: StepChoice | SkipJsonSchema[None] = Field(
            None, title="Re-execute from", description="Re-execute this step and every step after it (empty: none).",
            json_schema_extra=_no_default)
        only: list[StepChoice] = Field(
            default_factory=list, title="Only these steps",
            description="Run only these steps (their inputs must come from the cache or the parent run).")
        force: list[StepChoice] = Field(
            default_factory=list, title="Force",
            description="Re-execute these steps and what depends on them, even when cached.")

    return StepSelection


StepSelection = step_selection(pipeline.STEP_NAMES)  # every step (a launch's form narrows it to its catalog)


def runnable_steps(catalog: ExperimentCatalog, hosts: Path) -> tuple[str, ...]:
    """The steps a launch can select (`only`, `force`, `from`) for at least one experiment of the catalog, in
    pipeline order: whatever the planner accepts (`alignflow.runner.session.plan_for`)."""
    from alignflow.errors import AlignflowError
    from alignflow.runner.session import load_run_inputs, plan_for

    experiments = [load_run_inputs(path, hosts)[0] for _, path in catalog.files]
    runnable = []
    for name in pipeline.STEP_NAMES:
        for experiment in experiments:
            try:
                plan_for(experiment, RunOptions(only=(name,)))
            except AlignflowError:
                continue
            runnable.append(name)
            break
    return tuple(runnable)


class ParentRun(FormModel):
    """An earlier alignflow run of the same experiment that this run re-runs part of (empty: none)."""

    model_config = ConfigDict(extra="forbid", title="Parent run")

    run_id: RunId | SkipJsonSchema[None] = Field(
        None, title="Run id",
        description="The alignflow run id, as the runs list names runs (align-EXPERIMENT-RUNID), or a unique "
                    "prefix of 4+ characters; empty: no parent.", json_schema_extra=_no_default)
    reuse_artifacts: bool = Field(
        True, title="Reuse its artifacts", description="Take the parent's artifacts for steps that are not "
                                                        "re-executed.")


def _field(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def _plain(value: Any) -> Any:
    return getattr(value, "value", value)


def launch_run_name() -> str:
    """`align-<experiment>` (`-rerun-<step>` when a parent's step is forced) until the run is recorded; the flow
    then renames itself `align-<experiment>-<run id>...` (`flows.states`)."""
    from prefect.runtime import flow_run

    params = flow_run.parameters  # validated objects in the flow process, JSON where only the API's copy exists
    force = tuple(_plain(s) for s in (_field(params.get("steps") or {}, "force") or []))
    parent = _field(params.get("parent") or {}, "run_id")
    return flow_run_name(str(_plain(params.get("experiment")) or "experiment"), None,
                         RunOptions(force=force, parent=parent))


def run_alignment(experiment_file: Path, hosts: Path, steps: FormModel, parent: ParentRun | None,
                  trigger: str = "deployment") -> State[object]:
    """The body of every launch: the alignment flow's own body, in this flow run (no nested subflow run, so the
    run's artifacts, logs and final state are on the page the UI opens)."""
    run_id = (parent.run_id if parent else None) or None
    chosen: Any = steps
    state: State[object] = alignment_flow.fn(
        experiment=str(experiment_file), hosts=str(hosts),
        from_step=_plain(chosen.from_step) or None,
        only=[_plain(s) for s in chosen.only] or None, force=[_plain(s) for s in chosen.force] or None,
        parent_run=run_id, reuse_parent=bool(run_id and parent and parent.reuse_artifacts),
        trigger=trigger,
    )
    return state


def experiment_enum(catalog: ExperimentCatalog) -> type[enum.StrEnum]:
    """The catalog's names as an enum (JSON schema: `{"enum": [...]}`, a dropdown in the UI), the demo first."""
    names = sorted(catalog.names, key=lambda n: n != DEFAULT_EXPERIMENT)  # stable: the catalog's order otherwise
    made: type[enum.StrEnum] = enum.StrEnum("ExperimentName", {n: n for n in names})  # type: ignore[misc]
    # No angle brackets: the UI renders descriptions as sanitised HTML, where `<name>` would vanish.
    made.__doc__ = f"An experiment file of {catalog.directory.name}/ (NAME.yaml)."
    return made


def build_alignment_flow(catalog: ExperimentCatalog, hosts: Path) -> Flow[..., State[object]]:
    """The UI-facing alignment flow for this catalog and inventory."""
    ExperimentName = experiment_enum(catalog)
    files = {name: path for name, path in catalog.files}
    inventory = Path(hosts).resolve()
    names = ", ".join(catalog.names)
    Steps = step_selection(runnable_steps(catalog, inventory))
    # Top-level parameters: Prefect takes a `Field` default's description, and its title from json_schema_extra.
    about = f"The experiment to run ({names}); each is a file of {catalog.directory.name}/."
    experiment_field: Any = (
        Field(ExperimentName(DEFAULT_EXPERIMENT), description=about, json_schema_extra={"title": "Experiment"})
        if DEFAULT_EXPERIMENT in catalog.names else Field(description=about, json_schema_extra={"title": "Experiment"}))
    steps_field: Any = Field(
        Steps(), description="Which steps run; the others come from the cache or the parent run.",
        json_schema_extra={"title": "Steps"})
    parent_field: Any = Field(
        ParentRun(), description="An earlier run of this experiment to re-run part of (empty: none).",
        json_schema_extra={"title": "Parent run"})

    def alignment(
        experiment: ExperimentName = experiment_field,  # type: ignore[valid-type]  # a class made at run time
        steps: Steps = steps_field,  # type: ignore[valid-type]
        parent: ParentRun = parent_field,
    ) -> State[object]:
        """Run one alignment experiment end to end: NPU base training, bf16 and Megatron conversion, both
        trainings from the same weights, comparison. Ends Completed (aligned), Not aligned (verdict fail, the
        failed criteria in its message) or Failed (with the cause); the result is the run record."""
        return run_alignment(files[experiment.value], inventory, steps, parent)  # type: ignore[attr-defined]

    return flow(name="alignment", flow_run_name=launch_run_name, on_cancellation=[kill_remote_jobs],
                on_crashed=[kill_remote_jobs], log_prints=True)(alignment)
