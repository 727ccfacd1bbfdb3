"""The one exception hierarchy of alignflow.

```
AlignflowError                      retryable?
 +-- ConfigError                    no   file:line and key named
 +-- TransportError(host)           yes  connect / auth / channel failure
 |    +-- CommandTimeout            yes
 |    +-- HostUnreachable           yes  the host did not answer within its connect timeout
 |    +-- HostUnusable              no   what retrying cannot change (exit 2); each names the `doctor` check
 |         +-- HostNotFound         no   the host's address does not resolve
 |         +-- HostKeyRejected      no   "trust it with: alignflow hosts trust NAME"
 |         +-- AuthenticationFailed no   the host refused our key (or the agent had none it accepts)
 |         +-- WorkdirUnusable      no   the host's workdir cannot be created or entered
 +-- PathNotAllowed                 no   a remote path outside the host's workdir
 +-- PathMissing                    no   a path that must exist on a host does not
 +-- PathExists                     no   a copy would overwrite different content at its destination
 +-- RemoteCommandError(result)     no   "<host>: `<cmd>` exited 1" + stderr tail
 +-- RemoteJobError(handle, state)  no   failed / lost / cancelled, with the job dir
 +-- ConversionError(problems)      no   every problem listed
 +-- LogParseError(source, line)    no
 +-- SentinelError                  no   a framework line that invalidates a run that exited 0
 +-- FingerprintMismatch            no
 +-- StoreError                     no   the database cannot be opened, migrated or written
 |    +-- StoreSchemaError          no   schema behind ("run `alignflow db upgrade`") or from a newer alignflow
 |    +-- StoreReadOnly             no   a write to a store on a read-only file system or directory
 |    +-- RecordNotFound            no   unknown id, ambiguous id prefix, unknown experiment
 |    +-- ImmutableRecord           no   a finished run / step run cannot change; a re-run makes new rows
 +-- PipelineError                  no   a step cannot run (missing upstream artifact, unknown step)
 +-- PreflightError                 no   the two sides' configurations differ; every mismatch listed
```

Third-party exceptions (paramiko, SQLAlchemy, yaml, pydantic) are translated into these at the edge that
calls the library. A failed *alignment* is a verdict, never an exception. Prefect retry rules read
`exc.retryable`; only the CLI chooses exit codes (`exit_code`): 0 pass, 1 a failed alignment or a run that
failed, 2 a usage or configuration error (`ConfigError`, an unknown or ambiguous id, a store schema to upgrade)
- what the user fixes before trying again.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the closest of `choices` (difflib's ratio >= 0.6), else for the one choice that
    has `word` as one of its `_`/`-`/`.` parts (`time` -> `time_limit`, whose ratio is 0.57), or "" when none is."""
    options = list(choices)
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if not close and word:
        close = [c for c in options if word.lower() in re.split(r"[_\-.]", c.lower())]
        close = close if len(close) == 1 else []
    return f" (did you mean '{close[0]}'?)" if close else ""


def did_you_mean_file(path: str | os.PathLike[str]) -> str:
    """` (did you mean 'dir/x.yaml'?)` for the file of `path`'s directory closest to a path that does not exist
    (`experiments/demoo.yaml` -> `experiments/demo.yaml`), or "" when none is close or the directory is unreadable."""
    given = Path(path)
    try:
        siblings = [p.name for p in given.parent.iterdir() if p.is_file()]
    except OSError:
        return ""
    close = did_you_mean(given.name, siblings).removeprefix(" (did you mean '").removesuffix("'?)")
    return f" (did you mean '{given.parent / close}'?)" if close else ""


class AlignflowError(Exception):
    """Base of every error alignflow raises on purpose."""

    retryable: bool = False
    exit_code: int = 1


class ConfigError(AlignflowError):
    """A configuration file is malformed, mistyped or inconsistent, or a command was asked for something that does
    not exist (exit code 2: a usage or configuration error).

    `problems` holds one `(path, line, message)` per problem so that a validator can print them all;
    `str(err)` renders them as `PATH:LINE: message` lines.
    """

    exit_code = 2

    def __init__(self, problems: Sequence[tuple[str, int | None, str]] | str) -> None:
        if isinstance(problems, str):
            problems = [("", None, problems)]
        self.problems: list[tuple[str, int | None, str]] = list(problems)
        super().__init__("\n".join(self.format_problem(p) for p in self.problems))

    @staticmethod
    def format_problem(problem: tuple[str, int | None, str]) -> str:
        path, line, message = problem
        if not path:
            return message
        return f"{path}:{line}: {message}" if line is not None else f"{path}: {message}"


class TransportError(AlignflowError):
    """Reaching a host failed (connect, authentication, channel). Safe to retry."""

    retryable = True

    def __init__(self, message: str, *, host: str) -> None:
        self.host = host
        super().__init__(f"{host}: {message}")


class CommandTimeout(TransportError):
    """A command did not finish within its timeout."""


class HostUnreachable(TransportError):
    """The host did not accept a connection within its connect timeout."""


class HostUnusable(TransportError):
    """A host that retrying cannot make usable: its name does not resolve, it presents a key we do not trust, it
    refuses our key, its workdir cannot be made. The step ends at once (issue 45: a `.invalid` address was retried
    for minutes), the run `error`, exit 2: the inventory or the host is the user's to fix. `check` is the line of
    `alignflow doctor` that shows the same problem."""

    retryable = False
    exit_code = 2
    check = "reachable"

    def __init__(self, message: str, *, host: str) -> None:
        self.cause = f"{host}: {message}"  # without the pointer to doctor (what doctor itself prints)
        super().__init__(f"{message}; `alignflow doctor --hosts <inventory>` shows it (check: {host} {self.check})",
                         host=host)


