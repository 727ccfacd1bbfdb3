"""Slurm's word on a job, read into a `JobState`: pure functions over what scontrol, sacct and the job's files say.

The status command (`alignflow.transport.slurm.STATUS_SH`) asks about every job waited on (`slurm_watch`), in one
round trip:

1. `sacct -n -P -X -j ID,ID,... -o JobIDRaw,State,ExitCode,Reason,Partition,Elapsed,Timelimit` - accounting, once
   for all the jobs (a cluster without it answers "accounting storage is disabled");
2. for each job accounting does not know (yet, or at all): `scontrol show job -o ID` - the controller, while it
   remembers the job (`MinJobAge`, 300 s by default, after the end): `JobState=`, `Reason=`, `ExitCode=N:S`,
   `RunTime=`, `TimeLimit=`, `Partition=`;
3. then, if the controller forgot it too, the job's own `exit_code` file, written by the batch script when the
   command ended.

States follow Slurm's table (https://slurm.schedmd.com/squeue.html#SECTION_JOB-STATE-CODES). A job that waits
(PENDING, a requeue, a hold) is `pending` with Slurm's reason; one that Slurm ended is `timeout` (TIMEOUT,
DEADLINE), `preempted`, `cancelled`, or `failed` (NODE_FAIL, BOOT_FAIL, OUT_OF_MEMORY, a launch failure); one that
ran to its end is `exited(N)` with the batch script's exit code (128+S for a signal, as bash reports it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from alignflow.transport.jobs import JobKind, JobState

# Slurm state -> our kind. Anything not listed is reported as failed, with Slurm's word in the note.
STATES: dict[str, JobKind] = {
    "PENDING": "pending",
    "REQUEUED": "pending",
    "REQUEUE_HOLD": "pending",
    "REQUEUE_FED": "pending",
    "RESV_DEL_HOLD": "pending",
    "SPECIAL_EXIT": "pending",
    "CONFIGURING": "running",
    "RUNNING": "running",
    "COMPLETING": "running",
    "SUSPENDED": "running",
    "STOPPED": "running",
    "SIGNALING": "running",
    "RESIZING": "running",
    "STAGE_OUT": "running",
    "COMPLETED": "exited",
    "FAILED": "exited",
    "CANCELLED": "cancelled",
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "PREEMPTED": "preempted",
    "NODE_FAIL": "failed",
    "BOOT_FAIL": "failed",
    "OUT_OF_MEMORY": "failed",
    "REVOKED": "failed",
}

# scontrol/squeue/sbatch messages that mean "the controller did not answer" - retry, never a verdict on the job.
UNREACHABLE = ("Unable to contact slurm controller", "Socket timed out", "Zero Bytes were transmitted",
               "Connection refused", "Communication connection failure", "Unable to establish control machine",
               "Slurm backup controller in standby mode", "temporarily unable to accept job")
_UNKNOWN_JOB = "Invalid job id"
_KV = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z/:_]*)=(\S*)")


@dataclass(frozen=True, slots=True)
class StatusAnswer:
    """The sections of one status command's output."""

    scontrol_rc: int
    scontrol: str
    sacct_rc: int | None  # None: no sacct on the host
    sacct: str
    exit_file: str | None  # content of the job's exit_code file, if it exists


def split_sections(text: str) -> dict[str, tuple[int, str]]:
    """`@@ NAME RC` headers, each followed by its lines -> {NAME: (RC, text)}."""
    out: dict[str, tuple[int, str]] = {}
    name, rc, body = "", 0, []  # type: tuple[str, int, list[str]]
    for line in text.splitlines():
        if line.startswith("@@ "):
            if name:
                out[name] = (rc, "\n".join(body).strip())
            parts = line.split()
            name, rc, body = parts[1], int(parts[2]) if len(parts) > 2 else 0, []
        else:
            body.append(line)
    if name:
        out[name] = (rc, "\n".join(body).strip())
    return out


def parse_answers(text: str) -> dict[str, StatusAnswer]:
    """The status command's output - `@@ SACCT`, then `@@ JOB ID` before each job's sections - by Slurm job id."""
    head, *jobs = re.split(r"^@@ JOB (\S+)$", text, flags=re.M)
    return {jobs[i]: parse_answer(head + jobs[i + 1]) for i in range(0, len(jobs), 2)}


def parse_answer(text: str) -> StatusAnswer:
    sections = split_sections(text)
    sc_rc, sc = sections.get("SCONTROL", (1, ""))
    sa = sections.get("SACCT")
    ex = sections.get("EXITFILE")
    return StatusAnswer(sc_rc, sc, None if sa is None else sa[0], "" if sa is None else sa[1],
                        None if ex is None else ex[1])


