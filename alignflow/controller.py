"""Who is driving a run: the controller process's identity, and whether that process still lives.

A run records its controller when it starts (`Store.create_run`), so that a later `alignflow` command can tell a
run that is still being driven from one whose controller died (kill -9, a crash, a reboot) and would otherwise
stay `running` forever.

A pid alone is not an identity: pids are reused, and after a reboot every pid means something else. So the
identity is (host name, boot id, pid, the process's start time in clock ticks since boot), read from Linux's
`/proc` (proc(5): `/proc/sys/kernel/random/boot_id`, field 22 `starttime` of `/proc/PID/stat`). Where `/proc` is
missing, only (host, pid) is recorded and the check degrades to "a process with that pid exists".
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

PROC = Path("/proc")
Liveness = Literal["alive", "dead", "unknown"]


@dataclass(frozen=True, slots=True)
class ControllerIdentity:
    """One process on one boot of one host."""

    host: str
    pid: int
    boot_id: str | None = None
    start_ticks: int | None = None  # /proc/PID/stat field 22: start time in clock ticks after boot

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ControllerIdentity:
        return cls(host=str(doc["host"]), pid=int(doc["pid"]), boot_id=doc.get("boot_id"),
                   start_ticks=None if doc.get("start_ticks") is None else int(doc["start_ticks"]))

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


def boot_id(proc: Path = PROC) -> str | None:
    """This boot's random id (changes at every reboot), or None where the kernel does not say."""
    try:
        return (proc / "sys" / "kernel" / "random" / "boot_id").read_text().strip() or None
    except OSError:
        return None


def _stat_fields(pid: int, proc: Path) -> list[str] | None:
    """Fields 3.. of /proc/PID/stat (after the `(comm)`, which may hold spaces and parentheses)."""
    try:
        raw = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2:].split()


def process_start_ticks(pid: int, proc: Path = PROC) -> int | None:
    fields = _stat_fields(pid, proc)
    return int(fields[19]) if fields and len(fields) > 19 else None  # field 22 = index 19 after pid and comm


def descendants(pid: int, proc: Path = PROC) -> list[int]:
    """Every process below `pid` on this host, children first (field 4 of /proc/PID/stat: the parent's pid)."""
    parent: dict[int, int] = {}
    for entry in proc.iterdir() if proc.is_dir() else ():
        fields = _stat_fields(int(entry.name), proc) if entry.name.isdigit() else None
        if fields and len(fields) > 1 and fields[1].isdigit():
            parent[int(entry.name)] = int(fields[1])
    found, frontier = [], {pid}
    while frontier:
        below = sorted(child for child, ppid in parent.items() if ppid in frontier)
        found += below
        frontier = set(below)
    return found


def current(*, pid: int | None = None, proc: Path = PROC) -> ControllerIdentity:
    """The identity of this process (or of `pid` on this host)."""
    pid = os.getpid() if pid is None else pid
    return ControllerIdentity(host=socket.gethostname(), pid=pid, boot_id=boot_id(proc),
                              start_ticks=process_start_ticks(pid, proc))


def liveness(identity: ControllerIdentity, *, proc: Path = PROC, host: str | None = None) -> Liveness:
    """`alive` or `dead` when this host can tell; `unknown` for a controller on another host."""
    if identity.host != (host or socket.gethostname()):
        return "unknown"
    here = boot_id(proc)
    if identity.boot_id is not None and here is not None and identity.boot_id != here:
        return "dead"  # rebooted since: no process of that boot survives
    fields = _stat_fields(identity.pid, proc)
    if fields is None:
        if proc.is_dir():
            return "dead"
        return "alive" if _pid_exists(identity.pid) else "dead"
    if fields[0] in ("Z", "X"):  # a zombie (killed, not yet reaped) is dead
        return "dead"
    if identity.start_ticks is not None and len(fields) > 19 and int(fields[19]) != identity.start_ticks:
        return "dead"  # the pid was reused by a later process
    return "alive"


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def terminate(identity: ControllerIdentity, signal_number: int) -> bool:
    """Signal the controller if it is alive on this host; True if the signal was sent."""
    if liveness(identity) != "alive":
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(identity.pid, signal_number)
        return True
    return False
