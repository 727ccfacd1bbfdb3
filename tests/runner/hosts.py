"""A host in a directory, answered in this process: the handler of the runner lab's `FakeShell`s.

The runner's tests drive real `Transport`s - every line of files, jobs, copies and the runner above the shell -
over `alignflow.testing.FakeShell`, whose handler here does what our host-side scripts do (they are named:
`alignflow.transport.commands.script`), on the real directory the host's workdir names, without starting a
process (the unit tier refuses one). A job does what its `FakeJob` says: it runs for `running_polls` polls,
printing its stdout as it goes, then writes its outputs and exits. A lock is held as the real holder holds it: an
`flock(2)` on the lock file, from "locked" to the end of the holder's stdin, so two controllers' copies to one
destination wait for each other here too. Host-side symlink confinement and real processes are the real hosts'
tests' (tests/transport, tests/flows).
"""

from __future__ import annotations

import fcntl
import glob
import io
import json
import os
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from alignflow.config.hosts import Host
from alignflow.fingerprint import fingerprint
from alignflow.testing import Command, FakeShell
from alignflow.transport import JobSpec, Result, Transport
from alignflow.transport.scheduler import Clock

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


@dataclass
class _Job:
    spec: JobSpec
    job_dir: Path
    does: FakeJob
    polls: int = 0
    state: str = "RUNNING"


def _ok(stdout: Content = b"") -> Result:
    return Result(0, stdout.encode() if isinstance(stdout, str) else stdout)


def _fail(code: int, stderr: str = "") -> Result:
    return Result(code, b"", stderr.encode())


