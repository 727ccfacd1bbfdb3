"""Test doubles that alignflow ships for its own tests and yours: `FakeShell`, a host whose commands a function answers.

httpx ships `MockTransport(handler)` for its one-method transport seam
(https://github.com/encode/httpx/blob/master/httpx/_transports/mock.py). alignflow's seam is the `Shell`
(`alignflow.transport.shell`), so its fake is a Shell: everything above it - confinement, job records and polling,
copies with their verification, the runner - runs as in production, and the handler answers the one thing a host
does, running an argv. A fake only where the host is not the point; real hosts (sshd, Slurm) are tested in
`tests/transport` and `tests/flows`.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from alignflow.config.hosts import Host
from alignflow.transport.commands import script_name
from alignflow.transport.paths import expand_home
from alignflow.transport.shell import Result, Shell, Workdir

__all__ = ["Command", "FakeShell", "Handler", "Result"]


@dataclass(frozen=True, slots=True)
class Command:
    """What a `FakeShell` hands its handler: the argv, what came on stdin, the deadline."""

    argv: tuple[str, ...]
    input: bytes
    timeout_s: float | None

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
    """A host whose every command `handler` answers. Its workdir is the host's, as written (no round trip); `spawn`
    is the default one, which runs on `exec` when its output is first read."""

    def __init__(self, handler: Handler, host: Host | None = None) -> None:
        super().__init__(host or Host(name="fake", role="cpu", workdir="/fake"))
        self.handler = handler

    def exec(self, argv: Sequence[str], *, input: bytes | None = None, timeout_s: float | None = None) -> Result:
        return self.handler(Command(tuple(argv), input or b"", timeout_s))

    def workdir(self) -> Workdir:
        home = f"/home/{self.host.name}"
        wd = posixpath.normpath(expand_home(self.host.workdir, home))
        return Workdir(declared=wd, real=wd, home=home)
