"""`alignflow doctor`: is this machine (and every host of an inventory) ready to run an experiment?

One check per line, every problem listed at once (a new user fixes them in one go instead of meeting them one run
at a time). On the controller: Python, rsync, setsid, flock, ssh, free disk in the state dir, the Prefect API, the
store's schema. On each host, through its own transport (so a local host is checked exactly like an SSH one):
reachable, its Python (and alignflow importable with it), rsync, setsid, flock, free disk in its workdir.

What is required depends on the inventory: rsync and ssh only matter when some host is reached over SSH (local
hosts copy with Python's shutil without rsync, alignflow.transport.routes); setsid and flock always do (every
step is a detached job holding a slot lock, alignflow/transport/jobs.py).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alignflow.config.hosts import Host, Inventory

MIN_PYTHON = (3, 11)
DEFAULT_MIN_FREE_BYTES = 2 << 30
# Debian/Ubuntu package that provides each tool (what to install).
PACKAGES = {"rsync": "rsync", "setsid": "util-linux", "flock": "util-linux", "ssh": "openssh-client"}
_PROBE = r"""
for t in rsync setsid flock; do printf '%s=%s\n' "$t" "$(command -v "$t" || true)"; done
d=$1; while [ ! -e "$d" ]; do d=$(dirname -- "$d"); done
printf 'free_kib=%s\n' "$(df -Pk -- "$d" | awk 'NR==2 {print $4}')"
if [ -d "$d" ] && [ -w "$d" ] && [ -x "$d" ]; then w=ok; [ "$d" = "$1" ] || w="created on first use, in $d"
elif [ "$d" = "$1" ]; then w="not a writable directory"; else w="cannot be created: $d is not writable"; fi
printf 'workdir=%s\n' "$w"
printf 'python=%s\n' "$("$2" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)"
printf 'alignflow=%s\n' "$("$2" -c 'import alignflow, importlib.metadata as m; print(m.version("alignflow"))' \
  2>/dev/null)"
"""


@dataclass(frozen=True, slots=True)
class Check:
    """One line of the doctor's table."""

    where: str  # "controller" or a host name
    what: str
    ok: bool
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"where": self.where, "what": self.what, "ok": self.ok, "detail": self.detail}


def _tool(where: str, name: str, path: str | None, *, needed: bool, why: str) -> Check:
    if path:
        return Check(where, name, True, path)
    if not needed:
        return Check(where, name, True, f"not installed ({why})")
    return Check(where, name, False, f"not installed: install `{PACKAGES[name]}` ({why})")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def _disk(where: str, path: Path | str, free: int | None, min_free: int) -> Check:
    if free is None:
        return Check(where, "disk", False, f"cannot tell the free space at {path}")
    ok = free >= min_free
    return Check(where, "disk", ok, f"{_gib(free)} free at {path}" + ("" if ok else f"; needs {_gib(min_free)}"))


def _free_bytes(path: Path) -> int | None:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def prefect_check(environ: Mapping[str, str]) -> Check:
    url = environ.get("PREFECT_API_URL")
    if not url:
        if importlib.util.find_spec("prefect") is None:
            return Check("controller", "prefect", False, "the prefect package is not installed (`make venv`)")
        return Check("controller", "prefect", True, "PREFECT_API_URL not set: `alignflow run` uses its own server "
                     "under the state dir (`alignflow server start` keeps one)")
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=10) as resp:
            healthy = json.loads(resp.read().decode() or "null") is True
    except (OSError, ValueError) as exc:
        return Check("controller", "prefect", False, f"PREFECT_API_URL={url} does not answer ({exc}); start that "
                     "server or unset PREFECT_API_URL")
    return Check("controller", "prefect", healthy, f"{url} healthy" if healthy else f"{url}/health is not true")