class DirHost:
    """The handler: `host`'s commands on the directory of its workdir. `before(command)` runs first (a test's
    fault: raise from it); `launched`, `cancelled` and `commands` record what happened."""

    def __init__(self, host: Host, script: JobScript | None = None) -> None:
        self.host = host
        self.script: JobScript = script or (lambda spec: FakeJob())
        self.before: Callable[[Command], None] | None = None
        self.launched: list[JobSpec] = []
        self.cancelled: list[str] = []  # job ids
        self.commands: list[Command] = []
        self.jobs: dict[str, _Job] = {}  # by job dir
        self._mutex = threading.Lock()

    def __call__(self, command: Command) -> Result:
        self.commands.append(command)
        if self.before is not None:
            self.before(command)
        if command.name == "lock":  # it runs as long as its caller holds the lock: not under the mutex
            return self._hold_lock(command)
        answer = getattr(self, f"_{(command.name or '').replace('-', '_')}", None)
        if answer is None:
            return _fail(127, f"fake host {self.host.name}: nothing answers {command.argv[:3]}")
        # All of stdin, as the answers take it (a spawned command's once its caller finished it); a tar stream's
        # sender reads none, and its caller reads it to the end before finishing it.
        data = b"" if command.name == "send" else command.input
        with self._mutex:
            result: Result = answer(data, *command.args)
            return result

    def _workdir(self, data: bytes, workdir: str) -> Result:  # `Shell.workdir` (a FakeShell answers it itself)
        os.makedirs(workdir, mode=0o700, exist_ok=True)
        real = os.path.realpath(workdir)
        return _ok(f"{real}\0{workdir}\0{os.path.dirname(real)}\0")

    # -- commands (`Files.run`): what the runner itself runs ------------------------------------------------------
    def _run(self, data: bytes, *argv: str) -> Result:
        if argv[:1] == ("cp",) and len(argv) == 3:
            if not os.path.isfile(argv[1]):
                return _fail(1, f"cp: cannot stat '{argv[1]}': No such file or directory\n")
            shutil.copyfile(argv[1], argv[2])
            return _ok()
        if argv[:2] == ("mkdir", "-p"):
            for d in argv[2:]:
                os.makedirs(d, exist_ok=True)
            return _ok()
        if argv[1:2] == ("-",) and b"platform" in data:  # the snapshot probe
            return _ok(json.dumps({"hostname": f"fake-{self.host.name}", "repos": {}}))
        return _fail(127, f"fake host {self.host.name}: no {argv[0]} here\n")

    # -- file operations (`commands.OPS`; $1 is the workdir) ---------------------------------------------------------
    def _exists(self, data: bytes, wd: str, path: str) -> Result:
        return _ok("1\n" if os.path.exists(path) else "0\n")

    def _stat(self, data: bytes, wd: str, path: str) -> Result:
        if not os.path.exists(path):
            return _fail(3)
        st = os.stat(path)
        kind = "directory" if os.path.isdir(path) else "regular file"
        mtime = f"{st.st_mtime_ns // 10**9}.{st.st_mtime_ns % 10**9:09d}"
        return _ok(f"{kind}|{st.st_size}|{mtime}|{st.st_mode & 0o7777:o}\n")

    def _mkdir(self, data: bytes, wd: str, path: str) -> Result:
        os.makedirs(path, mode=0o700, exist_ok=True)
        return _ok()

    def _read(self, data: bytes, wd: str, path: str, max_bytes: str) -> Result:
        if not os.path.isfile(path):
            return _fail(3)
        content = Path(path).read_bytes()
        return _ok(content) if len(content) <= int(max_bytes) else _fail(4, str(len(content)))

    def _write(self, data: bytes, wd: str, path: str) -> Result:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Path(path).write_bytes(data)
        return _ok()

    def _remove(self, data: bytes, wd: str, path: str, recursive: str) -> Result:
        if os.path.isdir(path) and not os.path.islink(path):
            if recursive == "1":
                shutil.rmtree(path)
            elif os.listdir(path):
                return _fail(1, f"rmdir: failed to remove '{path}': Directory not empty\n")
            else:
                os.rmdir(path)
        elif os.path.lexists(path):
            os.unlink(path)
        return _ok()

    def _clean_staging(self, data: bytes, wd: str, final: str, stem: str) -> Result:
        gone = glob.glob(glob.escape(os.path.join(os.path.dirname(final), stem)) + "-*")
        for p in gone:
            shutil.rmtree(p)
        return _ok(b"".join(p.encode() + b"\0" for p in gone))

    def _place(self, data: bytes, wd: str, staged: str, final: str, overwrite: str) -> Result:
        if os.path.lexists(final):
            if overwrite != "1":
                return _fail(6)
            shutil.rmtree(final) if os.path.isdir(final) else os.unlink(final)
        os.rename(staged, final)
        if not os.listdir(os.path.dirname(staged)):
            os.rmdir(os.path.dirname(staged))
        return _ok()

    # -- hashing (`Files.sha256`, `check_confined`, `follow_sha256`): the real fingerprint, in this process ----------
    def _sha256(self, data: bytes, wd: str, python: str, n: str, *rest: str) -> Result:
        paths, options = rest[:int(n)], rest[int(n):]
        if missing := [p for p in paths if not os.path.exists(p)]:
            return _fail(3, missing[0] + "\n")
        if "--walk-only" in options:
            return _ok()
        return _ok(json.dumps({p: fingerprint(p).to_json() for p in paths}))

    def _follow(self, data: bytes, wd: str, python: str, dash_c: str, source: str, path: str, fp: str) -> Result:
        if b"abort" in data:
            return _fail(3)
        return _ok(json.dumps(fingerprint(path).to_json())) if os.path.exists(path) else _fail(2, "nothing arrived")

    def _hold_lock(self, command: Command) -> Result:
        """`locks._HOLDER`: "waiting" if another holder has the lock, "locked" once it is ours, kept until a line
        or the end of stdin (an `flock` on the file: two opens of it exclude each other within a process too)."""
        path = command.args[-1]
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                command.write(b"waiting\n")
                fcntl.flock(fd, fcntl.LOCK_EX)
            command.write(b"locked\n")
            command.read_line()
        finally:
            os.close(fd)
        return _ok()

    # -- the tar stream of a copy between two hosts that only have a shell (transfer._through_shells) -----------------
    def _send(self, data: bytes, path: str, kind: str) -> Result:
        if kind != "dir":
            return _ok(Path(path).read_bytes())
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", dereference=True) as tar:
            tar.add(path, arcname=".")
        return _ok(out.getvalue())

    def _receive(self, data: bytes, path: str, kind: str) -> Result:
        if kind != "dir":
            Path(path).write_bytes(data)
            return _ok()
        os.makedirs(path, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(path, filter="data")
        return _ok()

    # -- detached jobs (`jobs_direct` scripts; $1 is the job dir) -----------------------------------------------------
    def _launch(self, data: bytes, job_dir: str, cmd: str, supervisor: str, spec_json: str,
                start_wait_s: str = "5") -> Result:
        if os.path.exists(job_dir):
            return _fail(98, f"job dir exists: {job_dir}")
        os.makedirs(job_dir)
        for name, text in (("cmd.sh", cmd), ("job.sh", supervisor), ("spec.json", spec_json)):
            Path(job_dir, name).write_text(text)
        record = json.loads(spec_json)
        spec = JobSpec(record["argv"], name=record["name"], env=record["env"], cwd=record["cwd"],
                       job_id=record["job_id"])
        self.launched.append(spec)
        self.jobs[job_dir] = _Job(spec, Path(job_dir), self.script(spec))
        return _ok("1000\n")

    def _status(self, data: bytes, job_dir: str) -> Result:
        job = self.jobs.get(job_dir)
        if job is None:
            return _ok("MISSING\n")
        if job.state == "RUNNING":
            if job.does.running_polls is not None and job.polls >= job.does.running_polls:
                self._end(job, f"EXITED {job.does.exit_code}")
            else:
                job.polls += 1
                lines = job.does.stdout.splitlines(keepends=True)
                shown = len(lines) * job.polls // job.does.running_polls if job.does.running_polls else 0
                (job.job_dir / "stdout").write_text("".join(lines[:shown]))
        return _ok(job.state + "\n")

    def _end(self, job: _Job, state: str) -> None:
        job.state = state
        (job.job_dir / "stdout").write_text(job.does.stdout)
        (job.job_dir / "stderr").write_text(job.does.stderr)
        if state.startswith("EXITED"):
            for rel, content in job.does.outputs.items():
                out = Path(job.spec.cwd or self.host.workdir, rel)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(content.encode() if isinstance(content, str) else content)

    def _cancel(self, data: bytes, job_dir: str, grace: str) -> Result:
        job = self.jobs.get(job_dir)
        if job is None:
            return _ok("MISSING\n")
        self.cancelled.append(job.spec.job_id or "")
        if job.state == "RUNNING":
            self._end(job, "CANCELLED")
        return _ok(job.state + "\n")

    def _tail(self, data: bytes, job_dir: str, n_bytes: str, stream: str) -> Result:
        path = Path(job_dir, stream)
        return _ok(path.read_bytes()[-int(n_bytes):] if path.exists() else b"")

    def _attach(self, data: bytes, job_dir: str) -> Result:
        spec = Path(job_dir, "spec.json")
        return _ok("1000\n" + spec.read_text()) if spec.exists() else _fail(3)


class VirtualClock:
    """`wait`'s clock in the lab: sleeping moves time on at once, so a deadline passes without waiting for it."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def dir_transport(host: Host, handler: DirHost, *, controller: Callable[[], Transport] | None = None,
                  clock: Clock | None = None, memo_path: str | None = None) -> Transport:
    """A `Transport` whose shell is `handler`'s host (its workdir a real directory)."""
    return Transport(FakeShell(handler, host), controller=controller, clock=clock or VirtualClock(),
                     memo_path=memo_path)


def controller_in_process() -> Transport:
    """The controller's own filesystem (workdir "/": its paths are the user's), answered in this process; its locks
    beside a memo in the temporary directory, as the real controller's are beside its memo in the state dir."""
    here = Host(name="controller", role="controller", transport="local", workdir="/")
    memo = os.path.join(tempfile.gettempdir(), f"alignflow-fake-controller-{os.getuid()}", "hashmemo.sqlite")
    return dir_transport(here, DirHost(here), memo_path=memo)


def on_disk(host: Host, script: JobScript | None = None) -> Transport:
    """`host` on the directory of its workdir, `put` and `get` to the controller's files, all in this process."""
    return dir_transport(host, DirHost(host, script), controller=controller_in_process)
