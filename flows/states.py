"""What the Prefect UI shows of an alignflow run: final states that carry the verdict, names that say which run.

- A run whose verdict is **pass** ends `Completed`; a finished run whose verdict is **fail** ends in a Failed-type
  state named `Not aligned` whose message is the verdict's reasons (each failed criterion with its value), so
  the runs list shows red rows for the nights that failed; a run that **could not finish** ends `Failed` with
  its cause (Prefect itself marks a run whose process died `Crashed`); a run **cancelled** (Ctrl-C, `alignflow
  cancel`, the UI's Cancel) ends `Cancelled`, as the store records it.
- A step alignflow reused (its cache, or the parent run's artifacts) ends in Prefect's own `Cached` state, whose
  message names the run it was reused from (`tasks.steps.step_state`).
- Flow runs are named `align-<experiment>-<run id>` (`-rerun-<step>`, `-reproduce`); task runs
  `<step> @ <host>`. A name typed in the run form's Run Name is kept (`given_name`), and the run's log says which
  alignflow run it is.

The states are built here and returned by the flow and the step task (a returned state is the run's final state:
https://docs.prefect.io/v3/concepts/states). No `from __future__ import annotations`
(docs/orchestration.md#g4-no-future-annotations-in-flow-modules).
"""

import logging
import re

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


# The name Prefect gives a flow run nobody named (coolname's `adjective-animal`, the server's and the UI form's
# default), and alignflow's own: a flow run named otherwise was named by a person, in the form's Run Name.
GENERATED_NAME = re.compile(r"[a-z]+-[a-z]+")
OWN_PREFIX = "align-"


def given_name(current: str | None) -> str | None:
    """The flow run's name when a person gave it (kept, issue 47: the form's Run Name was silently replaced), None
    when Prefect generated it or alignflow did (then alignflow names the run)."""
    if not current or current.startswith(OWN_PREFIX) or GENERATED_NAME.fullmatch(current):
        return None
    return current


def name_current_flow_run(name: str, say: "logging.Logger | logging.LoggerAdapter[logging.Logger] | None" = None
                          ) -> str:
    """Name the flow run this code runs in (a UI launch learns its alignflow run id only once it is recorded) and
    say so on its log (`say`), so that the log Prefect prints (`serve`'s included) names the run as the CLI and the UI
    do, not by the run-id-less name Prefect started it with (issue 47: `serve`'s log said just `align-demo`). A name
    a person gave is kept, the log naming the alignflow run. Returns the flow run's name."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext
    from prefect.runtime import flow_run

    current = flow_run.name
    if not flow_run.id or current == name:
        return name
    if (kept := given_name(current)) is not None:
        if say is not None:
            say.info("flow run %r keeps the name it was given; it is alignflow's %s", kept, name)
        return kept
    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, name=name)
    ctx = FlowRunContext.get()
    if ctx is not None and ctx.flow_run is not None:
        ctx.flow_run.name = name  # run loggers made from now on (get_run_logger) carry the full name
    if say is not None:
        say.info("flow run %r is %s", current, name)
    log.info("flow run %s is %s", flow_run.id, name)
    return name
