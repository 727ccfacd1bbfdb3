"""What the Prefect UI shows of an alignflow run: final states that carry the verdict, names that say which run.

- A run whose verdict is **pass** ends `Completed`; a finished run whose verdict is **fail** ends in a Failed-type
  state named `Not aligned` whose message is the verdict's reasons (each failed criterion with its value), so
  the runs list shows red rows for the nights that failed; a run that **could not finish** ends `Failed` with
  its cause (Prefect itself marks a run whose process died `Crashed`); a run **cancelled** (Ctrl-C, `alignflow
  cancel`, the UI's Cancel) ends `Cancelled`, as the store records it.
- A step alignflow reused (its cache, or the parent run's artifacts) ends in Prefect's own `Cached` state, whose
  message names the run it was reused from (`tasks.steps.step_state`).
- Flow runs are named `align-<experiment>-<run id>` (`-rerun-<step>`, `-reproduce`); task runs
  `<step> @ <host>`.

The states are built here and returned by the flow and the step task (a returned state is the run's final state:
https://docs.prefect.io/v3/concepts/states). No `from __future__ import annotations`
(docs/orchestration.md#g4-no-future-annotations-in-flow-modules).
"""

import logging

from prefect.client.schemas.objects import State
from prefect.states import Cancelled, Completed, Failed
from pydantic import JsonValue

from alignflow.errors import AlignflowError
from alignflow.runner.session import RunOptions
from alignflow.runview import RunView

log = logging.getLogger(__name__)

NOT_ALIGNED = "Not aligned"
NOT_STARTED = "Not started"
MAX_MESSAGE = 2000  # characters of a state message (the UI shows it on the run's page and in tooltips)


class NotAligned(Exception):
    """Raised to an in-process caller of the flow when the run finished with verdict fail; `record` is the run
    (`RunView.model_dump(mode="json")`). A verdict is not an error of alignflow: the run itself completed."""

    def __init__(self, message: str, record: dict[str, JsonValue]) -> None:
        super().__init__(message)
        self.record = record


def _clip(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def verdict_message(view: RunView) -> str:
    """Why the verdict is fail: the comparison's reasons, else every failed criterion with its value."""
    if view.reasons:
        return "; ".join(view.reasons)
    failed = [f"{c.label}: {c.value_text}" for c in view.criteria if not c.passed]
    return "; ".join(failed) or "verdict fail"


def run_state(view: RunView) -> State[object]:
    """The flow run's final state for the finished alignflow run `view`."""
    record = view.model_dump(mode="json")
    if view.status == "cancelled":
        why = (view.error or "cancelled").removeprefix("cancelled").lstrip(": ")
        return Cancelled(message=_clip(f"run {view.run_id} cancelled" + (f": {why}" if why else "")))
    if view.status in ("failed", "error"):  # error: a configuration or environment cause (runner.run.failure_status)
        how = "failed" if view.status == "failed" else "error (configuration or environment)"
        message = f"run {view.run_id} {how}: {view.error or 'no error recorded'}"
        return Failed(message=_clip(message), data=AlignflowError(message))
    if view.verdict == "fail":
        message = _clip(f"run {view.run_id}: {verdict_message(view)}")
        return Failed(name=NOT_ALIGNED, message=message, data=NotAligned(message, record))
    if view.verdict == "pass":
        return Completed(message=f"run {view.run_id}: aligned, {len(view.criteria)} criteria pass", data=record)
    return Completed(message=f"run {view.run_id}: {view.status}; no comparison in its plan", data=record)


def not_started_state(exc: AlignflowError) -> State[object]:
    """The state of a flow run whose alignflow run could not even be recorded (bad parameters, parent...)."""
    return Failed(name=NOT_STARTED, message=_clip(str(exc)), data=exc)


def flow_run_name(experiment: str, run_id: str | None, options: RunOptions) -> str:
    """`align-<experiment>-<run id>`, `...-rerun-<step>` for a re-run of a parent's step, `...-reproduce`."""
    name = f"align-{experiment}" + (f"-{run_id}" if run_id else "")
    if options.reproduce_of:
        return f"{name}-reproduce"
    if options.parent and options.force:
        return f"{name}-rerun-{options.force[0]}"
    return name


def name_current_flow_run(name: str) -> None:
    """Rename the flow run this code runs in (a UI launch learns its alignflow run id only once it is recorded)."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    if not flow_run.id or flow_run.name == name:
        return
    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, name=name)
    log.info("flow run %s is %s", flow_run.id, name)
