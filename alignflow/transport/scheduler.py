"""The scheduler seam: who starts a host's detached jobs, and who knows their state.

`ShellTransport` runs jobs itself on a `scheduler: direct` host (a `setsid` supervisor, host job slots; see
`alignflow.transport.jobs`). A host with another scheduler hands `launch`, `attach`, `status`, `cancel` and
`slot_note` to a `Scheduler` built over the same transport, so the runner - which only sees the `Transport`
protocol - is the same for both. Job files (`tail`, the output directory) stay the transport's: a scheduler
writes the job's stdout and stderr into the same job dir.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from alignflow.transport.jobs import JobHandle, JobSpec, JobState

if TYPE_CHECKING:
    from alignflow.transport.shell import ShellTransport


class Scheduler(Protocol):
    """Jobs of one host, through its transport."""

    deadline_slack_s: float
    """How long `wait` keeps polling past its own deadline: the scheduler enforces the job's limit itself."""

    def launch(self, spec: JobSpec) -> JobHandle: ...

    def attach(self, job_id: str) -> JobHandle: ...

    def status(self, handle: JobHandle) -> JobState: ...

    def cancel(self, handle: JobHandle, *, grace_s: float = 10.0) -> JobState: ...

    def slot_note(self, handle: JobHandle) -> str: ...


def scheduler_for(transport: ShellTransport) -> Scheduler | None:
    """The host's scheduler; None for `direct`, whose jobs `ShellTransport` runs itself."""
    if transport.host.scheduler == "slurm":
        from alignflow.transport.slurm import SlurmScheduler

        return SlurmScheduler(transport)
    return None
