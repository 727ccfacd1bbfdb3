"""Flow-run state hooks: cancelling or crashing a flow run kills the remote jobs of its alignflow run.

Hooks are called with the keyword arguments `flow, flow_run, state`
(docs/orchestration.md#g7-state-hooks-get-keyword-arguments). The flow writes
`<state>/flow-runs/<flow run id>` with its alignflow run id as soon as the run exists, so the hook can find the
job handles recorded in the store even when the flow process is gone.
"""

from pathlib import Path
from typing import TYPE_CHECKING

from alignflow.runner.control import cancel_run_jobs
from tasks.context import open_store, state_dir, transport_factory

if TYPE_CHECKING:
    from prefect import Flow
    from prefect.client.schemas.objects import FlowRun, State


def _marker(flow_run_id: object) -> Path:
    return state_dir() / "flow-runs" / str(flow_run_id)


def remember_run(ctx: object, run_id: str) -> None:
    """Note which alignflow run the flow run `ctx` (a Prefect run context; None outside a flow) drives."""
    flow_run = getattr(ctx, "flow_run", None)
    if flow_run is None:
        return
    path = _marker(flow_run.id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(run_id)


def kill_remote_jobs(flow: "Flow[..., object]", flow_run: "FlowRun", state: "State[object]") -> None:
    """Cancel every job of the run that is still recorded as running (none if the flow did so as it stopped)."""
    marker = _marker(flow_run.id)
    if not marker.exists():
        return
    run_id = marker.read_text().strip()
    cancel_run_jobs(open_store(), run_id, transport_factory=transport_factory())

