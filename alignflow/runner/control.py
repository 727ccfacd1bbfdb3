"""Controlling the jobs of a run from outside the step that launched them (cancellation)."""

from __future__ import annotations

import logging

from alignflow.errors import ImmutableRecord
from alignflow.runner.engine import TransportFactory, note_cancelled
from alignflow.runner.recording import recorded_jobs
from alignflow.runner.session import open_run
from alignflow.store import Store
from alignflow.store.records import RunStatus, StepStatus

log = logging.getLogger(__name__)


def cancel_run_jobs(store: Store, run_id: str, *, transport_factory: TransportFactory,
                    why: str = "the run was cancelled") -> list[str]:
    """Kill the process group of every job of `run_id` still recorded as running, record those steps (`why` in
    their error) and the run cancelled; returns the job dirs. A run no longer running has nothing to cancel (its
    controller may have cancelled it as it stopped, between a caller's look and this call): []. The runs of its
    switch matrix (children with trigger `matrix`) are cancelled with it."""
    if store.get_run(run_id).status != RunStatus.RUNNING:
        return []
    inventory = open_run(store, run_id).inventory
    killed = []
    for child in store.children(run_id):
        if child.trigger == "matrix" and child.status == RunStatus.RUNNING:
            killed += cancel_run_jobs(store, child.id, transport_factory=transport_factory, why=why)
    for sr in store.steps(run_id):
        jobs = recorded_jobs(sr)
        if sr.status != StepStatus.RUNNING or jobs is None:
            continue
        for handle in jobs.handles:
            transport = transport_factory(inventory.get(handle.host))
            try:
                transport.cancel(handle)
                killed.append(handle.job_dir)
            finally:
                transport.close()
        try:
            store.finish_step(sr.id, status=StepStatus.CANCELLED, exit_code=None, stdout_tail="", stderr_tail="",
                              error=f"cancelled: {why}; its remote job was killed")
        except ImmutableRecord:  # the step's own thread saw its job end, killed, and recorded it first
            log.info("step run %s (%s): recorded by its own step as its job ended", sr.id, sr.step)
    # a step still waiting on a job of the run now waits on one this look missed (launched as it read the steps):
    # the step kills it itself at its next poll
    note_cancelled(run_id)
    try:
        store.finish_run(run_id, status=RunStatus.CANCELLED, verdict=None, report=None, error=f"cancelled: {why}")
    except ImmutableRecord:  # its walker saw the cancelled steps and closed the run first (`run.finish`)
        log.info("run %s: recorded %s by its own walker meanwhile", run_id, store.get_run(run_id).status)
    return killed


def cancel_interrupted(store: Store, run_id: str, interruption: BaseException, *, transport_factory: TransportFactory,
                       what: str = "the run", why: str | None = None) -> None:
    """The walk of `run_id` was interrupted in the controller's main thread (Ctrl-C; Prefect's TerminationSignal when
    `alignflow serve` gets SIGTERM): kill the run's jobs and record it cancelled at once. The step threads end when
    their jobs do, so the process can exit: otherwise Prefect's task runner waits for a step polling a job nobody
    killed, and a stopped nightly was SIGKILLed after the runner's 30 s grace. A failure here is logged, never
    raised over the interruption (a flow's cancellation hooks try again)."""
    try:
        cancel_run_jobs(store, run_id, transport_factory=transport_factory,
                        why=why or f"{what} was stopped ({type(interruption).__name__})")
    except Exception:
        log.exception("run %s: killing its jobs as %s stopped failed", run_id, what)