def store_check(url: str) -> Check:
    from alignflow.errors import StoreError
    from alignflow.store import database

    missing = database.missing_sqlite_file(url)
    if missing is not None:
        return Check("controller", "store", True, f"{missing}: none yet (created and migrated by the first run)")
    engine = database.create_store_engine(url)
    try:
        state = database.schema_state(engine)
    except StoreError as exc:
        return Check("controller", "store", False, str(exc))
    finally:
        engine.dispose()
    if state.up_to_date:
        return Check("controller", "store", True, f"{state.url} at revision {state.head}")
    if not state.known:
        return Check("controller", "store", False, f"{state.url} is at revision {state.current}, from a newer "
                     "alignflow; upgrade alignflow")
    return Check("controller", "store", True, f"{state.url} at {state.current or 'an empty schema'}; the next "
                 f"command upgrades it to {state.head} (or `alignflow db upgrade`)")


def controller_checks(inventory: Inventory, *, state: Path, db_url: str, environ: Mapping[str, str],
                      min_free_bytes: int = DEFAULT_MIN_FREE_BYTES,
                      which: Callable[[str], str | None] = shutil.which) -> list[Check]:
    uses_ssh = any(h.transport == "ssh" for h in inventory.hosts.values())
    version = sys.version_info[:3]
    checks = [Check("controller", "python", version[:2] >= MIN_PYTHON,
                    f"{sys.executable} {'.'.join(map(str, version))}"
                    + ("" if version[:2] >= MIN_PYTHON else f"; alignflow needs {'.'.join(map(str, MIN_PYTHON))}+"))]
    checks.append(_tool("controller", "rsync", which("rsync"), needed=uses_ssh,
                        why="copies to and from SSH hosts" if uses_ssh else "local hosts copy with Python"))
    checks.append(_tool("controller", "ssh", which("ssh"), needed=uses_ssh,
                        why="the inventory has SSH hosts" if uses_ssh else "no SSH host in the inventory"))
    checks.append(_disk("controller", state, _free_bytes(state), min_free_bytes))
    checks.append(prefect_check(environ))
    checks.append(store_check(db_url))
    return checks


def host_checks(host: Host, *, transport_factory: Callable[[Host], Any],
                min_free_bytes: int = DEFAULT_MIN_FREE_BYTES) -> list[Check]:
    """The checks of one host, run through its transport; an unreachable host is one failed check."""
    from alignflow.errors import AlignflowError

    where = host.name
    try:
        with transport_factory(host) as t:
            done = t.run(["bash", "-c", _PROBE, "doctor", host.workdir, t.python()],
                         timeout_s=host.connect_timeout_s + 60, check=False)
    except AlignflowError as exc:
        return [Check(where, getattr(exc, "check", "reachable"), False, getattr(exc, "cause", str(exc)))]
    facts = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    checks = [Check(where, "reachable", True, f"{host.transport}" + (f" {host.user}@{host.address}"
                                                                     if host.transport == "ssh" else ""))]
    py, af = facts.get("python", ""), facts.get("alignflow", "")
    if not py:
        checks.append(Check(where, "python", False, f"{host.python or 'python3'} does not run on {where}; set "
                            "`python:` in the inventory"))
    else:
        major_minor = tuple(int(x) for x in py.split(".")[:2])
        ok = major_minor >= MIN_PYTHON and bool(af)
        detail = f"{py}, alignflow {af}" if af else f"{py}, but alignflow is not importable with it"
        checks.append(Check(where, "python", ok, detail if major_minor >= MIN_PYTHON else f"{py}: needs 3.11+"))
    checks.append(_tool(where, "rsync", facts.get("rsync"), needed=host.transport == "ssh",
                        why="copies to and from SSH hosts" if host.transport == "ssh" else "local host"))
    for tool in ("setsid", "flock"):
        checks.append(_tool(where, tool, facts.get(tool), needed=True, why="detached jobs and their slots"))
    workdir = facts.get("workdir", "")
    checks.append(Check(where, "workdir", workdir == "ok" or workdir.startswith("created on first use"),
                        f"{host.workdir}: {workdir or 'not probed'}"))
    free = facts.get("free_kib", "")
    checks.append(_disk(where, host.workdir, int(free) * 1024 if free.isdigit() else None, min_free_bytes))
    return checks
