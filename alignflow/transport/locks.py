"""Locks held ON a host, shared by every controller that reaches it: one per copy destination.

Two controllers that stage the same input at once (two first runs of one experiment) used to race: both
saw no copy, both copied, and the second to finish failed with "appeared while the copy was running" (issue
16). A copy now holds the destination's lock from its first look at the destination to the rename into place,
so the second caller waits, then finds the first's verified copy and adopts it (identical content is never a
conflict).

The lock is an exclusive `flock(2)` on `<workdir>/.alignflow/locks/<sha256 of the key>.lock`, held by a small
Python process on the host (the host's interpreter, as for hashing) that exits when its stdin closes. So it
cannot outlive its holder: a controller killed with SIGKILL closes its pipe or its SSH channel, the holder sees
end-of-file and exits, and the kernel drops the lock; there is no stale lock file to clean by hand.
"""

from __future__ import annotations

import hashlib
import logging
import posixpath
from collections.abc import Iterator
from contextlib import contextmanager

from alignflow.errors import TransportError
from alignflow.transport import commands
from alignflow.transport.files import Files

log = logging.getLogger(__name__)

# argv[1]: the lock file. Prints "waiting" if another holder has it, "locked" once it is ours; keeps it until a
# line (or end-of-file) arrives on stdin.
_HOLDER = """
import fcntl, os, sys
path = sys.argv[1]
os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    sys.stdout.write("waiting\\n")
    sys.stdout.flush()
    fcntl.flock(fd, fcntl.LOCK_EX)
sys.stdout.write("locked\\n")
sys.stdout.flush()
sys.stdin.readline()
"""


def lock_path(t: Files, key: str) -> str:
    """Where the lock named `key` lives on the host: under the workdir, or beside the controller's hash memo."""
    name = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:32] + ".lock"
    wd = t.workdir().real
    base = posixpath.join(wd, ".alignflow") if wd != "/" else posixpath.dirname(t.memo_path())
    return posixpath.join(base, "locks", name)


@contextmanager
def host_lock(t: Files, key: str, *, what: str) -> Iterator[None]:
    """Hold the host's exclusive lock named `key` for the duration of the block (`what` is for the log)."""
    path = lock_path(t, key)
    holder = t.shell.spawn(commands.script("lock", '"$@"\nexit $?', t.python(), "-c", _HOLDER, path,
                                           prologue=t.prologue()))
    try:
        line = holder.read_line()
        if line == b"waiting\n":
            log.info("%s: waiting for another controller's %s", t.host.name, what)
            line = holder.read_line()
        if line != b"locked\n":
            raw = holder.finish(timeout_s=30)
            raise TransportError(f"cannot take the lock for {what} ({path}): {t.python()} exited {raw.exit_code}: "
                                 f"{raw.text('stderr').strip()[-500:]}", host=t.host.name)
    except BaseException:
        holder.kill()
        raise
    try:
        yield
    finally:
        try:
            holder.send(b"release\n")
            holder.finish(timeout_s=30)
        except Exception as exc:  # the lock goes with the holder's end anyway; make sure it ends
            log.warning("%s: releasing the lock for %s: %s", t.host.name, what, exc)
            holder.kill()
