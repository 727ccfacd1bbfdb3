"""`Transport`: the facade the runner drives - one host's files, jobs and copies, all over that host's `Shell`.

It holds no logic of its own: each method hands over to the part that does the work (`Files`, the host's `Jobs`,
`transfer.copy_files`), so a kind of host differs from another in its Shell alone, and a test's host is a
`Transport` over `alignflow.testing.FakeShell` running every line above the shell as production does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Literal

from alignflow.config.hosts import Host
from alignflow.fingerprint import Fingerprint
from alignflow.transport.files import Files, FollowedHash
from alignflow.transport.jobs import JobHandle, JobSpec, JobState
from alignflow.transport.jobs_direct import DirectJobs
from alignflow.transport.local import LocalShell
from alignflow.transport.results import Completed, PathStat, ProgressFn
from alignflow.transport.routes import Route
from alignflow.transport.scheduler import Clock, Jobs, PollFn, wait
from alignflow.transport.shell import Shell, Workdir
from alignflow.transport.slurm import SlurmJobs
from alignflow.transport.snapshot import HostSnapshot, take_snapshot
from alignflow.transport.transfer import copy_files


def _ssh_shell(host: Host) -> Shell:
    from alignflow.transport.ssh import SSHShell  # Paramiko: only where a host is reached over SSH

    return SSHShell(host)


SHELLS: dict[str, Callable[[Host], Shell]] = {"local": LocalShell, "ssh": _ssh_shell}
"""How a host of each `transport:` kind of hosts.yaml is reached."""
SCHEDULERS: dict[str, Callable[[Files], Jobs]] = {"direct": DirectJobs, "slurm": SlurmJobs}
"""Who runs the detached jobs of a host of each `scheduler:` kind."""


class Transport:
    """Run commands, jobs and file operations on one host (see `alignflow.transport` for the guarantees).

    `jobs`: the host's jobs over its files (default: the scheduler hosts.yaml names, from `SCHEDULERS`);
    `controller`: the other end of `put` and `get` (default: this machine's filesystem); `clock`: what `wait`
    sleeps on.
    """

    def __init__(self, shell: Shell, *, jobs: Callable[[Files], Jobs] | None = None, memo_path: str | None = None,
                 controller: Callable[[], Transport] | None = None, clock: Clock | None = None) -> None:
        self.shell = shell
        self.host: Host = shell.host
        self.files = Files(shell, memo_path=memo_path)
        self.jobs: Jobs = (jobs or SCHEDULERS[self.host.scheduler])(self.files)
        self._controller = controller or controller_transport
        self._clock = clock

    def close(self) -> None:
        """Release connections; the transport reconnects if used again."""
        self.shell.close()

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Transport({self.shell!r})"

    # -- commands and files (Files) ------------------------------------------------------------------------------
    def run(self, argv: Sequence[str], *, timeout_s: float | None = None, check: bool = True,
            env: Mapping[str, str] | None = None, cwd: str | None = None,
            input: str | bytes | None = None) -> Completed:
        return self.files.run(argv, timeout_s=timeout_s, check=check, env=env, cwd=cwd, input=input)

    def python(self) -> str:
        return self.files.python()

    def workdir(self) -> Workdir:
        return self.files.workdir()

    def path(self, p: str) -> str:
        return self.files.path(p)

    def exists(self, p: str) -> bool:
        return self.files.exists(p)

    def stat(self, p: str) -> PathStat | None:
        return self.files.stat(p)

    def mkdir(self, p: str) -> str:
        return self.files.mkdir(p)

    def read_text(self, p: str, *, max_bytes: int = 1 << 20) -> str:
        return self.files.read_text(p, max_bytes=max_bytes)

    def write_text(self, p: str, text: str) -> str:
        return self.files.write_text(p, text)

    def remove(self, p: str, *, recursive: bool = False) -> None:
        self.files.remove(p, recursive=recursive)

    def sha256(self, paths: Sequence[str], *, memo: bool = True) -> dict[str, Fingerprint]:
        return self.files.sha256(paths, memo=memo)

    def check_confined(self, paths: Sequence[str]) -> None:
        self.files.check_confined(paths)

    def follow_sha256(self, p: str) -> FollowedHash:
        return self.files.follow_sha256(p)

    def snapshot(self) -> HostSnapshot:
        return take_snapshot(self.files)

    # -- detached jobs (Jobs) ------------------------------------------------------------------------------------
    def launch(self, spec: JobSpec) -> JobHandle:
        return self.jobs.launch(spec)

    def attach(self, job_id: str) -> JobHandle:
        return self.jobs.attach(job_id)

    def status(self, handle: JobHandle) -> JobState:
        return self.jobs.status(handle)

    def tail(self, handle: JobHandle, n_bytes: int = 4096, stream: Literal["stdout", "stderr"] = "stdout") -> str:
        return self.jobs.tail(handle, n_bytes, stream)

    def cancel(self, handle: JobHandle, *, grace_s: float = 10.0) -> JobState:
        return self.jobs.cancel(handle, grace_s=grace_s)

    def slot_note(self, handle: JobHandle) -> str:
        return self.jobs.slot_note(handle)

    def wait(self, handle: JobHandle, *, poll_s: float = 5.0, timeout_s: float | None = None,
             on_poll: PollFn | None = None, check: bool = False) -> JobState:
        return wait(self.jobs, handle, poll_s=poll_s, timeout_s=timeout_s, on_poll=on_poll, check=check,
                    clock=self._clock)

    # -- copies (transfer) ---------------------------------------------------------------------------------------
    def put(self, local: str, remote: str, *, progress: ProgressFn | None = None,
            overwrite: bool = False) -> Fingerprint:
        """Copy a controller file or directory to the host; verified on the host by sha256 before it appears."""
        with self._controller() as ctl:
            return copy_files(ctl.files, os.path.abspath(local), self.files, remote, progress=progress,
                              overwrite=overwrite)

    def get(self, remote: str, local: str, *, progress: ProgressFn | None = None,
            overwrite: bool = False) -> Fingerprint:
        """Copy a host file or directory to the controller, verified against the sha256 computed on the host."""
        with self._controller() as ctl:
            return copy_files(self.files, remote, ctl.files, os.path.abspath(local), progress=progress,
                              overwrite=overwrite)

    def receive(self, src: Transport, src_path: str, dst_path: str, *,
                progress: ProgressFn | None = None) -> Fingerprint:
        """Copy `src:src_path` to `dst_path` here, host to host: verified on arrival, atomic."""
        return copy_files(src.files, src_path, self.files, dst_path, progress=progress)


def copy_between(src: Transport, src_path: str, dst: Transport, dst_path: str, *,
                 progress: ProgressFn | None = None, expected: Fingerprint | None = None, overwrite: bool = False,
                 route: Route = "auto") -> Fingerprint:
    """Copy a file or directory from one host to another; see `transfer.copy_files`."""
    return copy_files(src.files, src_path, dst.files, dst_path, progress=progress, expected=expected,
                      overwrite=overwrite, route=route)


def open_transport(host: Host) -> Transport:
    """The transport for `host` (nothing is connected until the first command)."""
    return Transport(SHELLS[host.transport](host))


def controller_transport(*, memo_path: str | None = None) -> Transport:
    """The controller's own filesystem as a transport (no workdir confinement: its paths are the user's).

    `put`/`get` are copies between the controller and a host; expressing the controller as a transport lets
    one verified-copy routine serve every direction. Its hash memo (and, beside it, its copy locks) is the state
    dir's, as the runner's (`$ALIGNFLOW_HASH_MEMO` when set): nothing of a run is written outside the state dir.
    """
    import os

    from alignflow.fingerprint import MEMO_ENV
    from alignflow.state import state_dir

    host = Host(name="controller", role="controller", transport="local", workdir="/")
    memo = memo_path or os.environ.get(MEMO_ENV) or str(state_dir() / "hashmemo.sqlite")
    return Transport(LocalShell(host), memo_path=memo)
