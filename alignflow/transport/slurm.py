"""Jobs of a `scheduler: slurm` host: an sbatch script per job, Slurm's word on its state, scancel to stop it.

The host is the cluster's login node, reached through its transport (local or SSH); the job dir is the same as a
direct job's, on the shared filesystem the compute nodes see:

```
cmd.sh        the rendered command (host env, setup lines, per-job env, cwd, exec argv), as for a direct job
job.sbatch    the batch script: #SBATCH lines from hosts.yaml, runs cmd.sh, writes exit_code; `sbatch job.sbatch`
              from the job dir resubmits it by hand
spec.json     what was asked; slurm_job_id  Slurm's id, written as soon as sbatch answers (re-attach reads it)
stdout        #SBATCH --output (appended to: a requeued job keeps its earlier output); stderr likewise
exit_code     the command's exit status, written by the batch script - the fallback when neither the controller
              (MinJobAge) nor accounting (sacct) knows the job any more
submit_error  Slurm's refusal, when sbatch refused the job (nothing runs; the step fails with that message)
```

Slurm owns what the direct scheduler does on the host: the queue (no job slots: `max_concurrent_jobs` is left
to Slurm), the time limit (`--time`; the controller's own deadline waits for Slurm past it), cancellation
(`scancel`). The job id is in the `JobHandle` (`scheduler_id`) that the runner records before polling.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Literal

from alignflow.config.hosts import Host
from alignflow.config.slurm import SlurmConfig, format_minutes
from alignflow.errors import RemoteJobError, TransportError
from alignflow.transport import commands
from alignflow.transport.commands import MISSING_EXIT
from alignflow.transport.files import Files
from alignflow.transport.jobs import JobHandle, JobSpec, JobState, new_job_id
from alignflow.transport.scheduler import checked_job_dir, job_dir, read_tail, spec_record
from alignflow.transport.shell import CONTROL_TIMEOUT_S, Result
from alignflow.transport.slurm_login import SlurmLoginShell
from alignflow.transport.slurm_state import SACCT_FIELDS, StatusAnswer, interpret, parse_answers, unreachable
from alignflow.transport.slurm_watch import NO_ANSWER, Watcher, watcher_for

log = logging.getLogger(__name__)

# How long past a job's Slurm time limit the controller keeps waiting for Slurm to end it: the limit is rounded
# up to a minute, slurmctld checks limits about every 30 s, then grants KillWait (30 s by default) before SIGKILL.
LIMIT_SLACK_S = 60.0 + 30.0 + 60.0
_SUBMIT_REFUSED = 97
_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")

_BATCH_TAIL = """\
bash ./cmd.sh < /dev/null
code=$?
echo "$code" > exit_code.tmp && mv -f exit_code.tmp exit_code
exit "$code"
"""

# $1 job dir, $2 cmd.sh, $3 job.sbatch, $4 spec.json. Prints Slurm's job id. Exit 98 when the job dir exists,
# 97 with Slurm's message on stderr when sbatch refused the job.
SUBMIT_SH = """\
d=$1
mkdir -p -m 700 -- "${d%/*}" || exit 1
mkdir -m 700 -- "$d" 2>/dev/null || { echo "job dir exists: $d" >&2; exit 98; }
cd -- "$d" || exit 1
printf '%s' "$2" > cmd.sh && printf '%s' "$3" > job.sbatch && printf '%s' "$4" > spec.json || exit 1
if ! out=$(sbatch --parsable --chdir="$d" job.sbatch 2>&1); then
  printf '%s\\n' "$out" > submit_error; printf '%s\\n' "$out" >&2; exit 97
fi
id=$(printf '%s\\n' "$out" | tail -n 1); id=${id%%;*}
case $id in ''|*[!0-9_]*)
  printf 'sbatch printed no job id: %s\\n' "$out" > submit_error; cat submit_error >&2; exit 97;;
esac
echo "$id" > slurm_job_id.tmp && mv -f slurm_job_id.tmp slurm_job_id
echo "$id"
"""

# $1 the Slurm job ids, comma-separated; then each job's id and job dir. Sections for `slurm_state.parse_answers`:
# accounting once for every job, then the controller and the exit_code file for each job accounting does not know.
STATUS_SH = """\
ids=$1; shift; acct=
if command -v sacct > /dev/null 2>&1; then
  out=$(sacct -n -P -X -j "$ids" -o "$FIELDS" 2>&1); rc=$?; printf '@@ SACCT %d\\n%s\\n' "$rc" "$out"
  [ "$rc" = 0 ] && acct=$out
fi
while [ $# -ge 2 ]; do
  id=$1; d=$2; shift 2; printf '@@ JOB %s\\n' "$id"
  case "
$acct" in *"
$id|"*) continue;; esac
  out=$(scontrol show job -o "$id" 2>&1); printf '@@ SCONTROL %d\\n%s\\n' "$?" "$out"
  case $out in *JobState=*) continue;; esac
  [ -f "$d/exit_code" ] && printf '@@ EXITFILE 0\\n%s\\n' "$(cat -- "$d/exit_code")"
