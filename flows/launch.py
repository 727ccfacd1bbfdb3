"""The alignment flow as the Prefect UI launches it: typed parameters that render as a form.

`flows.alignment.alignment` takes file paths, which suit the CLI; a person in the UI picks an experiment by name.
`build_alignment_flow` makes a flow (same name, `alignment`, so every alignment run is listed together) whose
parameters are:

- `experiment`: an enum of the catalog's names, built when the deployment is made (a dropdown in the UI; the
  server refuses any other value because the deployment enforces its parameter schema);
- `steps`: a `StepSelection` (from-step, only, force; step names are an enum of the pipeline's steps);
- `parent`: an optional `ParentRun` (a run id whose artifacts the new run may reuse).

Constrained values sit inside pydantic models: Prefect enforces those, not a top-level `Field(ge=...)`
(orchestration reference G5). No `from __future__ import annotations` in this module: Prefect builds the form
from the real annotations (G4). The flow function is made per catalog, so the served process pickles it by value
into each flow run's subprocess, enum included.
"""

import enum
from pathlib import Path
from typing import Any

from prefect import Flow, flow
from pydantic import BaseModel, ConfigDict, Field

from alignflow import pipeline
from alignflow.config.catalog import ExperimentCatalog
from flows.alignment import alignment as alignment_flow
from flows.hooks import kill_remote_jobs

StepName = enum.StrEnum("StepName", {name: name for name in pipeline.STEP_NAMES})  # type: ignore[misc]
StepName.__doc__ = "A pipeline step."


class StepSelection(BaseModel):
    """Which steps run. Everything else still comes from the cache when its inputs are unchanged."""

    model_config = ConfigDict(extra="forbid")

    from_step: StepName | None = Field(None, description="Re-execute this step and every step after it.")
    only: list[StepName] = Field(
        default_factory=list, description="Run only these steps (their inputs must come from the cache or the parent)."
    )
    force: list[StepName] = Field(
        default_factory=list, description="Re-execute these steps and what depends on them, even when cached."
    )


class ParentRun(BaseModel):
    """An earlier alignflow run that this run re-runs part of."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(pattern=r"^[0-9a-f]{4,12}$", description="alignflow run id (or a unique prefix of 4+).")
    reuse_artifacts: bool = Field(True, description="Take the parent's artifacts for steps that are not re-executed.")


def _field(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def _plain(value: Any) -> Any:
    return getattr(value, "value", value)


def launch_run_name() -> str:
    """`align-<experiment>` (`-rerun-<step>` when a parent's step is forced), like the CLI's runs."""
    from prefect.runtime import flow_run

    params = flow_run.parameters  # validated objects in the flow process, JSON where only the API's copy exists
    name = _plain(params.get("experiment")) or "experiment"
    force = _field(params.get("steps") or {}, "force") or []
    extra = f"-rerun-{_plain(force[0])}" if params.get("parent") and force else ""
    return f"align-{name}{extra}"


def run_alignment(experiment_file: Path, hosts: Path, steps: StepSelection, parent: ParentRun | None,
                  trigger: str = "deployment") -> dict[str, Any]:
    """The body of every launch: the alignment flow's own body, in this flow run (no nested subflow run, so the
    run's artifacts and logs are on the page the UI opens)."""
    result: dict[str, Any] = alignment_flow.fn(
        experiment=str(experiment_file), hosts=str(hosts),
        from_step=steps.from_step.value if steps.from_step else None,
        only=[s.value for s in steps.only] or None, force=[s.value for s in steps.force] or None,
        parent_run=parent.run_id if parent else None, reuse_parent=bool(parent and parent.reuse_artifacts),
        trigger=trigger,
    )
    return result


def experiment_enum(catalog: ExperimentCatalog) -> type[enum.StrEnum]:
    """The catalog's names as an enum (JSON schema: `{"enum": [...]}`, a dropdown in the UI)."""
    made: type[enum.StrEnum] = enum.StrEnum("ExperimentName", {n: n for n in catalog.names})  # type: ignore[misc]
    # A top-level parameter's description is not rendered from `Annotated` metadata; the enum's is.
    made.__doc__ = f"The experiment to run: a file of {catalog.directory.name}/ (<name>.yaml)."
    return made


def build_alignment_flow(catalog: ExperimentCatalog, hosts: Path) -> Flow[..., dict[str, Any]]:
    """The UI-facing alignment flow for this catalog and inventory."""
    ExperimentName = experiment_enum(catalog)
    files = {name: path for name, path in catalog.files}
    inventory = Path(hosts).resolve()

    def alignment(
        experiment: ExperimentName,  # type: ignore[valid-type]  # a class made at run time, on purpose
        steps: StepSelection = StepSelection(),  # noqa: B008 - Prefect reads defaults from the signature
        parent: ParentRun | None = None,
    ) -> dict[str, Any]:
        """Run one alignment experiment end to end: NPU base training, bf16 and Megatron conversion, both
        trainings from the same weights, comparison. Returns the run record (as `alignflow show --json`)."""
        return run_alignment(files[experiment.value], inventory, steps, parent)  # type: ignore[attr-defined]

    return flow(name="alignment", flow_run_name=launch_run_name, on_cancellation=[kill_remote_jobs],
                on_crashed=[kill_remote_jobs], log_prints=True)(alignment)
