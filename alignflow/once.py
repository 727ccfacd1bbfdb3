"""Created once: what runs share and make on first use is made by one of them while the others wait (issue 49).

Two runs started together on a fresh state dir both found no demo data, both generated it, and the second rename
lost (`[Errno 39] Directory not empty`): the run ended `error`. The same shape held for everything made on first use
and shared: a generated Hugging Face base, megatron-core's layout cache, a training two runs ask for at once. The one
mechanism:

```
made = create_once(dst, what="the data of demo", run_id=run_id, events=say,
                   build=lambda tmp: make_data(tmp / prefix, ...),   # into a staging directory (alignflow.staging)
                   verify=lambda path: fingerprint(path))            # by everyone, the creator included
made.value, made.created, made.waited_for
```

- **One creator.** The caller holds an exclusive `flock` of a lock file beside the destination (`.<name>.lock`,
  same directory, so every run that may create it sees the same file) from its first look at the destination until
  the destination is whole. The kernel drops the lock when its holder dies, kill -9 included: there is no stale
  lock to clean, and what the dead creator left half-made is a staging directory `staged_dir` sweeps.
- **Visible waits.** The holder writes who it is into the lock file (run id, process); a caller that finds the
  lock taken says `waiting for <what> (run <id> is creating it)` once, then waits (polling, so that a Ctrl-C of the
  main thread is taken at once).
- **Verified after.** Whoever finds the destination there once it holds the lock - it waited for its creator, or the
  destination was made by an earlier run - verifies it (`verify`: a fingerprint checked against what was declared),
  and so does the creator: a loser of the race uses what the winner made and never fails for having lost.

`exclusive(lock_path, ...)` is the lock alone, for a creation that is not a directory at a path: a file written
atomically (the layout cache), a training shared by cache key (`alignflow.runner.cache.one_at_a_time`).
Lock files stay where they are: removing one would let a newcomer lock a new file while a waiter holds the old one.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from alignflow import controller
from alignflow.staging import staged_dir

log = logging.getLogger(__name__)

T = TypeVar("T")
LOCK_SUFFIX = ".lock"
WAITING = "waiting for "  # how every wait starts (displays show these lines even when they hide the others)
POLL_S = 0.1  # how often a waiter tries the lock again (a blocking flock would not yield to Ctrl-C)
# No flock on this filesystem (some NFS mounts): nothing waits, as in `alignflow.staging`.
_NO_FLOCK = (errno.ENOLCK, errno.EBADF, errno.EOPNOTSUPP, errno.EINVAL)


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds (or last held) a lock, as its lock file says."""

    what: str
    run_id: str | None
    identity: controller.ControllerIdentity

    def describe(self) -> str:
        return f"run {self.run_id}" if self.run_id else self.identity.describe()

    def to_json(self) -> str:
        return json.dumps({"what": self.what, "run": self.run_id, "owner": self.identity.to_dict()})

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        try:
            doc = json.loads(text)
            return cls(str(doc["what"]), doc.get("run"), controller.ControllerIdentity.from_dict(doc["owner"]))
        except (ValueError, KeyError, TypeError):
            return None  # being written, or not ours


@dataclass(frozen=True, slots=True)
class Made(Generic[T]):
    """What `create_once` gave: the verified value, whether this caller created it, and whom it waited for."""

    value: T
    created: bool
    waited_for: Holder | None


def lock_path(dst: Path) -> Path:
    """The lock file of destination `dst`: `.<name>.lock` beside it."""
    return dst.parent / f".{dst.name}{LOCK_SUFFIX}"


def _read_holder(fd: int) -> Holder | None:
    try:
        return Holder.parse(os.pread(fd, 65536, 0).decode("utf-8", "replace"))
    except OSError:
        return None


@contextmanager
def exclusive(path: Path, *, what: str, run_id: str | None = None, events: Callable[[str], None] | None = None,
              check: Callable[[], None] | None = None) -> Iterator[Holder | None]:
    """Hold the exclusive flock of lock file `path` for the block, naming this caller in it; yields whom it waited
    for (None: the lock was free). A wait is said once, through `events` (else the log); `check` is called at each
    poll of a wait and may raise to end it (a run cancelled while it waits for another run's training)."""
    say = events or log.info
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    waited: Holder | None = None
    try:
        locked = True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waited = _read_holder(fd)
            if waited is None:  # taken a moment ago, its note not written yet
                time.sleep(POLL_S)
                waited = _read_holder(fd)
            by = waited.describe() if waited is not None else "another process"
            say(f"{WAITING}{what} ({by} is creating it)")
            while True:
                if check is not None:
                    check()
                time.sleep(POLL_S)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    continue
        except OSError as exc:
            if exc.errno not in _NO_FLOCK:
                raise
            locked = False
            log.warning("%s: no flock on this filesystem; %s is not protected from a concurrent creation", path,
                        what)
        if locked:
            note = Holder(what, run_id, controller.current()).to_json().encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, note, 0)
        yield waited
    finally:
        os.close(fd)  # releases the flock


@contextmanager
def unless_held(path: Path, *, what: str, run_id: str | None = None) -> Iterator[str | None]:
    """Hold the flock of lock file `path` for the block if it is free (yields None); if another process holds it,
    hold nothing and yield who that is (`run <id>`, `pid <pid> on <host>`, from its note). For what must not run
    twice at once and is not waited for: a second `alignflow serve` of one state dir reports the first and ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            if holder is None:
                time.sleep(POLL_S)
                holder = _read_holder(fd)
            yield holder.describe() if holder is not None else "another process"
            return
        except OSError as exc:
            if exc.errno not in _NO_FLOCK:
                raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, Holder(what, run_id, controller.current()).to_json().encode(), 0)
        yield None
    finally:
        os.close(fd)


def create_once(dst: Path, *, what: str, build: Callable[[Path], object], verify: Callable[[Path], T],
                run_id: str | None = None, events: Callable[[str], None] | None = None,
                mode: int = 0o755) -> Made[T]:
    """`dst` made by `build(staging_dir)` if it does not exist, by one caller at a time, then `verify(dst)`
    (module docstring). `what` names it in the waits and in the marker of its staging directory."""
    say = events or log.info
    dst.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(lock_path(dst), what=what, run_id=run_id, events=events) as waited:
        if dst.exists():
            return Made(verify(dst), created=False, waited_for=waited)
        with staged_dir(dst, purpose=f"create {what}", mode=mode) as tmp:
            build(tmp)
        value = verify(dst)
        say(f"created {what}: {dst}")
        return Made(value, created=True, waited_for=waited)
