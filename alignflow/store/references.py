"""What the store's records point at on each host: the query `alignflow gc` asks before it deletes anything."""

from __future__ import annotations

import posixpath
import shlex
from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import func, select

from alignflow.store.base import StoreBase
from alignflow.store.models import Artifact, Run, StepRun


@dataclass(frozen=True, slots=True)
class HostReferences:
    """The host paths that records name (artifacts, job dirs, step output dirs) and the commands they ran."""

    paths: frozenset[str]
    arguments: frozenset[str]  # every argument of every recorded command (`shlex.split` of the record)

    def references(self, path: str, *, inside: bool = True) -> bool:
        """Does a record name `path`, something below it, or (with `inside`) a directory that holds it?

        A recorded command counts when one of its arguments holds `path` (a staged input is recorded only in the
        command that read it).
        """
        path = posixpath.normpath(path)
        below = path.rstrip("/") + "/"
        for ref in self.paths:
            if ref == path or ref.startswith(below) or (inside and path.startswith(ref.rstrip("/") + "/")):
                return True
        return any(path in argument for argument in self.arguments)


class References(StoreBase):
    """The gc query (a mixin of `Store`)."""

    def run_count(self) -> int:
        """How many runs the store holds (gc refuses to delete anything on a store that records none)."""
        with self._read("count runs") as s:
            return int(s.scalar(select(func.count()).select_from(Run)) or 0)

    def host_references(self) -> dict[str, HostReferences]:
        """host name -> everything any run's records name on that host (see `HostReferences`)."""
        paths: dict[str, set[str]] = defaultdict(set)
        arguments: dict[str, set[str]] = defaultdict(set)
        with self._read("read the paths that records reference") as s:
            for host, path in s.execute(select(Artifact.host, Artifact.path)):
                paths[host].add(posixpath.normpath(path))
            for host, job_dir, handle, command in s.execute(
                    select(StepRun.host, StepRun.job_dir, StepRun.job_handle, StepRun.command)):
                if host is None:
                    continue
                for value in (job_dir, *((handle or {}).get(k) for k in ("job_dir", "out"))):
                    if isinstance(value, str) and value:
                        paths[host].add(posixpath.normpath(value))
                if command:
                    arguments[host].update(_split(command))
        hosts = paths.keys() | arguments.keys()
        return {h: HostReferences(frozenset(paths[h]), frozenset(arguments[h])) for h in hosts}


def _split(command: str) -> list[str]:
    """The arguments of a recorded command (`shlex.join` of its argv); the whole text if it does not split."""
    try:
        return shlex.split(command)
    except ValueError:
        return [command]