class HostNotFound(HostUnusable):
    """The host's address does not resolve (a typo, a host that was renamed, a `.invalid` name)."""


class HostKeyRejected(HostUnusable):
    """The host presented a key that is not in the managed known_hosts file (or a changed one)."""

    def __init__(self, message: str, *, host: str) -> None:
        super().__init__(f"{message}; if the key is right, trust it with: alignflow hosts trust {host}", host=host)


class AuthenticationFailed(HostUnusable):
    """The host refused every key offered (identity file or agent). Retrying does not help."""


class WorkdirUnusable(HostUnusable):
    """The host's workdir cannot be created or entered (no permission, a file in its place, a read-only disk)."""

    check = "workdir"


class PathNotAllowed(AlignflowError):
    """A remote path resolves outside the host's declared workdir."""

    def __init__(self, path: str, *, host: str, workdir: str) -> None:
        self.path, self.host, self.workdir = path, host, workdir
        super().__init__(f"{host}: path {path!r} is outside the host's workdir {workdir!r}")


class PathMissing(AlignflowError):
    """A path that must exist on a host does not."""

    def __init__(self, path: str, *, host: str) -> None:
        self.path, self.host = path, host
        super().__init__(f"{host}: no such file or directory: {path!r}")


class PathExists(AlignflowError):
    """A transfer's destination already holds different content; nothing was overwritten."""

    def __init__(self, message: str, *, path: str, host: str) -> None:
        self.path, self.host = path, host
        super().__init__(f"{host}: {message}")


class RemoteCommandError(AlignflowError):
    """A command ran and exited non-zero. `result` is the transport's `Completed` value."""

    def __init__(self, result: Any, *, tail_lines: int = 20) -> None:
        self.result = result
        cmd = " ".join(result.argv) if isinstance(result.argv, list | tuple) else str(result.argv)
        if len(cmd) > 300:
            cmd = cmd[:300] + " ..."
        stderr = (result.stderr or "").rstrip().splitlines()[-tail_lines:]
        detail = ("\n" + "\n".join("    " + line for line in stderr)) if stderr else ""
        super().__init__(f"{result.host}: `{cmd}` exited {result.exit_code}{detail}")


class RemoteJobError(AlignflowError):
    """A detached job ended badly: failed (non-zero exit), lost (process gone, no exit file) or cancelled."""

    def __init__(self, message: str, *, handle: Any = None, state: Any = None) -> None:
        self.handle, self.state = handle, state
        super().__init__(message)


class ConversionError(AlignflowError):
    """A checkpoint conversion found problems; every one of them is listed, nothing was written."""

    def __init__(self, problems: Sequence[str], *, header: str = "conversion failed") -> None:
        self.problems = list(problems)
        if len(self.problems) == 1:  # one line: what failed, and the file and problem that failed it
            super().__init__(f"{header}: {self.problems[0]}")
            return
        body = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{header} ({len(self.problems)} problem(s)):\n{body}")


class LogParseError(AlignflowError):
    """A training log cannot be parsed (no step lines, unreadable file, a malformed step line)."""

    def __init__(self, message: str, *, source: str = "", line: int | None = None) -> None:
        self.source, self.line = source, line
        where = f"{source}:{line}: " if source and line is not None else (f"{source}: " if source else "")
        super().__init__(f"{where}{message}")


class SentinelError(AlignflowError):
    """A run is invalid even though its process exited 0 (e.g. Megatron's silent non-strict load)."""

    def __init__(self, message: str, *, sentinels: Sequence[Any] = ()) -> None:
        self.sentinels = list(sentinels)
        super().__init__(message)


class FingerprintMismatch(AlignflowError):
    """A file's sha256 differs from the one expected (declared in config, or computed at the source)."""

    def __init__(self, message: str, *, expected: str | None = None, actual: str | None = None) -> None:
        self.expected, self.actual = expected, actual
        super().__init__(message)


class StoreError(AlignflowError):
    """The store (database) cannot be opened, migrated or written."""


class StoreSchemaError(StoreError):
    """The database schema is behind this alignflow (run `alignflow db upgrade`) or was made by a newer one."""

    exit_code = 2


class StoreReadOnly(StoreError):
    """A write to a store that can only be read (its directory or file system is read-only): reading commands
    work on it, a run needs a writable state directory or another `ALIGNFLOW_DB_URL`."""

    exit_code = 2


class RecordNotFound(StoreError):
    """No record has the requested id, or an id prefix matches several records."""

    exit_code = 2


class ImmutableRecord(StoreError):
    """A finished record cannot change: nothing recorded is overwritten, a re-run creates new records."""


class RunCancelled(AlignflowError):
    """The run was cancelled by this process (Ctrl-C, a stopped `serve`) while a step waited on a job that the
    cancellation did not see yet (launched as it read the run's jobs): the step kills its job itself."""


class PipelineError(AlignflowError):
    """A pipeline step cannot run: unknown step, missing upstream artifact, inconsistent request."""


class PreflightError(AlignflowError):
    """The NPU and GPU configurations differ in an alignment-critical setting; nothing was run.

    `report` is the `alignflow.preflight.PreflightReport`; the message lists every mismatch with both values and
    where each came from.
    """

    def __init__(self, message: str, *, report: Any = None) -> None:
        self.report = report
        super().__init__(message)
