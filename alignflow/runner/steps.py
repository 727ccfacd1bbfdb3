"""Running one step of a run through its executor, chosen by the step's declared kind (`StepSpec.executor`),
never by its name."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from alignflow import pipeline
from alignflow.errors import AlignflowError, RunCancelled
from alignflow.runner.artifacts import ArtifactRef
from alignflow.runner.compare_step import run_compare
from alignflow.runner.diagnose_step import run_diagnose
from alignflow.runner.engine import StepRunner
from alignflow.runner.gate import run_gate
from alignflow.runner.jobstep import run_job_step
from alignflow.runner.retry import retrying
from alignflow.runner.session import StepOutcome
from alignflow.store.records import StepStatus

log = logging.getLogger(__name__)
NOT_STARTED = "not-started"  # the cache key of a step recorded failed before it had one: it matches no other

Executor = Callable[[StepRunner, pipeline.StepSpec, Mapping[str, ArtifactRef]], StepOutcome]
"""`(runner, step, every artifact available so far) -> outcome`; raises after recording a failure."""

EXECUTORS: dict[pipeline.ExecutorKind, Executor] = {
    "job": run_job_step,
    "gate": run_gate,
    "compare": run_compare,
    "diagnose": run_diagnose,
}


def run_step(runner: StepRunner, step: str, available: Mapping[str, ArtifactRef]) -> StepOutcome:
    """Execute (or reuse) one step given every artifact produced so far, unless its run was cancelled meanwhile
    (`RunCancelled`); after a transient transport error it is tried again, with a notice, as `runner.backoff` says
    (`alignflow.runner.retry`: a step left running re-attaches to its job)."""
    spec = runner.ctx.pipeline.step(step)
    try:
        # a step submitted after the run's cancellation (the walk had it queued) touches no host; the throttled look
        # of `cancelled` could answer False for another CANCEL_LOOK_S
        if runner.cancelled(now=True):
            raise RunCancelled(f"{step}: not started: run {runner.run_id} was cancelled")
        return retrying(lambda: EXECUTORS[spec.executor](runner, spec, available), what=step,
                        backoff=runner.backoff, notice=lambda message: runner.warn(f"{step}: {message}"),
                        stopped=runner.cancelled)
    except AlignflowError as exc:
        record_unrecorded(runner, step, exc)
        raise


def record_unrecorded(runner: StepRunner, step: str, exc: AlignflowError) -> None:
    """A step that failed before its executor recorded it (reaching its host: the snapshot, staging an input) is
    recorded failed with the error, or cancelled: else the run's table showed it `skipped`, "not reached: an earlier
    step failed", as the one step that did fail (issue 45: a host whose name does not resolve)."""
    if any(s.step == step for s in runner.store.steps(runner.run_id)):
        return
    status = StepStatus.CANCELLED if isinstance(exc, RunCancelled) else StepStatus.FAILED
    try:
        record = runner.store.start_step(runner.run_id, step, host=runner.host(step).name, command="",
                                         cache_key=NOT_STARTED, inputs={})
        runner.store.finish_step(record.id, status=status, exit_code=None, stdout_tail="", stderr_tail="",
                                 error=str(exc))
    except AlignflowError as why:  # the run was closed meanwhile (its cancellation): its record stands
        log.info("%s: not recorded (%s)", step, why)
