"""Staged writes: a result is at its destination whole or not at all, whoever is killed when (issues 16, 33).

The one mechanism every alignflow writer of a directory on this machine uses (the conversions, the TensorBoard
export; a new writer, such as a `torch_dist` checkpoint writer, adopts it the same way):

```
with held_interruptions() as held:                       # the command: SIGINT / SIGTERM held, not lost
    with staged_dir(dst, purpose="convert megatron") as tmp:
        ... write into tmp; call check_interrupted() between units of work ...
    # dst exists, complete
held.completed          # the destinations committed (an interruption after them did not undo them)
```

`staged_dir(dst)` builds the result in a hidden sibling `.<name>.<8 random>.partial` (same filesystem, so the last
step, a rename, is atomic) and renames it to `dst` only when the block ends without an exception; any exception
removes it. An existing `dst` is refused. While it is being written, the staging directory

- holds a marker, `.alignflow-staging.json`, naming its owner: the writing process's identity (host, boot id,
  pid, start time: `alignflow.controller`), what writes it and for which destination;
- is held under an exclusive `flock`, which the kernel drops when the process dies, kill -9 included.

Who removes what a killed writer left (`sweep`): every `staged_dir` sweeps its own parent directory first, and
`alignflow gc` sweeps the hosts' workdirs (and the directories it is given). A staging directory is removed only
when its owner is known dead, never by its age (`owner_state`):

- its flock is held -> alive (kept);
- its marker names a process of this host: dead if that boot is over, if no process has that pid, or if the pid
  now belongs to a process that started later (`controller.liveness`); alive otherwise (kept);
- its marker names another host -> unknown (kept; a shared filesystem's other writer may be alive);
- no marker: a writer killed between creating the directory and writing its marker, or an alignflow older than
  markers. Creating a staging directory and writing its marker happen under a `flock` of the parent directory,
  which the sweep takes as well, so a live writer is never seen without its marker: one with nothing in it (but a
  torn marker) died at birth and is removed; one with content is removed only beside the destination whose name
  it carries (the rule before markers), never beside another one (it may not be alignflow's).

Interruptions (`held_interruptions`): the first SIGINT or SIGTERM is held and taken at the writer's next
`check_interrupted()` (a KeyboardInterrupt raised inside torch or safetensors comes out as an unrelated error,
issue 16) or, at the latest, just before the rename: then the staging directory is removed and `Interrupted`
raised (exit 130 / 143), and the destination does not exist. A signal during or after the rename does not undo it:
the destination is recorded in `HeldSignals.completed`, and the command says it completed (exit 0). A second
signal interrupts at once (still never between the rename and its record).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from alignflow import controller
from alignflow.state import writable_dir

log = logging.getLogger(__name__)

STAGING_SUFFIX = ".partial"
MARKER = ".alignflow-staging.json"
# `.<name>.` + mkdtemp's 8 characters + `.partial`: group 1 is the destination's name.
_STAGING = re.compile(r"^\.(.+)\.[a-z0-9_]{8}" + re.escape(STAGING_SUFFIX) + "$")
# The signals a staged write holds (the ones a person or a scheduler sends to stop a command).
HELD_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)

OwnerState = Literal["alive", "dead", "unknown"]


def staging_destination(name: str) -> str | None:
    """The destination name a staging directory name is for (`.ckpt.ab12cd34.partial` -> `ckpt`), or None."""
    m = _STAGING.match(name)
    return None if m is None else m.group(1)


# ---- interruptions -----------------------------------------------------------------------------------------


class Interrupted(KeyboardInterrupt):
    """A held SIGINT / SIGTERM taken: what was being written is not at its destination. Exit 128 + signal."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(signal.Signals(signum).name)


@dataclass
class HeldSignals:
    """What `held_interruptions` saw: the signals received and the destinations committed meanwhile."""

    received: list[int] = field(default_factory=list)
    completed: list[object] = field(default_factory=list)  # destinations (a Path for a directory)
    committing: bool = False

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.received[0]).name if self.received else ""

    def check(self) -> None:
        """Raise `Interrupted` if a signal is held (nothing is being committed)."""
        if self.received and not self.committing:
            raise Interrupted(self.received[0])


_active: HeldSignals | None = None


