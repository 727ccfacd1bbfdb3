"""The transport seam: one protocol that the flow drives, whatever the host is (this machine or an SSH host).

Everything a pipeline step does on a host goes through these methods: commands as argv lists (never a shell
string), detached jobs, small files confined to the host's workdir, bulk copies verified by sha256 computed on
the hosts themselves, and a snapshot of the host's software. `LocalTransport` and `SSHTransport` implement it
with the same shell scripts, so the embedded default exercises every line that production uses above the
command edge (docs/architecture.md#key-interfaces).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from alignflow.errors import RemoteCommandError

if TYPE_CHECKING:
    from alignflow.config.hosts import Host
    from alignflow.fingerprint import Fingerprint
    from alignflow.transport.jobs import JobHandle, JobSpec, JobState
    from alignflow.transport.snapshot import HostSnapshot

ProgressFn = Callable[[int, int], None]
"""Progress of a transfer: `(bytes_done, bytes_total)`; called from the thread that runs the transfer."""

PollFn = Callable[["JobState"], None]
"""Called by `Transport.wait` after every poll with the job's current state."""


@dataclass(frozen=True, slots=True)
class Completed:
    """A finished command: our own value, never a fabric/invoke/subprocess result."""

    host: str
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def check(self) -> Completed:
        """Return self, or raise `RemoteCommandError` (exit code and stderr tail) when the command failed."""
        if self.exit_code != 0:
            raise RemoteCommandError(self)
        return self


@dataclass(frozen=True, slots=True)
class PathStat:
    """What `Transport.stat` tells about a path (symlinks followed)."""

    path: str
    kind: Literal["file", "dir", "other"]
    size_bytes: int
    mtime_ns: int
    mode: int


@runtime_checkable
class Transport(Protocol):
    """Run commands, jobs and file operations on one host; see `alignflow.transport` for the guarantees."""

    host: Host

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float | None = None,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        input: str | bytes | None = None,
    ) -> Completed: ...

    def python(self) -> str: ...

    def path(self, p: str) -> str: ...

    def launch(self, spec: JobSpec) -> JobHandle: ...

    def attach(self, job_id: str) -> JobHandle: ...

    def status(self, handle: JobHandle) -> JobState: ...

    def tail(self, handle: JobHandle, n_bytes: int = 4096, stream: Literal["stdout", "stderr"] = "stdout") -> str: ...

    def cancel(self, handle: JobHandle, *, grace_s: float = 10.0) -> JobState: ...

    def slot_note(self, handle: JobHandle) -> str: ...

    def wait(
        self,
        handle: JobHandle,
        *,
        poll_s: float = 5.0,
        timeout_s: float | None = None,
        on_poll: PollFn | None = None,
        check: bool = False,
    ) -> JobState: ...

    def put(
        self, local: str, remote: str, *, progress: ProgressFn | None = None, overwrite: bool = False
    ) -> Fingerprint: ...

    def get(
        self, remote: str, local: str, *, progress: ProgressFn | None = None, overwrite: bool = False
    ) -> Fingerprint: ...

    def receive(
        self, src: Transport, src_path: str, dst_path: str, *, progress: ProgressFn | None = None
    ) -> Fingerprint:
        """Copy `src_path` of another host's transport to `dst_path` here, verified on arrival."""
        ...

    def sha256(self, paths: Sequence[str]) -> dict[str, Fingerprint]: ...

    def exists(self, p: str) -> bool: ...

    def stat(self, p: str) -> PathStat | None: ...

    def mkdir(self, p: str) -> str: ...

    def read_text(self, p: str, *, max_bytes: int = 1 << 20) -> str: ...

    def write_text(self, p: str, text: str) -> str: ...

    def remove(self, p: str, *, recursive: bool = False) -> None: ...

    def snapshot(self) -> HostSnapshot: ...

    def close(self) -> None: ...
