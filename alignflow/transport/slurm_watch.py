"""`Watcher`: what this process last heard from Slurm about the jobs it waits on, on one host.

Each step of a run waits on its job in its own thread, over its own transport; asked job by job, a matrix of ten
trainings cost ten status commands every poll. The host's watcher asks once for all of them, as submitit's
`InfoWatcher` does: one status command (one `sacct -j ID,ID,...`, the controller only for the jobs accounting
does not know yet) whenever some waiter's answer is older than its job allows, and every waiter reads its job's
line of that answer. A job is asked about every `min_s` (2 s) at first, then every tenth of the time it has been
waited on, up to `max_s` (60 s): a conversion that ends in seconds is seen to end within 2 s, and a 10-hour
training costs a command a minute, whatever the number of jobs. An ended job is never asked about again.

`SlurmJobs.cancel` does not wait for any of that: it asks for its job at once (`fresh`), and what it hears is what
the job's waiter reads next.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from alignflow.config.hosts import Host
from alignflow.transport.jobs import JobState
from alignflow.transport.slurm_state import StatusAnswer, interpret

Query = Callable[[Mapping[str, str]], Mapping[str, StatusAnswer]]
"""Slurm job id -> job dir in, each job's answer out: one status command on the host."""

NO_ANSWER = StatusAnswer(1, "", None, "", None)
FORGET_S = 600.0  # a job nobody asked about for this long (its waiter gave up) leaves the command


@dataclass
class _Job:
    job_dir: str
    since: float  # first asked about
    asked: float  # last asked about
    fetched: float = float("-inf")  # when the command that answered began
    answer: StatusAnswer = NO_ANSWER
    state: JobState | None = None  # None: nobody could tell (the controller did not answer)


class Watcher:
    """The jobs of one Slurm host that this process waits on, and their last answers. Thread-safe: one command
    runs at a time, and waiters that find it running wait for its answer rather than ask again."""

    def __init__(self, *, min_s: float = 2.0, max_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.min_s, self.max_s, self.clock = min_s, max_s, clock
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()  # guards _jobs
        self._asking = threading.Lock()  # held while the batched command runs

    def answer(self, slurm_id: str, job_dir: str, query: Query) -> StatusAnswer:
        """The job's last answer if recent enough for it, else a new one, asked for every job watched."""
        with self._lock:
            now = self.clock()
            job = self._jobs.setdefault(slurm_id, _Job(job_dir, now, now))
            job.asked = now
            if self._recent(job, now):
                return job.answer
        with self._asking:
            with self._lock:
                now = self.clock()
                if self._recent(job, now):  # another waiter's command answered meanwhile
                    return job.answer
                self._jobs = {i: j for i, j in self._jobs.items() if now - j.asked < FORGET_S or i == slurm_id}
                ask = {i: j.job_dir for i, j in self._jobs.items() if i == slurm_id or not _ended(j)}
            self._store(query(ask), now)
        return job.answer

    def fresh(self, slurm_id: str, job_dir: str, query: Query) -> StatusAnswer:
        """The job's answer now, asked for it alone (a cancel's); its waiter reads it too."""
        with self._lock:
            now = self.clock()
            job = self._jobs.setdefault(slurm_id, _Job(job_dir, now, now))
        self._store(query({slurm_id: job_dir}), now)
        return job.answer

    def _recent(self, job: _Job, now: float) -> bool:
        if _ended(job):
            return True
        age = now - job.fetched
        if job.state is None:  # no verdict (controller unreachable, never asked): ask again at the fastest
            return age < self.min_s and job.fetched > float("-inf")
        return age < min(self.max_s, max(self.min_s, (now - job.since) / 10))

    def _store(self, answers: Mapping[str, StatusAnswer], began: float) -> None:
        with self._lock:
            for slurm_id, answer in answers.items():
                job = self._jobs.get(slurm_id)
                # a cancel's answer stays: a command that began before it cannot know of the cancel
                if job is not None and job.fetched <= began:
                    job.answer, job.fetched = answer, began
                    job.state = interpret(answer, slurm_id)[0]


def _ended(job: _Job) -> bool:
    return job.state is not None and job.state.finished


_watchers: dict[str, Watcher] = {}
_watchers_lock = threading.Lock()


def watcher_for(host: Host) -> Watcher:
    """The process's watcher of `host`: shared by every transport to it (each step opens its own)."""
    with _watchers_lock:
        return _watchers.setdefault(host.model_dump_json(), Watcher())
