"""`SSHShell._pump` against paramiko's order of events when a command ends.

paramiko's `Channel._set_closed` sets `closed` before it sets the exit-status event. A reader that saw the status
missing and then the channel closed raised "channel closed before the command's exit status arrived" for a command
that had exited (a CI rehearsal on a busy machine failed so). The race cannot be timed with a real sshd: this channel
stands in for paramiko's and shows the reader exactly that order.
"""

from __future__ import annotations

import os
from typing import Any

from alignflow.transport.ssh import SSHShell


class _ClosingChannel:
    """A channel whose command exited 0: seen without its status first, then closed, then with its status."""

    def __init__(self) -> None:
        self.eof_received = False
        self.status_checks = 0
        self._never_readable, self._w = os.pipe()  # what the reader's select() waits on between looks

    @property
    def closed(self) -> bool:
        return self.status_checks > 0  # closed right after the first look at the status

    def exit_status_ready(self) -> bool:
        self.status_checks += 1
        return self.status_checks > 1

    def recv_exit_status(self) -> int:
        return 0

    def get_transport(self) -> Any:
        return type("Active", (), {"is_active": lambda self: True})()

    def fileno(self) -> int:
        return self._never_readable

    def shutdown_write(self) -> None: ...
    def send_ready(self) -> bool: return False
    def recv_ready(self) -> bool: return False
    def recv_stderr_ready(self) -> bool: return False


def test_a_channel_closed_a_moment_before_its_exit_status_is_seen_gives_that_status() -> None:
    shell = SSHShell.__new__(SSHShell)  # only `_pump` is used: no connection, no host
    assert shell._pump(_ClosingChannel(), None, None) == (b"", b"", 0)  # type: ignore[arg-type]
