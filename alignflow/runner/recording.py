"""One recording path for every executor: start the step run, attach its jobs, add its artifacts, finish it.

Every executor (a job, the early gate, the comparison) runs its work inside `recording(...)`, and one policy
decides how a step run ends:

- the executor called `ran()`: `ran`;
- an `AlignflowError` that is `retryable` (a transport error) while a detached job of the step may still be
  running: the step run stays `running`, so that the task's retry re-attaches to that job instead of launching
  it again;
- the executor ended the step run itself before raising (a job cancelled from outside: `cancelled`; a job the
  scheduler ended that `retry_on` runs again: `failed`): that record;
- any other `AlignflowError`: `failed`, with its message (and the exit code and tails the executor learned);
- another exception (a bug): `failed`, with its type and message;
- an interruption (KeyboardInterrupt, cancellation): `cancelled`.

The original exception always propagates: the record never hides it. A step run's jobs are recorded as a
`StepJobs` (`jobs_document` / `recorded_jobs`, the one reader and writer of that document).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from pydantic import JsonValue

from alignflow.errors import AlignflowError, ImmutableRecord, PipelineError
from alignflow.runner.artifacts import ArtifactRef
from alignflow.store import Store
from alignflow.store.records import StepRunRecord, StepStatus
from alignflow.transport import JobHandle

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StepJobs:
    """The detached job(s) a step run launched, recorded before anyone polls them (`Store.attach_job`): one job
    (a training, a conversion) or several (the early gate's two sides, the diagnosis)."""

    handles: tuple[JobHandle, ...]
    out: str | None = None  # the output dir of a single job: a later attempt re-attaches instead of relaunching

    @property
    def resumable(self) -> bool:
        return len(self.handles) == 1 and self.out is not None


def jobs_document(jobs: StepJobs) -> dict[str, JsonValue]:
    """The step run's job document: one job's handle (with `out`), or `{"jobs": [handle, ...]}`."""
    extra: dict[str, JsonValue] = {"out": jobs.out} if jobs.out is not None else {}
    if len(jobs.handles) == 1:
        return {**jobs.handles[0].model_dump(mode="json"), **extra}
    return {"jobs": [h.model_dump(mode="json") for h in jobs.handles], **extra}


def recorded_jobs(step: StepRunRecord) -> StepJobs | None:
    """The job(s) a step run recorded (`jobs_document`); None when it recorded none."""
    doc = step.job_handle
    if not doc:
        return None
    listed = doc.get("jobs")
    handles = [JobHandle.model_validate(d) for d in listed] if isinstance(listed, list) else [
        JobHandle.model_validate(doc)]
    out = doc.get("out")
    return StepJobs(tuple(handles), out if isinstance(out, str) else None)


class StepRecord:
    """An open step run and what its executor has learned so far."""

    def __init__(self, store: Store, record: StepRunRecord) -> None:
        self.store = store
        self.record = record
        self.exit_code: int | None = None
        self.stdout_tail = ""
        self.stderr_tail = ""
        self.resumable = False
        self.finished = False

    @property
    def id(self) -> str:
        return self.record.id

    def attach(self, handles: Sequence[JobHandle], *, out: str | None = None) -> None:
        """Record the step's detached job(s) before anyone polls them, so that cancelling the run finds and kills
        every one; `out`: the output dir of a single job a retried attempt may re-attach to instead of relaunching
        it (`StepJobs.resumable`)."""
        jobs = StepJobs(tuple(handles), out)
        self.record = self.store.attach_job(self.id, job_dir=" | ".join(h.job_dir for h in handles),
                                            handle=jobs_document(jobs))
        self.resumable = jobs.resumable

    def add(self, ref: ArtifactRef) -> None:
        self.store.add_artifact(self.id, name=ref.name, host=ref.host, path=ref.path, kind=ref.kind,
                                sha256=ref.sha256, size_bytes=ref.size, manifest=ref.manifest)

    def ran(self, *, exit_code: int | None = 0, stdout_tail: str = "", stderr_tail: str = "") -> None:
        self.record = self.store.finish_step(self.id, status=StepStatus.RAN, exit_code=exit_code,
                                             stdout_tail=stdout_tail, stderr_tail=stderr_tail)
        self.finished = True

    def end(self, status: StepStatus, error: str) -> None:
        """Finish as failed or cancelled; a store error here is logged, never raised over the original one. A step
        run already recorded cancelled (its run was cancelled from outside the step, which killed the job this
        step then saw end) keeps that record, and says so without alarm."""
        try:
            self.record = self.store.finish_step(self.id, status=status, exit_code=self.exit_code,
                                                 stdout_tail=self.stdout_tail, stderr_tail=self.stderr_tail,
                                                 error=error)
        except AlignflowError as exc:
            current = self._current() if isinstance(exc, ImmutableRecord) else None
            if current is not None and current.status == StepStatus.CANCELLED:
                self.record = current
                log.info("step run %s (%s): recorded cancelled already (%s)", self.id, current.step, current.error)
            else:
                log.exception("step run %s (%s): could not record it %s", self.id, self.record.step, status.value)
        self.finished = True

    def _current(self) -> StepRunRecord | None:
        try:
            return self.store.get_step(self.id)
        except AlignflowError:
            return None


@contextmanager
def recording(
    store: Store,
    run_id: str,
    step: str,
    *,
    host: str,
    command: str,
    cache_key: str,
    inputs: Mapping[str, ArtifactRef],
    resume: StepRunRecord | None = None,
) -> Iterator[StepRecord]:
    """A step run of `step` in `run_id` (or `resume`, an attempt's open one), finished by the policy above."""
    record = resume or store.start_step(run_id, step, host=host, command=command, cache_key=cache_key,
                                        inputs=inputs)
    rec = StepRecord(store, record)
    rec.resumable = resume is not None
    try:
        yield rec
    except AlignflowError as exc:
        if not (rec.finished or (exc.retryable and rec.resumable)):
            rec.end(StepStatus.FAILED, str(exc))
        raise
    except Exception as exc:
        rec.end(StepStatus.FAILED, f"{type(exc).__name__}: {exc}")
        raise
    except BaseException as exc:
        rec.end(StepStatus.CANCELLED, f"interrupted ({type(exc).__name__}); its jobs were cancelled")
        raise
    if not rec.finished:
        rec.end(StepStatus.FAILED, "the executor returned without finishing its step run")
        raise PipelineError(f"step {step}: the executor returned without finishing its step run {rec.id}")
