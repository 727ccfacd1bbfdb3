"""Garbage on the hosts: what no run's record references, found and (on request) deleted.

A host's workdir accumulates step outputs (`artifacts/<step>/<dir>`), staged inputs (`inputs/<name>-<sha>`),
job directories (`jobs/<id>`) and, after a killed copy or conversion, staging leftovers (`.af-partial-*`,
`.<name>.XXXXXXXX.partial`, `.af-write.*`, `.af-replaced-*`). `find_garbage` lists those that no record of the
store references (`Store.host_references`), with their sizes; `delete` removes them. `local_staging` finds what
killed writers left in directories of this machine (a conversion's or an export's destination directory). The
rules, so that nothing a run's record points at is ever deleted (issue 16):
- an output, input or job directory is kept if a record names it, anything inside it, or a directory holding
  it, or if a recorded command's argument spells it;
- a staging leftover is kept if a record names it or something inside it, or if its writer still holds it (its
  flock) or may still live: a staging directory with an owner marker (`alignflow.staging`) is garbage exactly when
  its writer is known dead (whatever its age), kept while it lives or runs on another host;
- anything else modified less than `min_age_s` ago is kept (a step that just started and is not recorded yet);
- a store that records no run at all references nothing, which far more likely means the wrong store:
  `delete` refuses then.

Sizes and ages are measured on the host by a small probe (standard library only; links are never followed).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import posixpath
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from alignflow import controller, staging
from alignflow.config.hosts import Host, Inventory
from alignflow.errors import AlignflowError, TransportError
from alignflow.store.references import HostReferences
from alignflow.transport.facade import Transport

log = logging.getLogger(__name__)

Kind = Literal["output", "input", "job", "staging"]

STAGING_PREFIXES = (".af-partial-", ".af-write.", ".af-replaced-")


def is_staging(name: str) -> bool:
    """A staging name: a copy's (`.af-partial-*`), an atomic write's (`.af-write.*`, `.af-replaced-*`) or a
    conversion's (`.<name>.XXXXXXXX.partial`). The hosts' probe below runs this very function."""
    return name.startswith(STAGING_PREFIXES) or (name.startswith(".") and name.endswith(".partial"))


def remove_run_staging(state: Path, run_id: str) -> list[Path]:
    """Remove the staging names in a run's own directory on the controller (`runs/<id>/`: its fetched logs and
    reports), left by a controller killed in the middle of a copy or a write; returns what was removed. A later
    copy removes such leftovers beside its own destination, but none goes to a dead run's directory: call this
    once the run is known interrupted (nothing of it writes there any more)."""
    removed: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(state / "runs" / run_id):
        for name in [n for n in dirnames + filenames if is_staging(n)]:
            path = Path(dirpath) / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
            log.info("removed %s, left by the interrupted run %s's controller in the middle of a copy", path, run_id)
        dirnames[:] = [d for d in dirnames if not is_staging(d)]
    return removed


# The probe runs, on the host, alignflow.controller's own liveness check and alignflow.staging's own marker reader
# (both standard library only), so a host decides a staging directory's owner exactly as a local write does.
_PROBE = ("from __future__ import annotations\n"
          + inspect.getsource(controller).replace("from __future__ import annotations\n", "")
          + f"\nMARKER = {staging.MARKER!r}\nSTAGING_PREFIXES = {STAGING_PREFIXES!r}\n"
          + inspect.getsource(staging.read_marker) + inspect.getsource(is_staging) + r"""
import fcntl, json, os, stat, sys, time
root = sys.argv[1]

def owner(path):
    doc = read_marker(path) if os.path.isdir(path) and not os.path.islink(path) else None
    if doc is None:
        return None, ""
    identity = ControllerIdentity.from_dict(doc["owner"])
    return liveness(identity), f"{doc.get('purpose') or 'a writer'} ({identity.describe()})"

def usage(path):
    st = os.lstat(path)
    size, newest = (st.st_size if not stat.S_ISDIR(st.st_mode) else 0), st.st_mtime
    if stat.S_ISDIR(st.st_mode):
        for dirpath, dirnames, filenames in os.walk(path):
            for name in dirnames + filenames:
                try:
                    s = os.lstat(os.path.join(dirpath, name))
                except OSError:
                    continue
                newest = max(newest, s.st_mtime)
                if not stat.S_ISDIR(s.st_mode):
                    size += s.st_size
    return size, newest

def held(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)

def entries(rel):
    try:
        return sorted(os.listdir(os.path.join(root, rel)))
    except OSError:
        return []

out = []
def add(kind, rel):
    size, newest = usage(os.path.join(root, rel))
    is_held = kind == "staging" and held(os.path.join(root, rel))
    state, who = owner(os.path.join(root, rel)) if kind == "staging" and not is_held else (None, "")
    out.append({"kind": kind, "rel": rel, "size": size, "age_s": time.time() - newest, "held": is_held,
                "owner": state, "who": who})

for step in entries("artifacts"):
    if is_staging(step):
        add("staging", f"artifacts/{step}")
        continue
    for name in entries(f"artifacts/{step}"):
        add("staging" if is_staging(name) else "output", f"artifacts/{step}/{name}")
for name in entries("inputs"):
    add("staging" if is_staging(name) else "input", f"inputs/{name}")
