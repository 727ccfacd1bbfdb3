"""Detached jobs: a command that outlives the connection that started it.

A job lives in `<workdir>/jobs/<job_id>/`:

```
cmd.sh      the rendered command (host env, setup lines, per-job env, cwd, exec argv) - runnable by hand
job.sh      the supervisor: writes `pid`, runs cmd.sh, writes `exit_code` atomically (temp file + mv)
spec.json   what was asked (argv, name, env, cwd, started_at): lets a restarted controller re-attach by id
pid         the supervisor's pid; it is also the process group id (setsid), which `cancel` kills
stdout, stderr
slot        (a job that takes a slot) "waiting for one of the host's N job slot(s) ..." / "holding job slot i ..."
exit_code   present only once the command has ended - the truth about "finished"
cancelled   marker written by `cancel` before it signals the group
```

Why `setsid`: the job gets its own session and process group, so neither a dropped SSH connection nor the
controller's signals reach it, and `kill -- -PGID` also reaches torchrun/msrun children. Why the `cwd`
check in STATUS: `kill -0` reports zombies (and recycled pids) as alive
(docs/orchestration.md#g12-kill--0-is-true-for-zombies); a
process whose `/proc/PID/cwd` is this job dir is our supervisor, a zombie has no cwd at all.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

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


# The supervisor. Runs in the job dir, in its own session; `$$` is the process group id. It writes `pid`, runs
# cmd.sh, and writes the exit code atomically.
_PID_SH = "echo $$ > pid.tmp && mv -f pid.tmp pid\n"
_RUN_SH = """\
bash ./cmd.sh > stdout 2> stderr < /dev/null%s
code=$?
echo "$code" > exit_code.tmp && mv -f exit_code.tmp exit_code
"""
SUPERVISOR_SH = _PID_SH + _RUN_SH % ""

# Exit code of a job that could not take a slot because the host has no `flock`.
NO_FLOCK_EXIT = 97

# Before running, the supervisor of a job that holds one of the host's `max_concurrent_jobs` slots takes one. The
# slots are lock files in `<workdir>/slots/`, on the host, so every controller that launches there (a teammate's
# laptop, the team's worker, the nightly) shares them. It waits (writing `slot`) until it can `flock` one, keeps
# the lock on fd 9 while the command runs — the command does not inherit it (`9>&-`) — and loses it when it ends
# or is killed: a cancelled or crashed job never leaks a slot.
_TAKE_SLOT_SH = """\
: > stdout; : > stderr
af_slots=%(slots)d; af_slot_dir=%(slot_dir)s
if ! command -v flock > /dev/null 2>&1; then
  echo "alignflow: this host has no flock (util-linux), which a job needs to hold one of its max_concurrent_jobs \
slots" > stderr
  echo %(no_flock)d > exit_code.tmp && mv -f exit_code.tmp exit_code; exit 0
fi
mkdir -p -- "$af_slot_dir"
waited=
while :; do
  i=0
  while [ "$i" -lt "$af_slots" ]; do
    exec 9>> "$af_slot_dir/$i.lock"
    flock -n 9 && break 2
    exec 9>&-
    i=$((i+1))
  done
  [ -n "$waited" ] || { echo "waiting for one of the host's $af_slots job slot(s) (max_concurrent_jobs) since \
$(date -u +%%Y-%%m-%%dT%%H:%%M:%%SZ)" > slot; waited=1; }
  sleep 1
done
echo "holding job slot $i of $af_slots since $(date -u +%%Y-%%m-%%dT%%H:%%M:%%SZ)" > slot
"""


def supervisor_script(slots: int | None, slot_dir: str | None = None) -> str:
    """The job's supervisor: plain, or holding one of `slots` slots (lock files under `slot_dir`) while it runs."""
    if slots is None:
        return SUPERVISOR_SH
    if slots < 1 or not slot_dir:
        raise ValueError("a job slot needs slots >= 1 and a slot directory")
    import shlex

    take = _TAKE_SLOT_SH % {"slots": slots, "slot_dir": shlex.quote(slot_dir), "no_flock": NO_FLOCK_EXIT}
    return _PID_SH + take + _RUN_SH % " 9>&-"

