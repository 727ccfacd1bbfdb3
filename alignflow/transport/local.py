"""`LocalTransport`: a host that is this machine (the embedded default's three hosts, and the controller).

Commands run as subprocesses of the same bash scripts that `SSHTransport` sends over SSH, so the local path
tests the production scripts. Each command gets its own session, so a timeout kills the whole group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from alignflow.config.hosts import Host
from alignflow.errors import CommandTimeout, TransportError
from alignflow.transport.shell import RawResult, ShellTransport, Spawned


class LocalTransport(ShellTransport):
    """Run on this machine; the host's workdir confines paths exactly as on a remote host."""

    def _default_python(self) -> str:
        return sys.executable

    def openssh_client(self) -> None:
        return None  # its files are on this machine: copies to and from it need no ssh

    def _controller(self) -> ShellTransport:
        return controller_transport()

    def _exec(self, argv: Sequence[str], *, input: bytes | None = None, timeout_s: float | None = None) -> RawResult:
        start = time.perf_counter()
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise TransportError(f"cannot start {argv[0]!r}: {exc.strerror or exc}", host=self.host.name) from exc
        try:
            out, err = proc.communicate(input, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise CommandTimeout(f"command timed out after {timeout_s} s and was killed", host=self.host.name) from None
        except BaseException:
            _kill_group(proc)
            raise
        return RawResult(proc.returncode, out, err, time.perf_counter() - start)


    def _spawn(self, argv: Sequence[str]) -> Spawned:
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            raise TransportError(f"cannot start {argv[0]!r}: {exc.strerror or exc}", host=self.host.name) from exc
        return _LocalSpawned(proc, self.host.name)


class _LocalSpawned:
    def __init__(self, proc: subprocess.Popen[bytes], host: str) -> None:
        self.proc, self.host, self.start = proc, host, time.perf_counter()

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def read_line(self) -> bytes:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline()

    def finish(self, timeout_s: float | None = None) -> RawResult:
        try:
            out, err = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise CommandTimeout(f"command timed out after {timeout_s} s and was killed", host=self.host) from None
        return RawResult(self.proc.returncode, out, err, time.perf_counter() - self.start)

    def kill(self) -> None:
        _kill_group(self.proc)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def controller_transport(*, memo_path: str | None = None) -> LocalTransport:
    """The controller's own filesystem as a transport (no workdir confinement: its paths are the user's).

    `put`/`get` are copies between the controller and a host; expressing the controller as a transport lets
    one verified-copy routine serve every direction.
    """
    from alignflow.fingerprint import default_memo_path

    host = Host(name="controller", role="controller", transport="local", workdir="/")
    return LocalTransport(host, memo_path=memo_path or str(default_memo_path()))
