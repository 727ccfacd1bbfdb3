"""One status command per Slurm host for all the jobs waited on (`alignflow.transport.slurm_watch`), against a
fake login node whose accounting (sacct) knows every job; the real Slurm: test_slurm.py."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

from alignflow.config.hosts import Host
from alignflow.testing import Command, FakeShell, Result
from alignflow.transport import JobHandle, Transport
from alignflow.transport.slurm import SlurmJobs
from alignflow.transport.slurm_watch import Watcher

HOST = Host(name="cluster", role="cuda", workdir="/w", scheduler="slurm", slurm={"partition": "debug"})
SPEED = 200.0  # fake seconds per real second: ten minutes of waiting in three


class FastClock:
    """Time that runs `SPEED` times faster than the real one, for every thread at once (sleeping included)."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def monotonic(self) -> float:
        return (time.monotonic() - self.start) * SPEED

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds / SPEED)

    def skip(self, seconds: float) -> None:
        self.start -= seconds / SPEED


class Cluster:
    """A login node whose sacct says each job runs until its end (fake seconds), then COMPLETED."""

    def __init__(self, clock: FastClock, ends: dict[str, float]) -> None:
        self.clock, self.ends = clock, ends
        self.asked: list[list[str]] = []  # the job ids of each status command
        self.cancelled: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, command: Command) -> Result:
        ids = list(dict.fromkeys(a for a in command.args if a.isdigit()))
        if command.name == "scancel":
            self.cancelled.add(ids[0])
            return Result(0, b"")
        assert command.name == "slurm-status", command.argv
        with self._lock:
            self.asked.append(ids)
        lines = [f"{i}|{self._state(i)}|0:{15 if i in self.cancelled else 0}|None|debug|00:00:01|01:00:00"
                 for i in ids]
        return Result(0, ("@@ SACCT 0\n" + "\n".join(lines) + "\n" + "".join(f"@@ JOB {i}\n" for i in ids)).encode())

    def _state(self, slurm_id: str) -> str:
        if slurm_id in self.cancelled:
            return "CANCELLED by 0"
        return "RUNNING" if self.clock.monotonic() < self.ends[slurm_id] else "COMPLETED"


def _handle(slurm_id: str) -> JobHandle:
    return JobHandle(host="cluster", job_id=f"j{slurm_id}", job_dir=f"/w/jobs/j{slurm_id}", pid=0, pgid=0,
                     started_at=datetime.now(UTC), name="train", argv=("x",), scheduler_id=slurm_id)


def test_ten_jobs_waited_on_at_once_cost_one_command_per_interval_backing_off_to_a_minute() -> None:
    clock = FastClock()
    ends = {str(100 + i): 120.0 + 50.0 * i for i in range(10)}  # 2 to 9.5 fake minutes
    cluster = Cluster(clock, ends)
    watcher = Watcher(clock=clock.monotonic)

    def wait(slurm_id: str) -> float:
        t = Transport(FakeShell(cluster, HOST), jobs=lambda f: SlurmJobs(f, watcher=watcher), clock=clock)
        assert t.wait(_handle(slurm_id), poll_s=2.0).ok  # every step its transport, polled every 2 s
        return clock.monotonic() - ends[slurm_id]

    with ThreadPoolExecutor(10) as pool:
        late = list(pool.map(wait, ends))
    # Asked job by job every 2 s, the ten waits cost over 1,700 commands. Batched, they cost one command per
    # interval: 2 s for the first 20 s, then a tenth of the time waited, up to a minute.
    print(f"{len(cluster.asked)} status commands")
    assert len(cluster.asked) < 80, len(cluster.asked)
    assert max(len(ids) for ids in cluster.asked) == 10  # one command asks for every job
    assert max(late) <= 60.0 + 5.0  # an end is seen within the interval of a job that long
    assert all(ids for ids in cluster.asked)


def test_a_cancel_asks_at_once_and_its_waiter_reads_the_end_without_asking_again() -> None:
    clock = FastClock()
    cluster = Cluster(clock, {"7": float("inf"), "8": float("inf")})
    watcher = Watcher(clock=clock.monotonic)
    t = Transport(FakeShell(cluster, HOST), jobs=lambda f: SlurmJobs(f, watcher=watcher), clock=clock)
    seven, eight = _handle("7"), _handle("8")
    assert t.status(seven).kind == "running"
    assert t.status(eight).kind == "running"
    clock.skip(1200.0)  # waited on for 20 minutes: asked every minute now
    t.status(seven)
    t.status(eight)
    asked = len(cluster.asked)
    assert t.cancel(seven).kind == "cancelled"  # does not wait for the minute to pass
    assert cluster.asked[asked:] == [["7"]]
    assert t.status(seven).note == "Slurm CANCELLED by 0"  # the waiter reads what the cancel heard
    assert t.status(eight).kind == "running"
    assert len(cluster.asked) == asked + 1
