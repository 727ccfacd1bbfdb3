"""Test doubles that alignflow ships for its own tests and yours: a `FakeTransport` with an in-memory filesystem.

A fake only where the real part is not the point: the runner's logic (planning, caching, recording, re-attaching,
failure policy, concurrency) is the same whatever the host is, and with `FakeTransport` it runs in milliseconds —
no process is started, no byte is written outside the test's temporary directory. Everything a real host does
(sshd, detached jobs, rsync, remote hashing) is tested with real hosts in `tests/transport` and `tests/flows`.

```python
from alignflow.testing import FakeJob, FakeTransport

def trains(spec: JobSpec) -> FakeJob:            # what a launched job "does": exit code, output, files
    return FakeJob(stdout=log_text, outputs={"checkpoint/model.safetensors": b"..."})

t = FakeTransport(host, script=trains)
handle = t.launch(JobSpec(["python", "train.py"], cwd=t.path("out")))
assert t.wait(handle).ok and t.exists("out/checkpoint/model.safetensors")
assert t.launched[0].argv == ("python", "train.py")  # every launch and command is recorded
```

`FakeTransport.on_disk(host, root)` is the same fake acting on a real directory in-process (the controller's own
files: data, fetched logs, reports).
"""

from __future__ import annotations

import hashlib
import itertools
import posixpath
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, Protocol

from alignflow.config.hosts import Host
from alignflow.errors import CommandTimeout, PathExists, PathMissing, PathNotAllowed, RemoteJobError
from alignflow.fingerprint import FileEntry, Fingerprint, canonical_manifest
from alignflow.transport.facade import Transport
from alignflow.transport.jobs import JobHandle, JobSpec, JobState, PollFn, new_job_id
from alignflow.transport.results import Completed, PathStat, ProgressFn
from alignflow.transport.snapshot import HostSnapshot

Content = str | bytes


@dataclass(frozen=True, slots=True)
class FakeJob:
    """What a launched job does: it runs for `running_polls` polls (`None`: never ends by itself), then exits
    with `exit_code`, having printed `stdout`/`stderr` and written `outputs` (paths relative to its cwd)."""

    exit_code: int = 0
    stdout: str = ""
    stderr: str = ""
    outputs: Mapping[str, Content] = field(default_factory=dict)
    running_polls: int | None = 0


JobScript = Callable[[JobSpec], FakeJob]


class FileSystem(Protocol):
    """Where a `FakeTransport` keeps its files: absolute POSIX paths."""

    def is_file(self, p: str) -> bool: ...
    def is_dir(self, p: str) -> bool: ...
    def read(self, p: str) -> bytes: ...
    def write(self, p: str, data: bytes) -> None: ...
    def mkdir(self, p: str) -> None: ...
    def remove(self, p: str) -> None: ...
    def files_under(self, p: str) -> list[str]: ...


