"""Cancelling a run: the one path every cancellation takes (Ctrl-C, SIGTERM, the Prefect UI's Cancel, `alignflow
cancel`), whichever process it starts in.

`cancel_run_jobs` kills the job of every step still running, records each step `cancelled` with the end its job
was seen to reach, and closes the run `cancelled`. Closing the run is what stops the steps it could not see, in
this process or another: a step that launched its job as the canceller read the run's steps finds its step run
closed when it records the job, and a step polling a job recorded after that read finds it closed at its next
poll; either kills its job itself (`StepRunner.attach`, `StepRunner.wait`). A job attached between the
canceller's read and the run's close is killed by the canceller's second look, once no job can be attached any
more.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from alignflow.config.hosts import Inventory
from alignflow.errors import AlignflowError, ImmutableRecord, RemoteJobError
from alignflow.runner.engine import TransportFactory, kill
from alignflow.runner.recording import recorded_jobs
from alignflow.runner.session import open_run
from alignflow.store import Store
from alignflow.store.records import RunStatus, StepRunRecord, StepStatus
from alignflow.transport import JobHandle, JobState

log = logging.getLogger(__name__)

NOT_KILLED = "could not be killed"  # in a step's error: the cancellation did not see its job end


def cancel_run_jobs(store: Store, run_id: str, *, transport_factory: TransportFactory,
                    why: str = "the run was cancelled") -> list[str]:
    """Kill the process tree of every job of `run_id` still running, record those steps cancelled (`why`, and the
    end each job was seen to reach, in their error) and the run cancelled; returns the job dirs it saw end. A run no
    longer running has nothing to cancel (its controller may have cancelled it as it stopped, between a caller's
    look and this call): []. The runs of its switch matrix (children with trigger `matrix`) are cancelled with it.

    A job the kill did not end (a host that did not answer, a process that outlived SIGKILL) is named in its step's
    error and raised as `RemoteJobError` once every other job was killed and the run recorded: nothing says killed
    of a job it did not see end."""
    run = store.get_run(run_id)
    if run.status != RunStatus.RUNNING:
        return []
    run_id = run.id
    inventory = open_run(store, run_id).inventory
    killed: list[str] = []
    survivors: list[str] = []
    for child in store.children(run_id):
        if child.trigger == "matrix" and child.status == RunStatus.RUNNING:
            try:
                killed += cancel_run_jobs(store, child.id, transport_factory=transport_factory, why=why)
            except RemoteJobError as exc:
                survivors.append(str(exc))
    for sr in store.steps(run_id):
        jobs = recorded_jobs(sr)
        if sr.status != StepStatus.RUNNING or jobs is None:
            continue
        ends = [(handle, _kill(transport_factory, inventory, handle)) for handle in jobs.handles]
        killed += [handle.job_dir for handle, end in ends if end.finished]
        survivors += [f"{handle.host}: job {handle.job_dir} ({end})" for handle, end in ends if not end.finished]
        _record(store, sr, why, ends)
    try:
        store.finish_run(run_id, status=RunStatus.CANCELLED, verdict=None, report=None, error=f"cancelled: {why}")
    except ImmutableRecord:  # its walker saw the cancelled steps and closed the run first (`run.finish`)
        log.info("run %s: recorded %s by its own walker meanwhile", run_id, store.get_run(run_id).status)
    # Second look, now that the run is closed and no step can record a job any more: a job recorded after the first
    # look (its step was launching then) was left to its step, which may be in this process, another, or gone.
    for sr in store.steps(run_id):
        jobs = recorded_jobs(sr)
        if jobs is None or sr.status != StepStatus.CANCELLED or not (sr.error or "").startswith(f"run {run_id} ended"):
            continue
        for handle in jobs.handles:
            end = _kill(transport_factory, inventory, handle)
            (killed if end.finished else survivors).append(
                handle.job_dir if end.finished else f"{handle.host}: job {handle.job_dir} ({end})")
    if survivors:
        raise RemoteJobError(f"run {run_id}: cancelled, but the kill of {len(survivors)} job(s) was not seen to end "
                             f"them: {'; '.join(survivors)}; `alignflow cancel {run_id}` tries again")
    return killed


def _kill(transport_factory: TransportFactory, inventory: Inventory, handle: JobHandle) -> JobState:
    transport = transport_factory(inventory.get(handle.host))
    try:
        return kill(transport, handle)
    finally:
        transport.close()


def _record(store: Store, sr: StepRunRecord, why: str, ends: list[tuple[JobHandle, JobState]]) -> None:
    """The step run `sr` cancelled, with the end its job(s) reached as the kill saw it."""
    said = "; ".join(_end(handle, end) for handle, end in ends)
    exit_code = ends[0][1].exit_code if len(ends) == 1 else None
    try:
        store.finish_step(sr.id, status=StepStatus.CANCELLED, exit_code=exit_code, stdout_tail="", stderr_tail="",
                          error=f"cancelled: {why}; {said}")
    except ImmutableRecord:  # the step's own thread saw its job end, killed, and recorded it first
        log.info("step run %s (%s): recorded by its own step as its job ended", sr.id, sr.step)


def _end(handle: JobHandle, end: JobState) -> str:
    if not end.finished:
        return f"its job {NOT_KILLED} ({end}; job dir {handle.job_dir})"
    return "its job was killed" if end.kind == "cancelled" else f"its job had ended: {end}"


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


class Canceller:
    """Cancels one run when a signal asks: `request()` only wakes a thread of its own, which calls
    `cancel_run_jobs` (nothing that blocks runs in a signal handler, and nothing is raised in whatever code the main
    thread was running: a KeyboardInterrupt raised in Prefect's engine was swallowed there or reported as a crash,
    and the run trained on, issue 45). `close()` waits for a cancellation under way."""

    def __init__(self, run_id: str, cancel: Callable[[str], list[str]]) -> None:
        """`cancel(why)`: `cancel_run_jobs` of `run_id` with the caller's store and transports; the job dirs killed."""
        self.run_id, self._cancel = run_id, cancel
        self.why: str | None = None
        self.killed: list[str] = []
        self.failure: str | None = None
        self._woken = threading.Event()  # asked to cancel, or closed
        self._thread = threading.Thread(target=self._wait, name=f"alignflow-cancel-{run_id}", daemon=True)
        self._thread.start()

    def request(self, why: str) -> None:
        """Cancel the run (once; safe in a signal handler)."""
        if self.why is None:
            self.why = why
            self._woken.set()

    def _wait(self) -> None:
        self._woken.wait()  # one event, not a poll: closing (every run) returns at once, not within a poll's 0.2 s
        if self.why is None:  # closed
            return
        log.warning("run %s %s: cancelling it, killing its jobs (the signal again stops at once)", self.run_id,
                    self.why)
        try:
            self.killed = self._cancel(self.why)
        except AlignflowError as exc:
            self.failure = str(exc)
            log.error("run %s: %s", self.run_id, exc)

    def close(self) -> None:
        self._woken.set()
        self._thread.join()