for name in entries("jobs"):
    add("job", f"jobs/{name}")
# leftovers inside outputs (a conversion's `.<name>.XXXXXXXX.partial` beside its destination), two levels down
for step in entries("artifacts"):
    for name in entries(f"artifacts/{step}"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, "artifacts", step, name)):
            rel = os.path.relpath(dirpath, os.path.join(root, "artifacts", step, name))
            for leftover in [n for n in dirnames + filenames if is_staging(n)]:
                add("staging", os.path.relpath(os.path.join(dirpath, leftover), root))
            dirnames[:] = [d for d in dirnames if not is_staging(d)] if rel == "." else []
json.dump(out, sys.stdout)
""")


@dataclass(frozen=True, slots=True)
class Garbage:
    """One thing on a host that no record references."""

    host: str
    path: str
    kind: Kind
    size_bytes: int
    age_s: float
    why: str = ""  # for a staging directory with an owner marker: whose it was (known dead)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "path": self.path, "kind": self.kind, "size_bytes": self.size_bytes,
                "age_s": round(self.age_s, 1), "why": self.why}


@dataclass(frozen=True, slots=True)
class Survey:
    """What `find_garbage` found: the garbage, and the hosts it could not look at (with why)."""

    garbage: tuple[Garbage, ...]
    unreachable: tuple[tuple[str, str], ...]

    @property
    def size_bytes(self) -> int:
        return sum(g.size_bytes for g in self.garbage)


def find_garbage(inventory: Inventory, references: dict[str, HostReferences], *,
                 transport: Callable[[Host], Transport], min_age_s: float = 3600.0) -> Survey:
    """Everything on the inventory's hosts that no record references (see the module docstring)."""
    found: list[Garbage] = []
    unreachable: list[tuple[str, str]] = []
    for host in inventory.hosts.values():
        if host.role == "controller":
            continue
        try:
            found += _host_garbage(transport(host), references.get(host.name), min_age_s)
        except AlignflowError as exc:
            unreachable.append((host.name, str(exc)))
    return Survey(tuple(found), tuple(unreachable))


def _host_garbage(t: Transport, refs: HostReferences | None, min_age_s: float) -> list[Garbage]:
    wd = t.workdir()
    done = t.run([t.python(), "-c", _PROBE, wd.real], timeout_s=600)
    try:
        entries: list[dict[str, Any]] = json.loads(done.stdout)
    except ValueError as exc:
        raise TransportError(f"unreadable output of the gc probe ({exc})", host=t.host.name) from None
    refs = refs or HostReferences(frozenset(), frozenset())
    out: list[Garbage] = []
    for e in entries:
        kind: Kind = e["kind"]
        forms = {posixpath.join(wd.declared, e["rel"]), posixpath.join(wd.real, e["rel"])}
        staging = kind == "staging"
        owner = e.get("owner")
        if e["held"] or owner in ("alive", "unknown") or any(refs.references(p, inside=not staging) for p in forms):
            continue
        if owner != "dead" and e["age_s"] < min_age_s:  # a dead writer's staging goes whatever its age
            continue
        why = f"{e['who']} is dead" if owner == "dead" else ""
        out.append(Garbage(t.host.name, posixpath.join(wd.declared, e["rel"]), kind, int(e["size"]),
                           float(e["age_s"]), why))
    return _outermost(out)


def local_staging(directories: Iterable[Path]) -> list[Garbage]:
    """The staging directories in `directories` (beside the destinations written there) whose writers are known
    dead (`alignflow.staging.find_dead`), as garbage of this machine; nothing is removed."""
    out: list[Garbage] = []
    for directory in directories:
        for path, why in staging.find_dead(directory):
            size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
            age = max(0.0, time.time() - path.stat().st_mtime)
            out.append(Garbage("localhost", str(path), "staging", size, age, why))
    return out


def delete_local(garbage: Iterable[Garbage]) -> list[Garbage]:
    """Remove what `local_staging` found, each only if its writer is still known dead (`staging.sweep`)."""
    deleted: list[Garbage] = []
    for g in garbage:
        path = Path(g.path)
        if path in staging.sweep(path.parent, only_for=staging.staging_destination(path.name)):
            deleted.append(g)
    return deleted


def _outermost(items: Iterable[Garbage]) -> list[Garbage]:
    """Leave out what lies inside another item (deleting that one deletes it too)."""
    ordered = sorted(items, key=lambda g: g.path)
    kept: list[Garbage] = []
    for g in ordered:
        if kept and g.path.startswith(kept[-1].path.rstrip("/") + "/"):
            continue
        kept.append(g)
    return kept


def delete(survey: Survey, references: dict[str, HostReferences], *,
           transport: Callable[[Host], Transport], inventory: Inventory) -> list[Garbage]:
    """Delete the survey's garbage (links are removed, never followed); what was deleted.

    `references` is read again by the caller just before: an item a run started to reference since the
    survey is kept.
    """
    deleted: list[Garbage] = []
    for g in survey.garbage:
        refs = references.get(g.host)
        if refs is not None and refs.references(g.path, inside=g.kind != "staging"):
            log.info("%s: %s is referenced now; kept", g.host, g.path)
            continue
        transport(inventory.get(g.host)).remove(g.path, recursive=True)
        deleted.append(g)
    return deleted