def fields(line: str) -> dict[str, str]:
    """`Key=Value` pairs of one `scontrol show job -o` line (values without spaces; the ones we read have none)."""
    return {m.group(1): m.group(2) for m in _KV.finditer(line)}


def exit_status(code: str) -> int | None:
    """Slurm's `N:S` exit code as a shell exit status: N, or 128+S when a signal S ended the script."""
    m = re.match(r"^(\d+):(\d+)$", code.strip())
    if m is None:
        return None
    status, signal = int(m.group(1)), int(m.group(2))
    return 128 + signal if signal and not status else status


def unreachable(message: str) -> bool:
    return any(marker.lower() in message.lower() for marker in UNREACHABLE)


def from_scontrol(line: str) -> JobState:
    f = fields(line)
    word = f.get("JobState", "")
    kind = STATES.get(word, "failed")
    reason = f.get("Reason", "None")
    reason_text = "" if reason in ("None", "(null)", "") else reason.replace("_", " ")  # -o writes spaces as _
    code = exit_status(f.get("ExitCode", ""))
    if kind == "pending":
        where = f" in partition {f['Partition']}" if f.get("Partition") else ""
        return JobState("pending", note=f"Slurm {word}{where}: {reason_text or 'waiting'}")
    if kind == "running":
        return JobState("running", note=f"Slurm {word}" if word != "RUNNING" else "")
    if kind == "exited":
        if word == "FAILED" and not code:
            return JobState("failed", note=f"Slurm FAILED: {reason_text or 'no exit code'}")
        return JobState("exited", code if code is not None else 0)
    if kind == "timeout":
        ran, limit = f.get("RunTime", "?"), f.get("TimeLimit", "?")
        return JobState("timeout", code, note=f"Slurm {word}: ran {ran} of its {limit} time limit")
    detail = f": {reason_text}" if reason_text else ""
    return JobState(kind, code, note=f"Slurm {word}{detail}")


SACCT_FIELDS = ("JobIDRaw", "State", "ExitCode", "Reason", "Partition", "Elapsed", "Timelimit")
_AS_SCONTROL = ("JobId", "JobState", "ExitCode", "Reason", "Partition", "RunTime", "TimeLimit")


def from_sacct(text: str, job_id: str) -> JobState | None:
    """The allocation line of `job_id` in `sacct -n -P -X -o <SACCT_FIELDS>` output (None: absent); the fields past
    ExitCode only add to the note."""
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) >= 3 and parts[0] == job_id:
            state = parts[1].split()[0] if parts[1].strip() else ""
            values = dict(zip(_AS_SCONTROL, parts, strict=False)) | {"JobState": state}
            values["Reason"] = values.get("Reason") or "None"
            synthetic = " ".join(f"{k}={v.replace(' ', '_')}" for k, v in values.items() if v)
            got = from_scontrol(synthetic)
            if got.kind == "cancelled" and parts[1].strip() != state:  # "CANCELLED by 1234"
                return JobState("cancelled", got.exit_code, note=f"Slurm {parts[1].strip()}")
            return got
    return None


def interpret(answer: StatusAnswer, job_id: str) -> tuple[JobState | None, str]:
    """The job's state, or (None, why) when nobody can tell: the controller unreachable (retry) or the job lost.

    The second value is the explanation that goes with a None or a `lost` state.
    """
    if answer.scontrol_rc == 0 and answer.scontrol:
        return from_scontrol(answer.scontrol.splitlines()[0]), ""
    if unreachable(answer.scontrol):
        return None, f"the Slurm controller did not answer: {answer.scontrol}"
    why = [f"scontrol: {answer.scontrol or 'no answer'}"]
    if answer.sacct_rc is None:
        why.append("sacct: not installed")
    elif answer.sacct_rc == 0:
        got = from_sacct(answer.sacct, job_id)
        if got is not None:
            return got, ""
        why.append("sacct: no record of the job")
    else:
        why.append(f"sacct: {answer.sacct}")
    if answer.exit_file is not None and answer.exit_file.strip().lstrip("-").isdigit():
        return JobState("exited", int(answer.exit_file.strip()), note="from the job's exit_code file"), ""
    if _UNKNOWN_JOB not in answer.scontrol:
        return None, "; ".join(why)
    return JobState("lost", note="Slurm no longer knows the job and it left no exit_code (" + "; ".join(why) + ")"), ""
