"""Detached jobs: a command that outlives the connection that started it - what one is asked to run (`JobSpec`),
how it is found again (`JobHandle`), and where it stands (`JobState`), whoever schedules it (scheduler.py).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, PlainSerializer

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


def _aware(started: datetime) -> datetime:
    """A start time recorded without a zone is UTC (every job's clock is)."""
    return started if started.tzinfo else started.replace(tzinfo=UTC)


class JobHandle(BaseModel):
    """Everything needed to find a job again: record `model_dump(mode="json")` before polling, read it back with
    `model_validate` (docs/orchestration.md#detached-jobs-over-ssh)."""

    model_config = ConfigDict(frozen=True, extra="ignore")  # a job's spec.json holds more than its handle

    host: str
    job_id: Annotated[str, AfterValidator(check_job_id)]
    job_dir: str
    pid: int
    pgid: int
    started_at: Annotated[datetime, AfterValidator(_aware), PlainSerializer(datetime.isoformat, when_used="json")]
    name: str = "job"
    argv: tuple[str, ...] = ()
    scheduler_id: str | None = None  # the scheduler's id of the job (Slurm job id); None for a direct job


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
        lines = tail.splitlines()
        for i in range(len(lines) - 1, -1, -1):
            line = lines[i]
            if _ERROR_LINE.match(line) and not line.lstrip().startswith("Traceback"):
                return _framed_message(line.strip(), lines[i + 1:])[:500]
    return None


_RULE = re.compile(r"^\s*-{10,}\s*$")
_FRAME_HEADER = re.compile(r"^\s*- [\w+ ]*(?:Error Message|Call Stack)\b.*$")


def _framed_message(line: str, after: list[str]) -> str:
    """MindSpore frames its errors: `RuntimeError: ---...---`, `- Framework Error Message:`, `---...---`, then the
    message (`- Framework Error Message: (For framework developers)` in MindSpore's own reports). Such a line is
    shown with the message's first line (`RuntimeError: Out of Memory!!! Request memory size: ...`), not the rule."""
    head, sep, rest = line.partition(":")
    if not sep or not (_RULE.match(rest) or not rest.strip()):
        return line
    for text in after:
        if _RULE.match(text) or _FRAME_HEADER.match(text) or not text.strip():
            continue
        return f"{head}: {text.strip()}"
    return line
