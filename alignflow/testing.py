"""Test doubles that alignflow ships for its own tests and yours: `FakeShell`, a host whose commands a function answers.

httpx ships `MockTransport(handler)` for its one-method transport seam
(https://github.com/encode/httpx/blob/master/httpx/_transports/mock.py). alignflow's seam is the `Shell`
(`alignflow.transport.shell`), so its fake is a Shell: everything above it - confinement, job records and polling,
copies with their verification, the runner - runs as in production, and the handler answers the one thing a host
does, running an argv. It meets the Shell's whole contract: a spawned command starts at once, in a thread, and
reads its stdin (`Command.read_line`, `Command.input`) as the caller sends it, up to end-of-file when the caller
finishes or kills it; what it writes (`Command.write`) the caller reads while it runs. A fake only where the host is
not the point; real hosts (sshd, Slurm) are tested in `tests/transport` and `tests/flows`.

```python
def host(command: Command) -> Result:
    if command.name == "stat":                    # our scripts are named (`alignflow.transport.commands.script`)
        return Result(0, b"regular file|5|1700000000.0|644\\n")
    return Result(127, b"", f"not faked: {command.argv}".encode())

t = Transport(FakeShell(host))
assert t.stat("x").size_bytes == 5                # the real `Files.stat` parsed the fake's answer
```
"""

from __future__ import annotations

import posixpath
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from alignflow.config.hosts import Host
from alignflow.errors import CommandTimeout
from alignflow.transport.commands import script_name
from alignflow.transport.paths import expand_home
from alignflow.transport.shell import Result, Shell, Spawned, Workdir

__all__ = ["Command", "FakeShell", "Handler", "Pipe", "Result"]


class Pipe:
    """One direction of a fake command's stdio: bytes written on one end, read (blocking) on the other until it is
    closed. It keeps everything written, so `everything()` is what came through it, whatever was read."""

    def __init__(self, data: bytes = b"", *, closed: bool = False) -> None:
        self._data, self._pos, self._closed = bytearray(data), 0, closed
        self._changed = threading.Condition()

    def write(self, data: bytes) -> None:
        with self._changed:
            if not self._closed:  # past its end nothing reads a pipe any more
                self._data += data
                self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _take(self, end: Callable[[], int | None]) -> bytes:
        with self._changed:
            while (stop := end()) is None and not self._closed:
                self._changed.wait()
            stop = len(self._data) if stop is None else stop
            out, self._pos = bytes(self._data[self._pos:stop]), stop
            return out

    def read(self, n: int) -> bytes:
        """Up to `n` bytes once some are there; b"" at the end."""
        return self._take(lambda: min(len(self._data), self._pos + n) if len(self._data) > self._pos else None)

    def read_line(self) -> bytes:
        """The next line; what is left at the end."""
        return self._take(lambda: None if (i := self._data.find(b"\n", self._pos)) < 0 else i + 1)

    def rest(self) -> bytes:
        """Everything not read yet, once the pipe is closed."""
        return self._take(lambda: None)

    def everything(self) -> bytes:
        """All that was written, once the pipe is closed."""
        with self._changed:
            self._changed.wait_for(lambda: self._closed)
            return bytes(self._data)


@dataclass(frozen=True, slots=True)
class Command:
    """What a `FakeShell` hands its handler: the argv, its stdin, the deadline, and its stdout to write to while it
    runs (what the handler returns is appended when it ends)."""

    argv: tuple[str, ...]
    stdin: Pipe
    timeout_s: float | None = None
    stdout: Pipe = field(default_factory=Pipe)

    @property
    def input(self) -> bytes:
        """All that came on stdin (for a spawned command: once the caller finished or killed it)."""
        return self.stdin.everything()

    def read_line(self) -> bytes:
        """The next line of stdin as it arrives; b"" at its end."""
        return self.stdin.read_line()

    def write(self, data: bytes) -> None:
        """Print `data` now: a spawned command's caller reads it while the handler goes on."""
        self.stdout.write(data)

    @property
    def name(self) -> str | None:
        """The name of one of our scripts (`"stat"`, `"launch"`, ...); None for any other argv."""
        return script_name(self.argv)

    @property
    def args(self) -> tuple[str, ...]:
        """The script's positional arguments ($1 ...), or the whole argv of any other command."""
        return self.argv[4:] if self.name is not None else self.argv


Handler = Callable[[Command], Result]


class FakeShell(Shell):
    """A host whose every command `handler` answers. Its workdir is the host's, as written (no round trip)."""

    def __init__(self, handler: Handler, host: Host | None = None) -> None:
        super().__init__(host or Host(name="fake", role="cpu", workdir="/fake"))
        self.handler = handler

    def exec(self, argv: Sequence[str], *, input: bytes | None = None, timeout_s: float | None = None) -> Result:
        command = Command(tuple(argv), Pipe(input or b"", closed=True), timeout_s)
        result = self.handler(command)
        command.stdout.write(result.stdout)
        command.stdout.close()
        return Result(result.exit_code, command.stdout.rest(), result.stderr, result.duration_s)

    def spawn(self, argv: Sequence[str]) -> Spawned:
        return _Running(self, Command(tuple(argv), Pipe()))

    def workdir(self) -> Workdir:
        home = f"/home/{self.host.name}"
        wd = posixpath.normpath(expand_home(self.host.workdir, home))
        return Workdir(declared=wd, real=wd, home=home)


class _Running:
    """A spawned command of a `FakeShell`: its handler, running in a thread from the start."""

    def __init__(self, shell: FakeShell, command: Command) -> None:
        self.shell, self.command = shell, command
        self.result: Result | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"fake {shell.host.name}: {command.name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self.shell.handler(self.command)
            self.command.write(self.result.stdout)
        except BaseException as exc:  # the caller's to see, as a real shell's lost connection
            self.error = exc
        finally:
            self.command.stdout.close()

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def send(self, data: bytes) -> None:
        self.command.stdin.write(data)

    def read(self, n: int) -> bytes:
        if not (out := self.command.stdout.read(n)):
            self._raise()
        return out

    def read_line(self) -> bytes:
        line = self.command.stdout.read_line()
        if not line.endswith(b"\n"):
            self._raise()
        return line

    def finish(self, timeout_s: float | None = None) -> Result:
        self.command.stdin.close()
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            raise CommandTimeout(f"command timed out after {timeout_s} s and was killed", host=self.shell.host.name)
        self._raise()
        assert self.result is not None
        return Result(self.result.exit_code, self.command.stdout.rest(), self.result.stderr, self.result.duration_s)

    def kill(self) -> None:
        self.command.stdin.close()  # a handler cannot be stopped from outside: it ends at the end of its stdin
