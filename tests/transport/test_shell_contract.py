"""The Shell's contract, met alike by a real shell (LocalShell: processes) and by `alignflow.testing.FakeShell` (a
handler in a thread): what locks and copies rely on. The fake's handler here answers as the bash command would."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from alignflow.config.hosts import Host
from alignflow.testing import Command, FakeShell
from alignflow.transport import Result, Shell, Transport
from alignflow.transport.local import LocalShell
from alignflow.transport.locks import host_lock
from tests.runner.hosts import DirHost

# Prints a line before it reads anything, echoes its first line of stdin, then reads to end-of-file and says so.
ECHO = ["bash", "-c", 'echo ready; read -r x; echo "got $x"; cat >/dev/null; echo end']


def _echo(command: Command) -> Result:
    """ECHO, as a FakeShell handler."""
    command.write(b"ready\n")
    command.write(b"got " + command.read_line())
    command.input  # noqa: B018 - to the end of stdin
    return Result(0, b"end\n")


def _local(tmp_path: Path) -> Shell:
    return LocalShell(Host(name="local", role="cpu", transport="local", workdir=str(tmp_path / "wd")))


def _fake(tmp_path: Path) -> Shell:
    host = Host(name="fake", role="cpu", workdir=str(tmp_path / "wd"))
    lab = DirHost(host)
    return FakeShell(lambda c: _echo(c) if c.argv == tuple(ECHO) else lab(c), host)


SHELLS = [pytest.param(_local, id="local", marks=pytest.mark.integration), pytest.param(_fake, id="fake")]


@pytest.mark.parametrize("make", SHELLS)
def test_a_spawned_command_runs_while_its_caller_sends_and_ends_at_the_end_of_its_stdin(
        make: Callable[[Path], Shell], tmp_path: Path) -> None:
    spawned = make(tmp_path).spawn(ECHO)
    assert spawned.read_line() == b"ready\n"  # it runs before anything was sent
    spawned.send(b"go\n")
    assert spawned.read_line() == b"got go\n"
    spawned.send(b"more, then end-of-file\n")
    done = spawned.finish(timeout_s=10)
    assert (done.exit_code, done.stdout) == (0, b"end\n")  # what was not read yet


@pytest.mark.parametrize("make", SHELLS)
def test_a_host_lock_holds_until_its_block_ends_and_a_second_controller_waits(
        make: Callable[[Path], Shell], tmp_path: Path) -> None:
    first, second = Transport(make(tmp_path)), Transport(make(tmp_path))  # two controllers, one host
    events: list[str] = []

    def other_controller() -> None:
        with host_lock(second.files, "copy:/in/ckpt", what="a copy"):
            events.append("second holds")

    with host_lock(first.files, "copy:/in/ckpt", what="a copy"):
        waiting = threading.Thread(target=other_controller)
        waiting.start()
        waiting.join(timeout=1.0)  # long enough for a holder that did not wait to have printed "locked"
        events.append("first releases")
    waiting.join(timeout=10)
    assert events == ["first releases", "second holds"]
    with host_lock(first.files, "copy:/in/ckpt", what="a copy"):  # and it is free again
        events.append("first again")
    assert events[-1] == "first again"