done
exit 0
""".replace("$FIELDS", ",".join(SACCT_FIELDS))

# $1 Slurm job id, $2 job dir
CANCEL_SH = """\
: > "$2/cancelled"
out=$(scancel "$1" 2>&1) || { case $out in *"Invalid job id"*|*"already completing or completed"*) ;; \
*) printf '%s\\n' "$out" >&2; exit 1;; esac; }
exit 0
"""

# $1 job dir -> "<slurm id or empty>\\n<spec.json>"
ATTACH_SH = ('[ -f "$1/spec.json" ] || exit 3; cat -- "$1/slurm_job_id" 2>/dev/null || echo; '
             '[ -f "$1/submit_error" ] && { echo "submit refused: $(cat -- "$1/submit_error")" >&2; exit 4; }; '
             'cat -- "$1/spec.json"')


def sbatch_lines(config: SlurmConfig, *, name: str, time_minutes: int | None) -> list[str]:
    """The `#SBATCH` options of a job, in a fixed order (golden-file tested)."""
    opts = [f"--job-name={name}", "--output=stdout", "--error=stderr", "--open-mode=append",
            f"--nodes={config.nodes}", "--ntasks-per-node=1"]
    if config.gpus_per_node:
        opts.append(f"--gpus-per-node={config.gpus_per_node}")
    if config.cpus_per_task is not None:
        opts.append(f"--cpus-per-task={config.cpus_per_task}")
    if config.mem is not None:
        opts.append(f"--mem={config.mem}")
    opts += [f"--{key}={value}" for key, value in (("partition", config.partition), ("account", config.account),
                                                    ("qos", config.qos)) if value is not None]
    if time_minutes is not None:
        opts.append(f"--time={format_minutes(time_minutes)}")
    return [*opts, *config.extra]


def render_batch_script(config: SlurmConfig, *, name: str, header: str, time_minutes: int | None) -> str:
    """job.sbatch: the #SBATCH lines, then run cmd.sh in the job dir and keep its exit status."""
    comment = "\n".join(f"# {line}" for line in header.splitlines())
    lines = "\n".join(f"#SBATCH {opt}" for opt in sbatch_lines(config, name=name, time_minutes=time_minutes))
    return f"#!/bin/bash\n{lines}\n{comment}\n{_BATCH_TAIL}"


def _job_name(name: str) -> str:
    return _NAME_CHARS.sub("-", name).strip("-.")[:64] or "alignflow"


