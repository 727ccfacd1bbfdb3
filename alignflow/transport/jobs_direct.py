"""Jobs of a `scheduler: direct` host: a `setsid` supervisor per job, in the job's directory on the host.

```
cmd.sh      the rendered command (host env, setup lines, per-job env, cwd, exec argv) - runnable by hand
job.sh      the supervisor: writes `pid`, runs cmd.sh, writes `exit_code` atomically (temp file + mv)
spec.json   what was asked (argv, name, env, cwd, started_at): lets a restarted controller re-attach by id
pid         the supervisor's pid; it is also the process group id (setsid), which `cancel` kills
stdout, stderr
slot        (a job that takes a slot) "waiting for one of the host's N job slot(s) ..." / "holding job slot i ..."
exit_code   present only once the command has ended - the truth about "finished"
cancelled   marker written by `cancel` before it signals the group, or by a launch that gave up waiting for `pid`
```

Why `setsid`: the job gets its own session and process group, so neither a dropped SSH connection nor the
controller's signals reach it, and `kill -- -PGID` also reaches torchrun/msrun children. Why the `cwd`
check in STATUS: `kill -0` reports zombies (and recycled pids) as alive
(docs/orchestration.md#g12-kill--0-is-true-for-zombies); a
process whose `/proc/PID/cwd` is this job dir is our supervisor, a zombie has no cwd at all.
"""

from __future__ import annotations

import json
import logging
import shlex
from datetime import UTC, datetime
from typing import Literal

from alignflow.config.hosts import Host
from alignflow.errors import AlignflowError, RemoteJobError
from alignflow.transport import commands
from alignflow.transport.commands import MISSING_EXIT
from alignflow.transport.files import Files
from alignflow.transport.jobs import JobHandle, JobSpec, JobState, new_job_id
from alignflow.transport.scheduler import checked_job_dir, job_dir, read_tail, spec_record
from alignflow.transport.shell import CONTROL_TIMEOUT_S, Result

log = logging.getLogger(__name__)

# The supervisor. Runs in the job dir, in its own session; `$$` is the process group id. It writes `pid`, then stops
# if its launch gave up on it (`cancelled` is there: LAUNCH_SH), else runs cmd.sh and writes the exit code atomically.
_PID_SH = "echo $$ > pid.tmp && mv -f pid.tmp pid\n[ ! -e cancelled ] || exit 0\n"
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
    take = _TAKE_SLOT_SH % {"slots": slots, "slot_dir": shlex.quote(slot_dir), "no_flock": NO_FLOCK_EXIT}
    return _PID_SH + take + _RUN_SH % " 9>&-"

# $1 job dir, $2 cmd.sh, $3 job.sh, $4 spec.json, $5 seconds to wait for the supervisor's pid. Prints the pid. Exit
# 98 when the job dir exists (job ids are never reused, so a job's files are never overwritten). It waits for the
# pid by wall time ($SECONDS, no process per look: 500 `sleep 0.01` took over 10 s on a loaded 2-core machine). A
# launch that gives up fails, and nothing may run for it: it marks the job `cancelled`, then kills the supervisor's
# group if its pid appeared meanwhile (it may have looked for the mark before it was made), else the process it
# started; a supervisor that writes its pid later finds the mark and stops (_PID_SH). Left running, that job was
# recorded nowhere: no cancellation could find it.
LAUNCH_SH = """\
d=$1
mkdir -p -m 700 -- "${d%/*}" || exit 1
mkdir -m 700 -- "$d" 2>/dev/null || { echo "job dir exists: $d" >&2; exit 98; }
cd -- "$d" || exit 1
printf '%s' "$2" > cmd.sh && printf '%s' "$3" > job.sh && printf '%s' "$4" > spec.json || exit 1
setsid nohup bash ./job.sh > /dev/null 2>&1 < /dev/null &
SECONDS=0; while [ ! -s pid ] && [ "$SECONDS" -lt "$5" ]; do sleep 0.01; done
if [ ! -s pid ]; then
  : > cancelled
  if [ -s pid ]; then kill -KILL -- "-$(cat pid)"; else kill -KILL "$!"; fi 2>/dev/null
  echo "the job's supervisor did not start within $5 s in $d; the job was marked cancelled and killed" >&2; exit 1
fi
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

# $1 job dir, $2 grace seconds. TERM to the group, KILL after the grace period; then prints the state (ALIVE: a
# process of the group outlived the KILL).
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
  af_group && { echo ALIVE; exit 0; }
fi
""" + STATUS_SH

# $1 job dir -> "PID\\n<spec.json>"
ATTACH_SH = '[ -f "$1/spec.json" ] || exit 3; cat -- "$1/pid" 2>/dev/null || echo 0; cat -- "$1/spec.json"'



def parse_status(line: str) -> JobState | None:
    """The STATUS_SH (or CANCEL_SH) answer as a state; None for MISSING."""
    word, _, rest = line.strip().partition(" ")
    table: dict[str, JobState] = {
        "RUNNING": JobState("running"),
        "CANCELLED": JobState("cancelled"),
        "LOST": JobState("lost"),
        # CANCEL_SH: a process of the job's group outlived SIGKILL (uninterruptible sleep): not seen to end
        "ALIVE": JobState("running", note="a process of its group outlived SIGKILL"),
    }
    if word == "MISSING":
        return None
    if word == "EXITED":
        return JobState("exited", int(rest.strip()))
    if word in table:
        return table[word]
    raise ValueError(f"unexpected job status line {line!r}")