# $1 job dir, $2 cmd.sh, $3 job.sh, $4 spec.json. Prints the pid. Exit 98 when the job dir exists (job ids
# are never reused, so a job's files are never overwritten).
LAUNCH_SH = """\
d=$1
mkdir -p -m 700 -- "${d%/*}" || exit 1
mkdir -m 700 -- "$d" 2>/dev/null || { echo "job dir exists: $d" >&2; exit 98; }
cd -- "$d" || exit 1
printf '%s' "$2" > cmd.sh && printf '%s' "$3" > job.sh && printf '%s' "$4" > spec.json || exit 1
setsid nohup bash ./job.sh > /dev/null 2>&1 < /dev/null &
i=0; while [ ! -s pid ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done
[ -s pid ] || { echo "the job's supervisor did not start in $d" >&2; exit 1; }
cat pid
"""

# Liveness of a job's supervisor: its /proc cwd is the job dir (false for zombies and recycled pids).
_ALIVE_SH = """\
af_alive() { [ -n "$pid" ] && [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" = "$real" ]; }
"""

# $1 job dir. Prints one of: MISSING | EXITED <code> | RUNNING | CANCELLED | LOST
STATUS_SH = _ALIVE_SH + """\
d=$1
[ -d "$d" ] || { echo MISSING; exit 0; }
real=$(cd -- "$d" && pwd -P); pid=$(cat -- "$d/pid" 2>/dev/null)
[ -f "$d/exit_code" ] && { echo "EXITED $(cat -- "$d/exit_code")"; exit 0; }
af_alive && { echo RUNNING; exit 0; }
# the supervisor may have written exit_code and ended between the two checks above
[ -f "$d/exit_code" ] && { echo "EXITED $(cat -- "$d/exit_code")"; exit 0; }
[ -f "$d/cancelled" ] && { echo CANCELLED; exit 0; }
echo LOST
"""

# $1 job dir, $2 grace seconds. TERM to the group, KILL after the grace period; then prints the state.
CANCEL_SH = _ALIVE_SH + """\
d=$1; grace=$2
[ -d "$d" ] || { echo MISSING; exit 0; }
real=$(cd -- "$d" && pwd -P); pid=$(cat -- "$d/pid" 2>/dev/null)
af_group() { ps -e -o pgid=,stat= | awk -v g="$pid" '$1 == g && $2 !~ /^Z/ {n++} END {exit n ? 0 : 1}'; }
if [ ! -f "$d/exit_code" ] && af_alive; then
  : > "$d/cancelled"
  kill -TERM -- "-$pid" 2>/dev/null
  end=$(( $(date +%s) + grace ))
  while af_group && [ "$(date +%s)" -lt "$end" ]; do sleep 0.1; done
  af_group && kill -KILL -- "-$pid" 2>/dev/null
  i=0; while af_group && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
fi
""" + STATUS_SH

# $1 job dir, $2 bytes, $3 stream file name
TAIL_SH = '[ -d "$1" ] || exit 3; [ -f "$1/$3" ] || exit 0; tail -c "$2" -- "$1/$3"'

# $1 job dir -> "PID\\n<spec.json>"
ATTACH_SH = '[ -f "$1/spec.json" ] || exit 3; cat -- "$1/pid" 2>/dev/null || echo 0; cat -- "$1/spec.json"'


def parse_status(line: str) -> JobState | None:
    """The STATUS_SH answer as a state; None for MISSING."""
    word, _, rest = line.strip().partition(" ")
    table: dict[str, JobState] = {
        "RUNNING": JobState("running"),
        "CANCELLED": JobState("cancelled"),
        "LOST": JobState("lost"),
    }
    if word == "MISSING":
        return None
    if word == "EXITED":
        return JobState("exited", int(rest.strip()))
    if word in table:
        return table[word]
    raise ValueError(f"unexpected job status line {line!r}")


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
