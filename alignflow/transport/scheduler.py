"""The scheduler seam: what a host's job scheduler provides (`Jobs`), and what every scheduler shares - the job's
directory, its output's tail, and `wait`, which polls any of them.

A job lives in `<workdir>/jobs/<job_id>/`, whatever its scheduler: `cmd.sh` (the rendered command - host env,
setup lines, per-job env, cwd, exec argv - runnable by hand), `spec.json` (what was asked: lets a restarted
controller re-attach by id), `stdout`, `stderr`, and what its scheduler adds (`jobs_direct.py`: a setsid
supervisor and its pid; `slurm.py`: a batch script and Slurm's job id).
"""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Callable
from datetime import datetime
from typing import Literal, Protocol

from alignflow.config.hosts import Host
from alignflow.errors import CommandTimeout, RemoteJobError, TransportError
from alignflow.transport import commands
from alignflow.transport.files import Files
from alignflow.transport.jobs import JobHandle, JobSpec, JobState, check_job_id
from alignflow.transport.shell import CONTROL_TIMEOUT_S

log = logging.getLogger(__name__)

PollFn = Callable[[JobState], None]
"""Called by `wait` after every poll with the job's current state."""


class Jobs(Protocol):
    """The detached jobs of one host: `jobs_direct.DirectJobs` (setsid) or `slurm.SlurmJobs` (sbatch)."""

    host: Host
    deadline_slack_s: float
    """How long `wait` keeps polling past its own deadline: a scheduler that enforces the job's limit itself."""

    def launch(self, spec: JobSpec) -> JobHandle: ...

    def attach(self, job_id: str) -> JobHandle: ...

    def status(self, handle: JobHandle) -> JobState: ...

    def tail(self, handle: JobHandle, n_bytes: int = 4096, stream: Literal["stdout", "stderr"] = "stdout") -> str: ...

    def cancel(self, handle: JobHandle, *, grace_s: float = 10.0) -> JobState: ...

    def slot_note(self, handle: JobHandle) -> str: ...


class Clock(Protocol):
    """What `wait` reads time from and sleeps on (a test passes one that does not really sleep)."""

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real one: `time.monotonic` and `time.sleep`."""

    monotonic = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)


def job_dir(files: Files, job_id: str) -> str:
    """`<workdir>/jobs/<job_id>`, the job's directory on its host."""
    return posixpath.join(files.workdir().real, "jobs", check_job_id(job_id))


def checked_job_dir(files: Files, handle: JobHandle) -> str:
    """The handle's job dir, confined to the host's workdir; `ValueError` for another host's job."""
    if handle.host != files.host.name:
        raise ValueError(f"job {handle.job_id} belongs to host {handle.host!r}, not {files.host.name!r}")
    return files.path(handle.job_dir)


def spec_record(files: Files, spec: JobSpec, job_id: str, cwd: str, now: datetime) -> dict[str, object]:
    """The job's `spec.json`: what was asked, and where and when."""
    return {"job_id": job_id, "name": spec.name, "argv": list(spec.argv), "env": dict(spec.env), "cwd": cwd,
            "host": files.host.name, "started_at": now.isoformat()}


# $1 job dir, $2 bytes, $3 stream file name
TAIL_SH = '[ -d "$1" ] || exit 3; [ -f "$1/$3" ] || exit 0; tail -c "$2" -- "$1/$3"'


def read_tail(files: Files, handle: JobHandle, n_bytes: int, stream: Literal["stdout", "stderr"]) -> str:
    """The last `n_bytes` of the job's stdout or stderr, from its job dir (poll with this; fetch whole logs once)."""
    if stream not in ("stdout", "stderr"):
        raise ValueError(f"stream must be 'stdout' or 'stderr', not {stream!r}")
    path = checked_job_dir(files, handle)
    raw = files.shell.exec(commands.script("tail", TAIL_SH, path, str(int(n_bytes)), stream),
                           timeout_s=CONTROL_TIMEOUT_S)
    if raw.exit_code != 0:
        raise RemoteJobError(f"{files.host.name}: cannot read {stream} of job {handle.job_id}", handle=handle)
    return raw.text()


def wait(jobs: Jobs, handle: JobHandle, *, poll_s: float = 5.0, timeout_s: float | None = None,
         on_poll: PollFn | None = None, check: bool = False, clock: Clock | None = None) -> JobState:
    """Poll until the job ends. A dropped connection is not the job's end: reconnect and keep polling.

    `CommandTimeout` when `timeout_s` passes with the job still running (the job is left alone: cancel it
    if that is what you want). With `check`, `RemoteJobError` (with the stderr tail) unless exited(0).
    Time a job spends `pending` in a scheduler's queue does not count; a scheduler that enforces the job's
    limit itself (Slurm's --time) is given its `deadline_slack_s` past it to say so.
    """
    clock = clock or SystemClock()
    if timeout_s is not None and jobs.deadline_slack_s:
        timeout_s += jobs.deadline_slack_s
    deadline = None if timeout_s is None else clock.monotonic() + timeout_s
    last_poll = clock.monotonic()
    last_error: TransportError | None = None
    # Start polling fast and back off to `poll_s`: a conversion that ends in 2 s should not wait out a
    # 5 s interval, and a 10-hour training still costs one status command per `poll_s`.
    ramp = min(0.1, poll_s)
    while True:
        state: JobState | None = None
        try:
            state = jobs.status(handle)
        except TransportError as exc:
            if not exc.retryable:
                raise
            last_error = exc
            log.warning("%s: polling job %s failed (%s); reconnecting", jobs.host.name, handle.job_id, exc)
        if state is not None:
            if state.kind == "pending" and deadline is not None:  # queued: the job's time has not started
                deadline += clock.monotonic() - last_poll
            last_poll = clock.monotonic()
            if on_poll is not None:
                on_poll(state)
            if state.finished:
                break
        if deadline is not None and clock.monotonic() >= deadline:
            why = f" (last error: {last_error})" if state is None and last_error else ""
            raise CommandTimeout(f"job {handle.job_id} still running after {timeout_s} s{why}", host=jobs.host.name)
        clock.sleep(ramp if deadline is None else max(0.0, min(ramp, deadline - clock.monotonic())))
        ramp = min(poll_s, ramp * 2)
    assert state is not None  # the loop only breaks on a finished state
    if check and not state.ok:
        raise _failed(jobs, handle, state)
    return state


def _failed(jobs: Jobs, handle: JobHandle, state: JobState) -> RemoteJobError:
    tail = jobs.tail(handle, 2000, "stderr").rstrip().splitlines()[-20:]
    detail = "\n".join("    " + line for line in tail)
    return RemoteJobError(f"{jobs.host.name}: job {handle.job_id} {state} (job dir {handle.job_dir})"
                          + (f"\n{detail}" if detail else ""), handle=handle, state=state)
