"""Controlling the jobs of a run from outside the step that launched them (cancellation, re-attachment)."""

from __future__ import annotations

import logging
from typing import Any

from alignflow.runner.run import reopen

log = logging.getLogger(__name__)


def cancel_run_jobs(store: Any, run_id: str, *, transport_factory: Any) -> list[str]:
    """Kill the process group of every job of `run_id` still recorded as running; returns the job dirs."""
    from alignflow.transport import JobHandle

    _, inventory, _, _ = reopen(run_id, store=store)
    killed = []
    for sr in store.steps(run_id):
        if sr.status != "running" or not sr.job_handle:
            continue
        handle = JobHandle.from_dict(sr.job_handle)
        transport = transport_factory(inventory.get(sr.host))
        try:
            transport.cancel(handle)
            killed.append(handle.job_dir)
        finally:
            transport.close()
        store.finish_step(sr.id, status="failed", exit_code=None, stdout_tail="", stderr_tail="",
                          error="cancelled: the flow run was cancelled; the remote job was killed")
    store.finish_run(run_id, status="cancelled", verdict=None, report=None, error="cancelled")
    return killed