class MemoryFS:
    """Files in a dict; a directory exists when it was made or holds a file."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.dirs: set[str] = {"/"}

    def is_file(self, p: str) -> bool:
        return p in self.files

    def is_dir(self, p: str) -> bool:
        return p in self.dirs or any(f.startswith(p.rstrip("/") + "/") for f in self.files)

    def read(self, p: str) -> bytes:
        return self.files[p]

    def write(self, p: str, data: bytes) -> None:
        self.mkdir(posixpath.dirname(p))
        self.files[p] = data

    def mkdir(self, p: str) -> None:
        while p not in ("", "/"):
            self.dirs.add(p)
            p = posixpath.dirname(p)

    def remove(self, p: str) -> None:
        prefix = p.rstrip("/") + "/"
        self.files = {k: v for k, v in self.files.items() if k != p and not k.startswith(prefix)}
        self.dirs = {d for d in self.dirs if d != p and not d.startswith(prefix)}

    def files_under(self, p: str) -> list[str]:
        prefix = p.rstrip("/") + "/"
        return sorted(f for f in self.files if f.startswith(prefix))


class DiskFS:
    """The same interface on the real filesystem, in this process (no command is run)."""

    def is_file(self, p: str) -> bool:
        return Path(p).is_file()

    def is_dir(self, p: str) -> bool:
        return Path(p).is_dir()

    def read(self, p: str) -> bytes:
        return Path(p).read_bytes()

    def write(self, p: str, data: bytes) -> None:
        Path(p).parent.mkdir(parents=True, exist_ok=True)
        Path(p).write_bytes(data)

    def mkdir(self, p: str) -> None:
        Path(p).mkdir(parents=True, exist_ok=True)

    def remove(self, p: str) -> None:
        path = Path(p)
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)

    def files_under(self, p: str) -> list[str]:
        return sorted(str(f) for f in Path(p).rglob("*") if f.is_file())


@dataclass
class _Job:
    handle: JobHandle
    spec: JobSpec
    behaviour: FakeJob
    polls: int = 0
    state: JobState = field(default_factory=lambda: JobState("running"))


_pids = itertools.count(1000)


class FakeTransport:
    """An in-memory host that implements the `Transport` protocol; see the module docstring."""

    def __init__(self, host: Host, *, script: JobScript | None = None, fs: FileSystem | None = None,
                 snapshot: Mapping[str, object] | None = None) -> None:
        self.host = host
        self.fs: FileSystem = fs if fs is not None else MemoryFS()
        self.script: JobScript = script or (lambda spec: FakeJob())
        self.commands: list[tuple[str, ...]] = []  # every run() argv, in order
        self.launched: list[JobSpec] = []  # every launched job, in order
        self.cancelled: list[str] = []  # job ids
        self.jobs: dict[str, _Job] = {}
        self._snapshot = dict(snapshot or {})
        self.closed = False

    @classmethod
    def on_disk(cls, host: Host, **kw: object) -> FakeTransport:
        return cls(host, fs=DiskFS(), **kw)  # type: ignore[arg-type]

    # ---------------------------------------------------------------- paths
    def path(self, p: str) -> str:
        workdir = posixpath.normpath(self.host.workdir)
        full = posixpath.normpath(p if p.startswith("/") else posixpath.join(workdir, p))
        if workdir != "/" and full != workdir and not full.startswith(workdir + "/"):
            raise PathNotAllowed(p, host=self.host.name, workdir=self.host.workdir)
        return full

    def python(self) -> str:
        return "python3"

    # ---------------------------------------------------------------- commands
    def run(self, argv: Sequence[str], *, timeout_s: float | None = None, check: bool = True,
            env: Mapping[str, str] | None = None, cwd: str | None = None,
            input: str | bytes | None = None) -> Completed:
        """Records `argv`; understands `cp SRC DST` and `mkdir -p DIR` (what the runner itself runs)."""
        args = tuple(str(a) for a in argv)
        self.commands.append(args)
        code, err = 0, ""
        if args[:1] == ("cp",) and len(args) == 3:
            src, dst = self.path(args[1]), self.path(args[2])
            if self.fs.is_file(src):
                self.fs.write(dst, self.fs.read(src))
            else:
                code, err = 1, f"cp: cannot stat '{args[1]}': No such file or directory\n"
        elif args[:2] == ("mkdir", "-p"):
            for d in args[2:]:
                self.fs.mkdir(self.path(d))
        result = Completed(self.host.name, args, code, "", err, 0.0)
        return result.check() if check else result

    # ---------------------------------------------------------------- jobs
    def launch(self, spec: JobSpec) -> JobHandle:
        now = datetime.now(UTC)
        job_id = spec.job_id or new_job_id(spec.name, now)
        pid = next(_pids)
        handle = JobHandle(host=self.host.name, job_id=job_id, job_dir=self.path(f"jobs/{job_id}"), pid=pid,
                           pgid=pid, started_at=now, name=spec.name, argv=spec.argv)
        self.launched.append(spec)
        self.jobs[job_id] = _Job(handle, spec, self.script(spec))
        self.fs.mkdir(handle.job_dir)
        return handle

    def attach(self, job_id: str) -> JobHandle:
        job = self.jobs.get(job_id)
        if job is None:
            raise PathMissing(f"jobs/{job_id}", host=self.host.name)
        return job.handle

    def _job(self, handle: JobHandle) -> _Job:
        job = self.jobs.get(handle.job_id)
        if job is None:
            raise PathMissing(handle.job_dir, host=self.host.name)
        return job

    def status(self, handle: JobHandle) -> JobState:
        job = self._job(handle)
        if job.state.finished:
            return job.state
        limit = job.behaviour.running_polls
        if limit is not None and job.polls >= limit:
            self._end(job, JobState("exited", job.behaviour.exit_code))
        job.polls += 1
        return job.state

    def _end(self, job: _Job, state: JobState) -> None:
        job.state = state
        d = job.handle.job_dir
        self.fs.write(f"{d}/stdout", job.behaviour.stdout.encode())
        self.fs.write(f"{d}/stderr", job.behaviour.stderr.encode())
        if state.kind == "exited":
            cwd = job.spec.cwd or self.path(".")
            for rel, content in job.behaviour.outputs.items():
                self.fs.write(self.path(posixpath.join(cwd, rel)), _bytes(content))

    def tail(self, handle: JobHandle, n_bytes: int = 4096, stream: Literal["stdout", "stderr"] = "stdout") -> str:
        """What the job has printed so far: all of it once it ended; while it runs, its lines in proportion to
        the polls it has been running (a job prints as it goes)."""
        job = self._job(handle)
        text = job.behaviour.stdout if stream == "stdout" else job.behaviour.stderr
        if not job.state.finished:
            lines = text.splitlines(keepends=True)
            total = job.behaviour.running_polls
            shown = len(lines) * job.polls // total if total else 0
            text = "".join(lines[:shown])
        return text[-n_bytes:]

    def cancel(self, handle: JobHandle, *, grace_s: float = 10.0) -> JobState:
        job = self._job(handle)
        self.cancelled.append(handle.job_id)
        if not job.state.finished:
            self._end(job, JobState("cancelled"))
        return job.state

    def slot_note(self, handle: JobHandle) -> str:
        return ""

    def wait(self, handle: JobHandle, *, poll_s: float = 5.0, timeout_s: float | None = None,
             on_poll: PollFn | None = None, check: bool = False) -> JobState:
        """Polls without sleeping; a job that never ends raises `CommandTimeout` as the real deadline would."""
        job = self._job(handle)
        while True:
            state = self.status(handle)
            if on_poll is not None:
                on_poll(state)
            if state.finished:
                break
            if job.behaviour.running_polls is None:
                raise CommandTimeout(f"job {handle.job_id} still running after {timeout_s} s", host=self.host.name)
        if check and not state.ok:
            raise RemoteJobError(f"{self.host.name}: job {handle.job_id} {state}", handle=handle, state=state)
        return state

    # ---------------------------------------------------------------- files
    def exists(self, p: str) -> bool:
        full = self.path(p)
        return self.fs.is_file(full) or self.fs.is_dir(full)

    def stat(self, p: str) -> PathStat | None:
        full = self.path(p)
        if self.fs.is_file(full):
            return PathStat(full, "file", len(self.fs.read(full)), 0, 0o644)
        if self.fs.is_dir(full):
            return PathStat(full, "dir", 0, 0, 0o755)
        return None

    def mkdir(self, p: str) -> str:
        full = self.path(p)
        self.fs.mkdir(full)
        return full

    def read_text(self, p: str, *, max_bytes: int = 1 << 20) -> str:
        full = self.path(p)
        if not self.fs.is_file(full):
            raise PathMissing(full, host=self.host.name)
        return self.fs.read(full)[-max_bytes:].decode("utf-8", errors="replace")

    def write_text(self, p: str, text: str) -> str:
        full = self.path(p)
        self.fs.write(full, text.encode())
        return full

    def remove(self, p: str, *, recursive: bool = False) -> None:
        full = self.path(p)
        if self.fs.is_dir(full) and self.fs.files_under(full) and not recursive:
            raise PathExists(f"rmdir: failed to remove {full!r}: Directory not empty", path=full,
                             host=self.host.name)
        self.fs.remove(full)

    def sha256(self, paths: Sequence[str]) -> dict[str, Fingerprint]:
        return {p: self._fingerprint(self.path(p)) for p in paths}

    def _fingerprint(self, full: str) -> Fingerprint:
        if self.fs.is_file(full):
            data = self.fs.read(full)
            return Fingerprint("file", hashlib.sha256(data).hexdigest(), len(data))
        if not self.fs.is_dir(full):
            raise PathMissing(full, host=self.host.name)
        entries = []
        for f in self.fs.files_under(full):
            data = self.fs.read(f)
            entries.append(FileEntry(posixpath.relpath(f, full), hashlib.sha256(data).hexdigest(), len(data)))
        return Fingerprint("dir", hashlib.sha256(canonical_manifest(entries)).hexdigest(),
                           sum(e.size for e in entries), tuple(entries))

    def put(self, local: str, remote: str, *, progress: ProgressFn | None = None,
            overwrite: bool = False) -> Fingerprint:
        dest = self.path(remote)
        src = Path(local)
        for rel, data in _read_local(src):
            self.fs.write(posixpath.join(dest, rel) if rel else dest, data)
        return self._fingerprint(dest)

    def get(self, remote: str, local: str, *, progress: ProgressFn | None = None,
            overwrite: bool = False) -> Fingerprint:
        full = self.path(remote)
        fp = self._fingerprint(full)
        dest = Path(local)
        if fp.kind == "file":
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(self.fs.read(full))
        else:
            for f in self.fs.files_under(full):
                out = dest / posixpath.relpath(f, full)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(self.fs.read(f))
        return fp

    def receive(self, src: Transport, src_path: str, dst_path: str, *, progress: ProgressFn | None = None
                ) -> Fingerprint:
        """Copy `src:src_path` here (from another fake in memory, from a real transport through its `get`)."""
        dest = self.path(dst_path)
        if isinstance(src, FakeTransport):
            origin = src.path(src_path)
            if src.fs.is_file(origin):
                self.fs.write(dest, src.fs.read(origin))
            for f in src.fs.files_under(origin):
                self.fs.write(posixpath.join(dest, posixpath.relpath(f, origin)), src.fs.read(f))
            return self._fingerprint(dest)
        import tempfile

        with tempfile.TemporaryDirectory(prefix="alignflow-fake-") as tmp:
            local = str(Path(tmp) / "copy")
            src.get(src_path, local)
            return self.put(local, dst_path)

    # ---------------------------------------------------------------- the rest
    def snapshot(self) -> HostSnapshot:
        repos = self._snapshot.get("repos")
        return HostSnapshot(host=self.host.name, taken_at=datetime.now(UTC), hostname=f"fake-{self.host.name}",
                            repos=repos if isinstance(repos, dict) else {})

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> FakeTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _bytes(content: Content) -> bytes:
    return content.encode() if isinstance(content, str) else content


def _read_local(src: Path) -> Iterator[tuple[str, bytes]]:
    if src.is_file():
        yield "", src.read_bytes()
        return
    if not src.is_dir():
        raise FileNotFoundError(str(src))
    for f in sorted(src.rglob("*")):
        if f.is_file():
            yield f.relative_to(src).as_posix(), f.read_bytes()