class SlurmJobs:
    """launch / status / cancel / attach of one Slurm host's jobs: files over the host's shell, Slurm's client tools
    on its login node (`SlurmLoginShell`)."""

    deadline_slack_s = LIMIT_SLACK_S

    def __init__(self, files: Files, *, watcher: Watcher | None = None) -> None:
        """`watcher`: who asks Slurm about the jobs waited on (default: this process's one for the host)."""
        self.files = files
        self.host: Host = files.host
        assert self.host.slurm is not None
        self.config: SlurmConfig = self.host.slurm
        self.login = SlurmLoginShell(files.shell)
        self.watcher = watcher or watcher_for(self.host)

    def _slurm(self, name: str, body: str, *args: str) -> Result:
        return self.login.exec(commands.script(name, body, *args), timeout_s=CONTROL_TIMEOUT_S)

    def launch(self, spec: JobSpec) -> JobHandle:
        f, host, now = self.files, self.host, datetime.now(UTC)
        job_id = spec.job_id or new_job_id(spec.name, now)
        path = job_dir(f, job_id)
        cwd = f.path(spec.cwd) if spec.cwd else f.workdir().real
        header = f"alignflow job {job_id} ({spec.name}) on Slurm host {host.name}, submitted {now.isoformat()}"
        minutes = self.config.time_limit_minutes(spec.time_limit_s)
        record = {**spec_record(f, spec, job_id, cwd, now), "scheduler": "slurm", "time_limit_min": minutes}
        batch = render_batch_script(self.config, name=_job_name(spec.name), header=header, time_minutes=minutes)
        job_script = commands.render_job_script(spec.argv, f.prologue(env=spec.env, cwd=cwd), header=header)
        raw = self._slurm("sbatch", SUBMIT_SH, path, job_script, batch, json.dumps(record, indent=1))
        if raw.exit_code == 98:
            raise RemoteJobError(f"{host.name}: job {job_id} already exists in {path}; job ids are never reused")
        if raw.exit_code == _SUBMIT_REFUSED:
            message = raw.text("stderr").strip()
            if unreachable(message):
                raise TransportError(f"sbatch could not reach the Slurm controller: {message}", host=host.name)
            raise RemoteJobError(f"{host.name}: Slurm refused job {job_id} (sbatch): {message}; job dir {path}")
        if raw.exit_code != 0:
            raise f.failed("sbatch", path, raw)
        slurm_id = raw.text().split()[-1]
        log.info("%s: submitted job %s as Slurm job %s in %s", host.name, job_id, slurm_id, path)
        return JobHandle(host=host.name, job_id=job_id, job_dir=path, pid=0, pgid=0, started_at=now, name=spec.name,
                         argv=spec.argv, scheduler_id=slurm_id)

    def attach(self, job_id: str) -> JobHandle:
        path = job_dir(self.files, job_id)
        # the job's own files: no Slurm tool, so the plain shell (no setup line run)
        raw = self.files.shell.exec(commands.script("slurm-attach", ATTACH_SH, path), timeout_s=CONTROL_TIMEOUT_S)
        if raw.exit_code == MISSING_EXIT:
            raise RemoteJobError(f"{self.host.name}: no job {job_id} (no {path}/spec.json)")
        if raw.exit_code == 4:
            raise RemoteJobError(f"{self.host.name}: job {job_id} never ran: {raw.text('stderr').strip()}")
        if raw.exit_code != 0:
            raise self.files.failed("attach", path, raw)
        id_line, _, spec_text = raw.text().partition("\n")
        if not id_line.strip():
            raise RemoteJobError(f"{self.host.name}: job {job_id} has no Slurm job id in {path} (was it "
                                 "submitted? see its submit_error)")
        record = json.loads(spec_text)
        return JobHandle.model_validate({**record, "job_dir": path, "pid": 0, "pgid": 0,
                                         "scheduler_id": id_line.strip()})

    def _slurm_id(self, handle: JobHandle) -> str:
        if not handle.scheduler_id:
            raise ValueError(f"job {handle.job_id} has no Slurm job id (launched by another scheduler?)")
        return handle.scheduler_id

    def status(self, handle: JobHandle) -> JobState:
        """Slurm's word on the job as the host's watcher last heard it (`slurm_watch`: one command for every job
        this process waits on there, at most a minute old for a job waited on for ten)."""
        path = checked_job_dir(self.files, handle)
        return self._state(handle, self.watcher.answer(self._slurm_id(handle), path, self._ask))

    def _ask(self, jobs: Mapping[str, str]) -> dict[str, StatusAnswer]:
        pairs = [value for job in jobs.items() for value in job]
        raw = self._slurm("slurm-status", STATUS_SH, ",".join(jobs), *pairs)
        if raw.exit_code != 0:
            raise self.files.failed("job status (sacct, scontrol)", ",".join(jobs.values()), raw)
        answers = parse_answers(raw.text())
        return {slurm_id: answers.get(slurm_id, NO_ANSWER) for slurm_id in jobs}

    def _state(self, handle: JobHandle, answer: StatusAnswer) -> JobState:
        slurm_id = self._slurm_id(handle)
        state, why = interpret(answer, slurm_id)
        if state is not None:
            return state
        if unreachable(answer.scontrol):
            raise TransportError(f"Slurm job {slurm_id}: {why}", host=self.host.name)
        raise RemoteJobError(f"{self.host.name}: cannot tell the state of Slurm job {slurm_id}: {why}", handle=handle)

    def tail(self, handle: JobHandle, n_bytes: int = 4096, stream: Literal["stdout", "stderr"] = "stdout") -> str:
        return read_tail(self.files, handle, n_bytes, stream)

    def cancel(self, handle: JobHandle, *, grace_s: float = 10.0) -> JobState:
        """`scancel`, then wait (KillWait and a margin) until Slurm reports the job ended."""
        path = checked_job_dir(self.files, handle)
        slurm_id = self._slurm_id(handle)
        raw = self._slurm("scancel", CANCEL_SH, slurm_id, path)
        if raw.exit_code != 0:
            message = raw.text("stderr").strip()
            if unreachable(message):
                raise TransportError(f"scancel {slurm_id}: {message}", host=self.host.name)
            raise RemoteJobError(f"{self.host.name}: scancel {slurm_id} failed: {message}", handle=handle)
        deadline = time.monotonic() + grace_s + 60.0
        state = self._state(handle, self.watcher.fresh(slurm_id, path, self._ask))  # not the watcher's pace
        while not state.finished and time.monotonic() < deadline:
            time.sleep(0.5)
            state = self._state(handle, self.watcher.fresh(slurm_id, path, self._ask))
        log.info("%s: scancel %s (job %s) -> %s", self.host.name, slurm_id, handle.job_id, state)
        return state

    def slot_note(self, handle: JobHandle) -> str:
        """Slurm queues the job itself: its waiting reason is in `JobState.note` (no host job slots)."""
        return ""