@contextmanager
def held_interruptions() -> Iterator[HeldSignals]:
    """Hold SIGINT and SIGTERM for the block (main thread only; elsewhere, and nested, it changes nothing).

    The first signal is recorded and taken at the next `check_interrupted()`; a second one raises at once, except
    while a destination is being committed. An error that leaves the block after that second signal (a library
    that turned its KeyboardInterrupt into an error of its own) comes out as `Interrupted`. What was committed is
    also kept for the process (`completed_in_process`): a signal after the block, while a command reports its
    result, must not make a complete result look interrupted.
    """
    global _active
    if _active is not None or threading.current_thread() is not threading.main_thread():
        yield _active if _active is not None else HeldSignals()
        return
    state = HeldSignals()

    def on_signal(signum: int, frame: object) -> None:
        state.received.append(signum)
        if len(state.received) > 1 and not state.committing:
            raise Interrupted(state.received[0])

    previous = {s: signal.signal(s, on_signal) for s in HELD_SIGNALS}
    _active = state
    try:
        yield state
    except Exception as exc:
        if len(state.received) > 1:
            raise Interrupted(state.received[0]) from exc
        raise
    finally:
        _active = None
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def completed_in_process() -> tuple[object, ...]:
    """Every destination committed by this process (under `held_interruptions` or not), oldest first."""
    return tuple(_completed)


_completed: list[object] = []


def check_interrupted() -> None:
    """Raise `Interrupted` if a held signal is waiting (call it between units of work: a tensor, a file)."""
    if _active is not None:
        _active.check()


@contextmanager
def committing(what: object) -> Iterator[None]:
    """The commit of a result (`what`: its destination): a held signal is taken before it (`Interrupted`), none
    interrupts inside it, and once the block is done `what` is in `HeldSignals.completed`."""
    state = _active
    if state is None:
        yield
        _completed.append(what)
        return
    state.check()
    state.committing = True
    try:
        yield
        state.completed.append(what)
        _completed.append(what)
    finally:
        state.committing = False


# ---- staging directories -----------------------------------------------------------------------------------


