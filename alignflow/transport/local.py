"""`LocalShell`: a host that is this machine (the embedded default's three hosts, and the controller).

Commands run as subprocesses of the same bash scripts that `SSHShell` sends over SSH, so the local path
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

from alignflow.errors import CommandTimeout, TransportError
from alignflow.transport.shell import Result, Shell, Spawned


class LocalShell(Shell):
    """Run on this machine; the host's workdir confines paths exactly as on a remote host."""

    default_python = sys.executable
    on_this_machine = True  # copies to and from it need no ssh

    def exec(self, argv: Sequence[str], *, input: bytes | None = None, timeout_s: float | None = None) -> Result:
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
        return Result(proc.returncode, out, err, time.perf_counter() - start)

    def spawn(self, argv: Sequence[str]) -> Spawned:
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

    def read(self, n: int) -> bytes:
        assert self.proc.stdout is not None
        return bytes(self.proc.stdout.read1(n))  # type: ignore[attr-defined]  # a BufferedReader: what it has

    def read_line(self) -> bytes:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline()

    def finish(self, timeout_s: float | None = None) -> Result:
        try:
            out, err = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise CommandTimeout(f"command timed out after {timeout_s} s and was killed", host=self.host) from None
        return Result(self.proc.returncode, out, err, time.perf_counter() - self.start)

    def kill(self) -> None:
        _kill_group(self.proc)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
