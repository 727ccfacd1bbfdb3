"""The seam under the transport: a `Shell` runs an argv on one host, and everything else is built on it.

Shaped like httpx's `BaseTransport.handle_request`
(https://github.com/encode/httpx/blob/master/httpx/_transports/base.py), whose seam is total: a kind of host
provides two methods, and every guarantee above holds for any Shell that meets them. `exec(argv, input, timeout_s)
-> Result` runs a command to its end; `spawn(argv) -> Spawned` starts one that runs while the controller does
something else - a lock's holder keeps its lock until its stdin says so or closes, a hash follows a copy, a tar
stream flows between two hosts. `spawn` has no default: it cannot be built on `exec`, whose input is whole before
the command starts, and a stand-in that ran the command on `exec` once read from let a lock's holder print
"locked" and exit before the locked block ran (issue 46). `workdir()`, the directory its paths are confined to,
has a default that asks the host once.

```
Shell          LocalShell (local.py) | SSHShell (ssh.py) | SlurmLoginShell (slurm_login.py) | FakeShell (testing)
 +- Files      commands with the host's env, confined paths, small files, hashes on the host   (files.py)
 +- Jobs       DirectJobs (jobs_direct.py) | SlurmJobs (slurm.py), over Files                  (scheduler.py)
 +- locks      one flock per key, held by a spawned holder                                     (locks.py)
 +- copies     verified copies between two hosts' Files                                        (transfer.py)
Transport      the facade the runner drives: Files + Jobs + copies of one host                 (facade.py)
```

A new kind of host is a new Shell (docs/architecture.md#adding-a-transport).
"""

from __future__ import annotations

import posixpath
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from alignflow.config.hosts import Host
from alignflow.errors import WorkdirUnusable
from alignflow.transport import commands
from alignflow.transport.openssh import OpenSSHClient

# Deadline of the short control commands (status, tail, small files, launch). A peer that vanished without
# closing TCP would otherwise hang a poll until the kernel gives up (~15 min); on expiry the connection is
# dropped and `wait` reconnects.
CONTROL_TIMEOUT_S = 120.0

# $1: the declared workdir. Prints, NUL-separated, its real path, its `~`-expanded path and the home directory.
# NUL: a path may hold any byte but NUL, so no path is ever read from split lines (a workdir
# `/x/victim<newline>/x/victim` once became `/x/victim`, issue 16).
WORKDIR_SH = ('w=$1; case $w in "~") w=$HOME;; "~/"*) w=$HOME/${w#"~/"};; esac\n'
              'mkdir -p -m 700 -- "$w" && cd -P -- "$w" && printf "%s\\0" "$PWD" "$w" "$HOME"')


@dataclass(frozen=True, slots=True)
class Result:
    """What `Shell.exec` returns: the exit status, and the output as the host wrote it."""

    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""
    duration_s: float = 0.0

    def text(self, stream: Literal["stdout", "stderr"] = "stdout") -> str:
        return (self.stdout if stream == "stdout" else self.stderr).decode("utf-8", errors="replace")


class Spawned(Protocol):
    """A host command that runs while the controller does something else; the caller finishes or kills it."""

    def send(self, data: bytes) -> None:
        """Write `data` to the command's stdin."""
        ...

    def read(self, n: int) -> bytes:
        """Up to `n` bytes of the command's stdout (blocking); b"" at its end."""
        ...

    def read_line(self) -> bytes:
        """The next line of the command's stdout (blocking); what is left of it at end-of-file."""
        ...

    def finish(self, timeout_s: float | None = None) -> Result:
        """Close the command's stdin and wait for its end: its exit status and the output not read yet.
        `CommandTimeout` (the command killed) when `timeout_s` passes first."""
        ...

    def kill(self) -> None:
        """End the command now (its stdin closes with it)."""
        ...


@dataclass(frozen=True, slots=True)
class Workdir:
    declared: str  # `~` expanded, normalized
    real: str  # symlinks resolved on the host
    home: str


class Shell(ABC):
    """Runs argv on one host; see the module docstring."""

    default_python = "python3"
    """The host's interpreter for hashing, locks and snapshots when hosts.yaml names none (`Host.python`)."""
    on_this_machine = False
    """True when the host's paths are this machine's: copies to and from it are rsync or shutil here."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self._wd: Workdir | None = None
        self._wd_lock = threading.Lock()

    @abstractmethod
    def exec(self, argv: Sequence[str], *, input: bytes | None = None, timeout_s: float | None = None) -> Result:
        """Run `argv` on the host (no shell added) with `input` on its stdin.

        `TransportError` when the host cannot be reached (retryable: the caller may try again), `CommandTimeout`
        when `timeout_s` passes - the command is killed on the host.
        """

    @abstractmethod
    def spawn(self, argv: Sequence[str]) -> Spawned:
        """Start `argv` on the host now, its stdin open until `finish` or `kill` closes it.

        The process runs while the caller sends and reads: what it prints is readable before it ends, and it sees
        end-of-file on its stdin only when the caller finishes or kills it - or dies, so nothing a controller
        holds through it (a lock) outlives the controller. `TransportError` as for `exec`.
        """

    def openssh_client(self) -> OpenSSHClient | None:
        """How the controller's OpenSSH tools (rsync -e, ssh) reach this host's files; None where they do not.

        Copies pick their route from what both ends say here and in `on_this_machine` (transport.routes); a
        host reached neither way gets its bytes through `spawn`.
        """
        return None

    def workdir(self) -> Workdir:
        """The host's workdir (created on first use, mode 700), resolved once per shell."""
        with self._wd_lock:
            if self._wd is None:
                result = self.exec(commands.script("workdir", WORKDIR_SH, self.host.workdir),
                                   timeout_s=CONTROL_TIMEOUT_S)
                parts = result.stdout.split(b"\0")
                if result.exit_code != 0 or len(parts) != 4 or parts[3]:
                    raise WorkdirUnusable(
                        f"cannot create or enter workdir {self.host.workdir!r}: {result.text('stderr').strip()}",
                        host=self.host.name,
                    )
                self._wd = _workdir(parts[:3], self.host)
            return self._wd

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release connections; the shell reconnects if used again."""

    def __enter__(self) -> Shell:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.host.name!r})"


def _workdir(parts: list[bytes], host: Host) -> Workdir:
    """The workdir from the host's answer, refusing what no path of ours may hold (see `Host.workdir`)."""
    try:
        real, declared, home = (p.decode("utf-8") for p in parts)
    except UnicodeDecodeError:
        raise WorkdirUnusable(f"workdir {host.workdir!r}: the host answers with a path that is not UTF-8",
                              host=host.name) from None
    for what, value in (("resolves to", real), ("is", declared), ("is under the home", home)):
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise WorkdirUnusable(f"workdir {host.workdir!r} {what} {value!r}, which holds a control character; "
                                  "choose a workdir without one", host=host.name)
    return Workdir(declared=posixpath.normpath(declared), real=real, home=home)
