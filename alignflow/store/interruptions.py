"""Runs whose controller died: detect them, mark them `interrupted` (with why and their jobs), cancel them later.

A run is driven by one controller process (recorded by `create_run`). When that process dies without finishing
the run — kill -9, a crash, the machine rebooted, a Prefect server that went away under the flow — the run would
stay `running` forever. `reconcile(store)` finds the running runs whose controller is provably gone (same host:
the pid is dead or belongs to a later process, or the boot id changed) and marks them `interrupted`; each open
step is closed as failed with a message naming its detached job, which may well still be running on its host.

Nothing is deleted: the steps and artifacts stay; `alignflow cancel RUN` kills the jobs and moves the run to
`cancelled` (the only change an interrupted run accepts), `alignflow rerun RUN` continues it in a new run that
reuses every step that had finished. A run whose controller is on another host cannot be judged from here; it is
listed as unverifiable and left alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import select, update

from alignflow.controller import ControllerIdentity, Liveness, liveness
from alignflow.errors import ImmutableRecord
from alignflow.store.base import OPEN_STEPS, StoreBase
from alignflow.store.models import Run, StepRun
from alignflow.store.records import RunRecord, RunStatus, StepStatus
from alignflow.store.values import log_tail

log = logging.getLogger(__name__)

# The error of a step that was open when its run was interrupted starts with this (how `cancel` finds its job).
INTERRUPTED_STEP = "interrupted: "


@dataclass(frozen=True, slots=True)
class RunJob:
    """A detached job a step run recorded (`attach_job`), as the store knows it."""

    step: str
    step_run_id: str
    host: str | None
    job_dir: str
    interrupted: bool  # the step was still open when its run was interrupted

    def describe(self) -> str:
        return f"{self.step} on {self.host or '?'} ({self.job_dir})"


@dataclass(frozen=True, slots=True)
class Interrupted:
    run: RunRecord
    reason: str
    jobs: list[RunJob]


@dataclass(frozen=True, slots=True)
class Unverifiable:
    run: RunRecord
    reason: str


@dataclass(frozen=True, slots=True)
class Reconciliation:
    interrupted: list[Interrupted] = field(default_factory=list)
    unverifiable: list[Unverifiable] = field(default_factory=list)


class Interruptions(StoreBase):
    """Store operations on runs whose controller is gone."""

    def interrupt_run(self, run_id: str, *, reason: str) -> RunRecord | None:
        """Mark a running run `interrupted`; open steps are closed as failed naming their job. None if the run was
        finished meanwhile (by its controller, which was alive after all, or by another reconciler)."""
        with self._write(f"interrupt run {run_id}") as s:
            row = self._run_row(s, run_id)
            if row.status != RunStatus.RUNNING.value:
                return None
            now = self._clock()
            for st in s.scalars(select(StepRun).where(StepRun.run_id == row.id, StepRun.status.in_(OPEN_STEPS))):
                job = (f"; its job {st.host}:{st.job_dir} may still be running (`alignflow cancel {row.id}` kills it)"
                       if st.job_dir else "; it had launched no job")
                s.execute(update(StepRun).where(StepRun.id == st.id, StepRun.status.in_(OPEN_STEPS)).values(
                    status=StepStatus.FAILED.value, finished_at=now,
                    error=log_tail(f"{INTERRUPTED_STEP}{reason} while this step was {st.status}{job}")))
            done = s.execute(update(Run).where(Run.id == row.id, Run.status == RunStatus.RUNNING.value).values(
                status=RunStatus.INTERRUPTED.value, error=log_tail(f"interrupted: {reason}"), finished_at=now))
            if done.rowcount != 1:  # type: ignore[attr-defined]
                return None
            s.refresh(row)
            record = self._run_record(s, row)
        log.warning("run %s interrupted: %s", record.id, reason)
        return record

    def cancel_interrupted(self, run_id: str, *, note: str) -> RunRecord:
        """`interrupted` -> `cancelled` once its jobs were killed; the interruption's reason is kept in the error."""
        with self._write(f"cancel interrupted run {run_id}") as s:
            row = self._run_row(s, run_id)
            if row.status != RunStatus.INTERRUPTED.value:
                raise ImmutableRecord(f"run {row.id}: is {row.status}, not interrupted")
            error = "\n".join(filter(None, [row.error, f"cancelled: {note}"]))
            done = s.execute(update(Run).where(Run.id == row.id, Run.status == RunStatus.INTERRUPTED.value)
                             .values(status=RunStatus.CANCELLED.value, error=log_tail(error)))
            if done.rowcount != 1:  # type: ignore[attr-defined]
                raise ImmutableRecord(f"run {row.id}: was changed by another process meanwhile")
            s.refresh(row)
            return self._run_record(s, row)

    def running_runs(self) -> list[RunRecord]:
        """Every run recorded as running, oldest first."""
        with self._read("list running runs") as s:
            rows = s.scalars(select(Run).where(Run.status == RunStatus.RUNNING.value).order_by(Run.started_at))
            return [self._run_record(s, r) for r in rows]

    def run_jobs(self, run_id: str) -> list[RunJob]:
        """Every detached job recorded by the step runs of a run, in the order the steps started."""
        with self._read(f"read jobs of run {run_id}") as s:
            run = self._run_row(s, run_id)
            rows = s.scalars(select(StepRun).where(StepRun.run_id == run.id, StepRun.job_dir.is_not(None))
                             .order_by(StepRun.created_at, StepRun.id))
            return [RunJob(step=r.step, step_run_id=r.id, host=r.host, job_dir=r.job_dir or "",
                           interrupted=(r.error or "").startswith(INTERRUPTED_STEP)) for r in rows]


def controller_of(run: RunRecord) -> ControllerIdentity | None:
    return None if not run.controller else ControllerIdentity.from_dict(run.controller)


def reconcile(store: Interruptions, *, check: Callable[[ControllerIdentity], Liveness] = liveness,
              runs: list[RunRecord] | None = None) -> Reconciliation:
    """Mark every running run whose controller is provably dead `interrupted`; report the ones nobody here can
    judge. `runs` limits it to those runs (default: every running run)."""
    if runs is None:
        runs = store.running_runs()
    out = Reconciliation()
    for run in runs:
        if run.status != RunStatus.RUNNING:
            continue
        ident = controller_of(run)
        if ident is None:
            out.unverifiable.append(Unverifiable(run, "no controller recorded (a run from before alignflow kept "
                                                      "one); `alignflow cancel` ends it if it is dead"))
            continue
        state = check(ident)
        if state == "unknown":
            out.unverifiable.append(Unverifiable(run, f"driven by {ident.describe()}, which cannot be checked from "
                                                      "here; run `alignflow history --reconcile` there"))
            continue
        if state == "alive":
            continue
        reason = f"its controller ({ident.describe()}) is gone (killed, crashed or the host rebooted)"
        done = store.interrupt_run(run.id, reason=reason)
        if done is not None:
            jobs = [j for j in store.run_jobs(run.id) if j.interrupted]
            out.interrupted.append(Interrupted(done, reason, jobs))
    return out