@contextmanager
def _locked(directory: Path) -> Iterator[bool]:
    """An exclusive flock of `directory` for the block; False where the filesystem has none (then nothing waits)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:  # NFS without lock support: ENOLCK, EBADF
            if exc.errno not in (errno.ENOLCK, errno.EBADF, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            yield False
            return
        yield True
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class StagingOwner:
    """Who writes a staging directory, as its marker records it."""

    identity: controller.ControllerIdentity
    purpose: str
    destination: str
    created: float

    def to_json(self) -> dict[str, Any]:
        return {"owner": self.identity.to_dict(), "purpose": self.purpose, "destination": self.destination,
                "created": self.created}

    @classmethod
    def read(cls, directory: Path) -> StagingOwner | None:
        """The marker of a staging directory; None if it has none or it cannot be read as one."""
        doc = read_marker(str(directory))
        if doc is None:
            return None
        return cls(controller.ControllerIdentity.from_dict(doc["owner"]), str(doc.get("purpose", "")),
                   str(doc.get("destination", "")), float(doc.get("created", 0.0)))


def read_marker(directory: str) -> dict[str, Any] | None:
    """The owner marker of a staging directory as written (`owner` checked readable), or None.

    Standard library only: `alignflow gc`'s probe runs this very function on the hosts.
    """
    try:
        with open(os.path.join(directory, MARKER), encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    owner = doc.get("owner") if isinstance(doc, dict) else None
    if not (isinstance(owner, dict) and isinstance(owner.get("host"), str) and isinstance(owner.get("pid"), int)):
        return None
    marker: dict[str, Any] = doc
    return marker


@contextmanager
def staged_dir(dst: Path, *, purpose: str, refuse: Callable[[str], BaseException] | None = None,
               mode: int = 0o755) -> Iterator[Path]:
    """A staging directory beside `dst` that becomes `dst` only if the block finishes (module docstring).

    `refuse(message)` builds the exception for an existing `dst` (default `FileExistsError`); `purpose` is what
    the marker says writes it (`convert megatron`). Dead staging in `dst`'s parent is removed first (`sweep`).
    """
    dst = Path(dst)
    if dst.exists() or dst.is_symlink():
        message = f"{dst}: already exists; remove it or choose another destination"
        raise refuse(message) if refuse is not None else FileExistsError(errno.EEXIST, message, str(dst))
    parent = dst.parent if str(dst.parent) else Path(".")
    # a read-only destination: a ConfigError (exit 2) naming the directory, no traceback
    writable_dir(parent, fix="make it writable or choose a destination you can write")
    with _locked(parent) as parent_locked:
        _sweep(parent, parent_locked, only_for=None, expected=dst.name)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=STAGING_SUFFIX, dir=parent))
        held = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with contextlib.suppress(OSError):  # a filesystem without flock: the marker alone tells liveness
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            owner = StagingOwner(controller.current(), purpose, str(dst.absolute()), time.time())
            (tmp / MARKER).write_text(json.dumps(owner.to_json()), encoding="utf-8")
            tmp.chmod(mode)  # mkdtemp makes it 0700; the result is an ordinary directory
        except BaseException:
            os.close(held)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    try:
        try:
            yield tmp
            with committing(dst), _locked(parent):
                (tmp / MARKER).unlink(missing_ok=True)
                os.replace(tmp, dst)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        os.close(held)


def owner_state(path: Path, *, parent_locked: bool, expected: str | None = None) -> tuple[OwnerState, str]:
    """Whether the writer of staging directory `path` lives, and why (module docstring). Call it holding the
    directory's flock (`sweep` does): a held flock is checked by the caller. `expected`: the destination name a
    marker-less directory may be removed beside."""
    owner = StagingOwner.read(path)
    if owner is None:
        if not parent_locked:
            return "unknown", "no owner marker, and the parent directory cannot be locked to tell why"
        try:
            born = set(os.listdir(path)) <= {MARKER}
        except OSError:
            born = False
        if born:  # nothing but a marker being written: a writer seen at birth holds the parent's lock
            return "dead", "its writer died creating it (nothing written in it)"
        if expected is not None and staging_destination(path.name) == expected:
            return "dead", "no owner marker: left by a writer of this destination that is not running"
        return "unknown", "no owner marker (not a staging directory of this destination)"
    state = controller.liveness(owner.identity)
    who = f"{owner.purpose or 'a writer'} ({owner.identity.describe()})"
    if state == "dead":
        return "dead", f"{who} is dead"
    if state == "unknown":
        return "unknown", f"{who} runs on another host"
    return "alive", f"{who} is running"


def sweep(parent: Path, *, only_for: str | None = None) -> list[Path]:
    """Remove the staging directories in `parent` whose writers are dead (module docstring); the ones removed.

    `only_for`: only those of that destination name (marker-less ones are removed only beside their own
    destination: `only_for`, or the destination a `staged_dir` is about to write).
    """
    with _locked(Path(parent)) as parent_locked:
        return [path for path, _ in _sweep(Path(parent), parent_locked, only_for=only_for)]


def find_dead(parent: Path) -> list[tuple[Path, str]]:
    """The staging directories in `parent` whose writers are dead, each with why; nothing is removed."""
    with _locked(Path(parent)) as parent_locked:
        return _sweep(Path(parent), parent_locked, only_for=None, delete=False)


def _sweep(parent: Path, parent_locked: bool, *, only_for: str | None, expected: str | None = None,
           delete: bool = True) -> list[tuple[Path, str]]:
    found: list[tuple[Path, str]] = []
    try:
        entries = [e for e in os.scandir(parent) if staging_destination(e.name) is not None]
    except OSError:
        return found
    for entry in entries:
        name = staging_destination(entry.name)
        if only_for is not None and name != only_for:
            continue
        if not entry.is_dir(follow_symlinks=False):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its writer holds it
            except OSError:
                pass  # no flock on this filesystem: the marker decides
            state, why = owner_state(Path(entry.path), parent_locked=parent_locked, expected=only_for or expected)
            if state != "dead":
                log.debug("kept %s: %s", entry.path, why)
                continue
            found.append((Path(entry.path), why))
            if delete:
                shutil.rmtree(entry.path, ignore_errors=True)
                log.info("removed %s, left by an interrupted write: %s", entry.path, why)
        finally:
            os.close(fd)
    return found
