"""The jobs seam of `Transport`: jobs go to the host's `Jobs`, and `wait` does not count a job's time in a
scheduler's queue against its deadline (Slurm itself: tests/transport/test_slurm.py)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from alignflow.config.hosts import Host
from alignflow.errors import CommandTimeout
from alignflow.transport import JobHandle, JobSpec, JobState, LocalShell, Transport


class QueueThenRun:
    """A scheduler stand-in: its job waits `queued_s` in a queue, then runs `running_s`, then exits 0."""

    deadline_slack_s = 0.0
    host = Host(name="h", role="cuda", workdir="/w")

    def __init__(self, queued_s: float, running_s: float) -> None:
        self.queued_s, self.running_s = queued_s, running_s
        self.start = 0.0
        self.launched: list[JobSpec] = []

    def launch(self, spec: JobSpec) -> JobHandle:
        self.launched.append(spec)
        self.start = time.monotonic()
        return JobHandle(host="h", job_id="j1", job_dir="/w/jobs/j1", pid=0, pgid=0, started_at=datetime.now(UTC),
                         name=spec.name, argv=spec.argv, scheduler_id="7")

    def attach(self, job_id: str) -> JobHandle:
        raise NotImplementedError

    def status(self, handle: JobHandle) -> JobState:
        age = time.monotonic() - self.start
        if age < self.queued_s:
            return JobState("pending", note="Slurm PENDING: Resources")
        return JobState("running") if age < self.queued_s + self.running_s else JobState("exited", 0)

    def cancel(self, handle: JobHandle, *, grace_s: float = 10.0) -> JobState:
        return JobState("cancelled")

    def slot_note(self, handle: JobHandle) -> str:
        return ""

    def tail(self, handle: JobHandle, n_bytes: int = 4096, stream: str = "stdout") -> str:
        return ""


def _transport(sched: QueueThenRun) -> Transport:
    return Transport(LocalShell(sched.host), jobs=lambda files: sched)  # a `scheduler: slurm` host gets SlurmJobs


def test_jobs_of_a_host_with_a_scheduler_go_to_the_scheduler() -> None:
    sched = QueueThenRun(0.0, 0.0)
    t = _transport(sched)
    handle = t.launch(JobSpec(["python", "train.py"], name="gpu_train", time_limit_s=60))
    assert handle.scheduler_id == "7"
    assert sched.launched[0].time_limit_s == 60
    assert t.wait(handle, poll_s=0.01).ok


def test_time_in_the_queue_does_not_count_against_the_deadline() -> None:
    t = _transport(QueueThenRun(queued_s=0.8, running_s=0.1))
    handle = t.launch(JobSpec(["x"], name="queued"))
    seen: list[str] = []
    assert t.wait(handle, poll_s=0.02, timeout_s=0.4, on_poll=lambda s: seen.append(s.kind)).ok
    assert seen[0] == "pending"


def test_time_running_does_count() -> None:
    t = _transport(QueueThenRun(queued_s=0.0, running_s=5.0))
    handle = t.launch(JobSpec(["x"], name="long"))
    with pytest.raises(CommandTimeout, match=r"still running after 0\.3 s"):
        t.wait(handle, poll_s=0.02, timeout_s=0.3)