class DirectJobs:
    """launch / status / tail / cancel / attach of one host's detached jobs, run by the host itself (`setsid`)."""

    deadline_slack_s = 0.0
    start_wait_s = 5  # how long a launch waits for the supervisor's pid (LAUNCH_SH)

    def __init__(self, files: Files) -> None:
        self.files = files
        self.host: Host = files.host

    def _exec(self, name: str, body: str, *args: str, timeout_s: float = CONTROL_TIMEOUT_S) -> Result:
        return self.files.shell.exec(commands.script(name, body, *args), timeout_s=timeout_s)

    def launch(self, spec: JobSpec) -> JobHandle:
        """Start `spec` detached (own session and process group) in `<workdir>/jobs/<job_id>/`.

        Give `spec.job_id` to make a launch idempotent: if the connection drops during `launch`, launching
        the same id again fails with "job dir exists" and `attach(job_id)` finds the job.
        """
        f, now = self.files, datetime.now(UTC)
        job_id = spec.job_id or new_job_id(spec.name, now)
        path = job_dir(f, job_id)
        cwd = f.path(spec.cwd) if spec.cwd else f.workdir().real
        header = f"alignflow job {job_id} ({spec.name}) on host {self.host.name}, launched {now.isoformat()}"
        record = spec_record(f, spec, job_id, cwd, now)
        supervisor = supervisor_script(None)
        if spec.take_slot:
            supervisor = supervisor_script(self.host.max_concurrent_jobs, self.slot_dir())
            record["slots"] = self.host.max_concurrent_jobs
        job_script = commands.render_job_script(spec.argv, f.prologue(env=spec.env, cwd=cwd), header=header)
        raw = self._exec("launch", LAUNCH_SH, path, job_script, supervisor, json.dumps(record, indent=1),
                         str(self.start_wait_s))
        if raw.exit_code == 98:
            raise RemoteJobError(f"{self.host.name}: job {job_id} already exists in {path}; job ids are never "
                                 "reused (attach to it, or launch with a new id)")
        if raw.exit_code != 0:
            raise f.failed("launch", path, raw)
        pid = int(raw.text().split()[-1])
        log.info("%s: launched job %s (pid %d) in %s", self.host.name, job_id, pid, path)
        return JobHandle(host=self.host.name, job_id=job_id, job_dir=path, pid=pid, pgid=pid, started_at=now,
                         name=spec.name, argv=spec.argv)

    def slot_dir(self) -> str:
        """Where the host's job slots live (`<workdir>/slots/<i>.lock`), shared by every controller."""
        return f"{self.files.workdir().real}/slots"

    def slot_note(self, handle: JobHandle) -> str:
        """The job's slot line ("waiting for one of ..." / "holding job slot ..."), or "" for a job without one."""
        try:
            return self.files.read_text(f"{handle.job_dir}/slot", max_bytes=4096).strip()
        except AlignflowError:
            return ""

    def attach(self, job_id: str) -> JobHandle:
        """The handle of an existing job, from its job dir (for a controller that restarted)."""
        path = job_dir(self.files, job_id)
        raw = self._exec("attach", ATTACH_SH, path)
        if raw.exit_code == MISSING_EXIT:
            raise RemoteJobError(f"{self.host.name}: no job {job_id} (no {path}/spec.json)")
        if raw.exit_code != 0:
            raise self.files.failed("attach", path, raw)
        pid_line, _, spec_text = raw.text().partition("\n")
        record = json.loads(spec_text)
        return JobHandle.model_validate({**record, "job_dir": path, "pid": int(pid_line), "pgid": int(pid_line)})

    def status(self, handle: JobHandle) -> JobState:
        raw = self._exec("status", STATUS_SH, checked_job_dir(self.files, handle))
        return self._state(handle, raw)

    def _state(self, handle: JobHandle, raw: Result) -> JobState:
        if raw.exit_code != 0:
            raise self.files.failed("job status", handle.job_dir, raw)
        state = parse_status(raw.text().strip().splitlines()[-1])
        if state is None:
            raise RemoteJobError(f"{self.host.name}: job dir {handle.job_dir} is gone", handle=handle)
        return state

    def tail(self, handle: JobHandle, n_bytes: int = 4096, stream: Literal["stdout", "stderr"] = "stdout") -> str:
        return read_tail(self.files, handle, n_bytes, stream)

    def cancel(self, handle: JobHandle, *, grace_s: float = 10.0) -> JobState:
        """TERM the job's whole process group, KILL it after `grace_s`; returns the final state."""
        path = checked_job_dir(self.files, handle)
        grace = max(0, round(grace_s))
        raw = self._exec("cancel", CANCEL_SH, path, str(grace), timeout_s=grace + CONTROL_TIMEOUT_S)
        state = self._state(handle, raw)
        log.info("%s: cancelled job %s -> %s", self.host.name, handle.job_id, state)
        return state
