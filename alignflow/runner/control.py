"""Controlling the jobs of a run from outside the step that launched them (cancellation, re-attachment)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from alignflow.runner.run import reopen

log = logging.getLogger(__name__)


def attach_jobs(store: Any, step_run_id: str, handles: Sequence[Any]) -> None:
    """Record several jobs (on their own hosts) as one step run's job, e.g. the early gate's two sides, so that
    cancelling the run finds and kills every one of them."""
    store.attach_job(step_run_id, job_dir=" | ".join(h.job_dir for h in handles),
                     handle={"jobs": [h.to_dict() for h in handles]})


def recorded_jobs(doc: Mapping[str, Any]) -> list[Any]:
    """The job handles of a step run's recorded job document (one job, or `attach_jobs`'s several)."""
    from alignflow.transport import JobHandle

    return [JobHandle.from_dict(d) for d in doc["jobs"]] if "jobs" in doc else [JobHandle.from_dict(doc)]


def cancel_run_jobs(store: Any, run_id: str, *, transport_factory: Any) -> list[str]:
    """Kill the process group of every job of `run_id` still recorded as running; returns the job dirs."""
    _, inventory, _, _ = reopen(run_id, store=store)
    killed = []
    for sr in store.steps(run_id):
        if sr.status != "running" or not sr.job_handle:
            continue
        for handle in recorded_jobs(sr.job_handle):
            transport = transport_factory(inventory.get(handle.host))
            try:
                transport.cancel(handle)
                killed.append(handle.job_dir)
            finally:
                transport.close()
        store.finish_step(sr.id, status="failed", exit_code=None, stdout_tail="", stderr_tail="",
                          error="cancelled: the flow run was cancelled; the remote job was killed")
    store.finish_run(run_id, status="cancelled", verdict=None, report=None, error="cancelled")
    return killed
