"""Detached jobs: a command that outlives the connection that started it, whoever schedules it.

A job lives in `<workdir>/jobs/<job_id>/`, whatever its scheduler: `cmd.sh` (the rendered command - host env,
setup lines, per-job env, cwd, exec argv - runnable by hand), `spec.json` (what was asked: lets a restarted
controller re-attach by id), `stdout`, `stderr`, and what its scheduler adds (`jobs_direct.py`: a setsid supervisor
and its pid; `slurm.py`: a batch script and Slurm's job id). `Jobs` is what both schedulers provide; `wait` polls
any of them.
"""

from __future__ import annotations

import logging
import posixpath
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from alignflow.config.hosts import Host
from alignflow.errors import CommandTimeout, RemoteJobError, TransportError
from alignflow.transport import commands
from alignflow.transport.files import Files
from alignflow.transport.shell import CONTROL_TIMEOUT_S

log = logging.getLogger(__name__)

JobKind = Literal["pending", "running", "exited", "lost", "cancelled", "timeout", "preempted", "failed"]
# pending: queued by a scheduler (Slurm PENDING), not started; timeout / preempted / failed: ended by the scheduler
# (time limit, preemption, node or launch failure) - `JobState.note` says how, in the scheduler's words.
ACTIVE_KINDS = frozenset({"pending", "running"})
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SLUG = re.compile(r"[^A-Za-z0-9._-]+")


def new_job_id(name: str, now: datetime) -> str:
    """`<name>-<UTC time>-<random>`: sortable, readable in `ls`, unique without coordination."""
    slug = _SLUG.sub("-", name).strip("-.")[:40] or "job"
    return f"{slug}-{now.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"


def check_job_id(job_id: str) -> str:
    if not _JOB_ID.match(job_id):
        raise ValueError(
            f"job id {job_id!r}: use letters, digits, '.', '_' or '-' (at most 128, not starting with '.')"
        )
    return job_id


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What to run detached: argv (no shell unless you write `["bash", "-c", ...]`), env, cwd, a name."""

    argv: tuple[str, ...]
    name: str = "job"
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    job_id: str | None = None
    take_slot: bool = False  # hold one of the host's max_concurrent_jobs slots while running (waits for one)
    time_limit_s: float | None = None  # a scheduler's limit (Slurm --time); a direct job is bounded by `wait`

    def __init__(
        self,
        argv: Sequence[str],
        name: str = "job",
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        job_id: str | None = None,
        take_slot: bool = False,
        time_limit_s: float | None = None,
    ) -> None:
        if isinstance(argv, str) or not argv:
            raise ValueError("JobSpec.argv must be a non-empty list of arguments, not a string")
        object.__setattr__(self, "argv", tuple(str(a) for a in argv))
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "env", dict(env or {}))
        object.__setattr__(self, "cwd", cwd)
        object.__setattr__(self, "job_id", check_job_id(job_id) if job_id is not None else None)
        object.__setattr__(self, "take_slot", bool(take_slot))
        object.__setattr__(self, "time_limit_s", time_limit_s)


@dataclass(frozen=True, slots=True)
class JobHandle:
    """Everything needed to find a job again: persist `to_dict()` before polling
    (docs/orchestration.md#detached-jobs-over-ssh)."""

    host: str
    job_id: str
    job_dir: str
    pid: int
    pgid: int
    started_at: datetime
    name: str = "job"
    argv: tuple[str, ...] = ()
    scheduler_id: str | None = None  # the scheduler's id of the job (Slurm job id); None for a direct job

    def to_dict(self) -> dict[str, Any]:
        extra = {"scheduler_id": self.scheduler_id} if self.scheduler_id is not None else {}
        return {
            "host": self.host,
            "job_id": self.job_id,
            "job_dir": self.job_dir,
            "pid": self.pid,
            "pgid": self.pgid,
            "started_at": self.started_at.isoformat(),
            "name": self.name,
            "argv": list(self.argv),
            **extra,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobHandle:
        started = datetime.fromisoformat(str(data["started_at"]))
        if started.tzinfo is None:
            started = started.replace(tzinfo=UTC)
        return cls(
            host=str(data["host"]),
            job_id=check_job_id(str(data["job_id"])),
            job_dir=str(data["job_dir"]),
            pid=int(data["pid"]),
            pgid=int(data["pgid"]),
            started_at=started,
            name=str(data.get("name", "job")),
            argv=tuple(str(a) for a in data.get("argv", ())),
            scheduler_id=str(data["scheduler_id"]) if data.get("scheduler_id") is not None else None,
        )


@dataclass(frozen=True, slots=True)
class JobState:
    """running / exited(code) / lost (process gone, no exit file) / cancelled; with a scheduler also pending,
    timeout, preempted and failed, and `note` in the scheduler's words (Slurm's state and reason)."""

    kind: JobKind
    exit_code: int | None = None
    note: str = ""

    @property
    def finished(self) -> bool:
        return self.kind not in ACTIVE_KINDS

    @property
    def ok(self) -> bool:
        return self.kind == "exited" and self.exit_code == 0

    def __str__(self) -> str:
        word = f"exited({self.exit_code})" if self.kind == "exited" else self.kind
        return f"{word} ({self.note})" if self.note and self.kind != "running" else word


# A line that says why a job failed: a Python exception line, or a log line at ERROR/FATAL/CRITICAL level
# (MindFormers and the twin log errors to stdout, `[ERROR]` / `- ERROR -`; Megatron and torchrun to stderr).
_ERROR_LINE = re.compile(r"^\s*(?:[\w.]+(?:Error|Exception|Exit|Interrupt)\b.*"
                         r"|.*\b(?:ERROR|FATAL|CRITICAL|Error:)\b.*)$")


def error_line(*tails: str) -> str | None:
    """The last line of the first tail that has one which says why the job failed (see `_ERROR_LINE`), else None.

    Pass the stderr tail first: a traceback's last line is the job's own account of its failure, and it is what
    a step error should show next to `exited(1)` (issue 16) when the job printed its error on stdout only.
    """
    for tail in tails:
        for line in reversed(tail.splitlines()):
            if _ERROR_LINE.match(line) and not line.lstrip().startswith("Traceback"):
                return line.strip()[:500]
    return None


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
