"""`ShellTransport`: every transport operation written once, as argv for a host's bash.

Subclasses supply one method, `_exec(argv, input, timeout_s)`, that runs an argv on the host (a subprocess for
`LocalTransport`, an SSH channel for `SSHTransport`). Everything else - env and setup lines, workdir
confinement, detached jobs, hashing, snapshots, small files - is shared, so the embedded default runs the very
scripts that production runs (docs/architecture.md#key-interfaces).

(Longer than the usual 400 lines on purpose: it is the whole Transport protocol over one `_exec`, and
splitting one class over modules would hide which operation shares which host-side guard.)
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from alignflow.config.hosts import Host
from alignflow.errors import (
    AlignflowError,
    CommandTimeout,
    PathMissing,
    PathNotAllowed,
    RemoteCommandError,
    RemoteJobError,
    TransportError,
)
from alignflow.fingerprint import Fingerprint
from alignflow.transport import commands, jobs
from alignflow.transport.commands import MISSING_EXIT, op_argv, render_prologue, wrap_command
from alignflow.transport.jobs import JobHandle, JobSpec, JobState
from alignflow.transport.openssh import OpenSSHClient
from alignflow.transport.paths import CONFINE_SH, confine, raise_if_escaped
from alignflow.transport.protocol import Completed, PathStat, PollFn, ProgressFn, Transport
from alignflow.transport.scheduler import Scheduler, scheduler_for
from alignflow.transport.snapshot import ENV_PREFIXES, PACKAGES, HostSnapshot
from alignflow.transport.transfer import copy_between

log = logging.getLogger(__name__)

_KINDS: dict[str, Literal["file", "dir", "other"]] = {
    "regular file": "file",
    "regular empty file": "file",
    "directory": "dir",
}


# Deadline of the short control commands (status, tail, small files, launch). A peer that vanished without
# closing TCP would otherwise hang a poll until the kernel gives up (~15 min); on expiry the connection is
# dropped and `wait` reconnects.
CONTROL_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class RawResult:
    """What `_exec` returns: bytes as the host wrote them."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    duration_s: float

    def text(self, stream: Literal["stdout", "stderr"] = "stdout") -> str:
        return (self.stdout if stream == "stdout" else self.stderr).decode("utf-8", errors="replace")


class Spawned(Protocol):
    """A host command that runs while the controller does something else (see `ShellTransport.follow_sha256`)."""

    def send(self, data: bytes) -> None: ...

    def read_line(self) -> bytes:
        """The next line of the command's stdout (blocking); what is left of it at end-of-file."""
        ...

    def finish(self, timeout_s: float | None = None) -> RawResult: ...

    def kill(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Workdir:
    declared: str  # `~` expanded, normalized
    real: str  # symlinks resolved on the host
    home: str


def _workdir(parts: list[bytes], host: Host) -> Workdir:
    """The workdir from the host's answer, refusing what no path of ours may hold (see `Host.workdir`)."""
    try:
        real, declared, home = (p.decode("utf-8") for p in parts)
    except UnicodeDecodeError:
        raise TransportError(f"workdir {host.workdir!r}: the host answers with a path that is not UTF-8",
                             host=host.name) from None
    for what, value in (("resolves to", real), ("is", declared), ("is under the home", home)):
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise TransportError(f"workdir {host.workdir!r} {what} {value!r}, which holds a control character; "
                                 "choose a workdir without one", host=host.name)
    return Workdir(declared=posixpath.normpath(declared), real=real, home=home)


def _module_source(module_file: str) -> bytes:
    return Path(module_file).read_bytes()


class ShellTransport(ABC):
    """Base of `LocalTransport` and `SSHTransport`; see `alignflow.transport.protocol.Transport`."""

    def __init__(self, host: Host, *, memo_path: str | None = None) -> None:
        self.host = host
        self._memo_path = memo_path
        self._wd: Workdir | None = None
        self._wd_lock = threading.Lock()
        self._sched: Scheduler | None = None

    # -- the one thing a subclass provides ---------------------------------------------------------------------
    @abstractmethod
    def _exec(self, argv: Sequence[str], *, input: bytes | None = None, timeout_s: float | None = None) -> RawResult:
        """Run `argv` on the host (no shell added); raise `TransportError` if the host cannot be reached."""

    @abstractmethod
    def _spawn(self, argv: Sequence[str]) -> Spawned:
        """Start `argv` on the host with its stdin open; the caller sends, then finishes or kills it."""

    @abstractmethod
    def _default_python(self) -> str: ...

    @abstractmethod
    def openssh_client(self) -> OpenSSHClient | None:
        """How the controller's OpenSSH tools (rsync -e, ssh) reach this host's files: its client, or None when the
        files are on this machine. Copies pick their route from what the two ends say here (transport.transfer)."""

    @abstractmethod
    def _controller(self) -> ShellTransport:
        """The controller's own filesystem as a transport: the other end of `put` and `get`."""

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release connections; the transport reconnects if used again."""

    def __enter__(self) -> ShellTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.host.name!r})"

    # -- commands ----------------------------------------------------------------------------------------------
    def python(self) -> str:
        return self.host.python or self._default_python()

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float | None = None,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        input: str | bytes | None = None,
    ) -> Completed:
        """Run argv on the host, in `cwd` (default: the workdir), with the host's env and setup lines applied.

        `CommandTimeout` when `timeout_s` passes (the command is killed); with `check`, `RemoteCommandError`
        carrying the exit code and the stderr tail when it exits non-zero.
        """
        if isinstance(argv, str):
            raise TypeError("run() takes an argv list; for a shell, pass ['bash', '-c', script] explicitly")
        argv = [str(a) for a in argv]
        workdir = self.workdir()
        prologue = render_prologue(
            host_env=self.host.env, setup=self.host.setup, env=env, cwd=self.path(cwd) if cwd else workdir.real
        )
        data = input.encode() if isinstance(input, str) else input
        raw = self._exec(wrap_command(argv, prologue), input=data, timeout_s=timeout_s)
        done = Completed(self.host.name, tuple(argv), raw.exit_code, raw.text(), raw.text("stderr"), raw.duration_s)
        return done.check() if check else done

    # -- paths ---------------------------------------------------------------------------------------------------
    def workdir(self) -> Workdir:
        """The host's workdir (created on first use, mode 700), resolved once per transport."""
        with self._wd_lock:
            if self._wd is None:
                # NUL-separated: a path may hold any byte but NUL, so no path is ever read from split lines
                # (a workdir `/x/victim<newline>/x/victim` once became `/x/victim`, issue 16).
                script = 'w=$1; case $w in "~") w=$HOME;; "~/"*) w=$HOME/${w#"~/"};; esac\n' + (
                    'mkdir -p -m 700 -- "$w" && cd -P -- "$w" && printf "%s\\0" "$PWD" "$w" "$HOME"'
                )
                raw = self._exec(["bash", "-c", script, commands.ARGV0, self.host.workdir],
                                 timeout_s=CONTROL_TIMEOUT_S)
                parts = raw.stdout.split(b"\0")
                if raw.exit_code != 0 or len(parts) != 4 or parts[3]:
                    raise TransportError(
                        f"cannot create or enter workdir {self.host.workdir!r}: {raw.text('stderr').strip()}",
                        host=self.host.name,
                    )
                self._wd = _workdir(parts[:3], self.host)
            return self._wd

    def path(self, p: str) -> str:
        """`p` as an absolute host path inside the workdir; relative paths are taken from the workdir.

        `PathNotAllowed` for `..` escapes and other users' homes. Symlink escapes are caught on the host by
        every operation that touches the path.
        """
        wd = self.workdir()
        try:
            return confine(p, workdir=wd.declared, home=wd.home, host=self.host.name)
        except PathNotAllowed:
            if wd.real == wd.declared:
                raise
            return confine(p, workdir=wd.real, home=wd.home, host=self.host.name)

    def _op(self, op: str, *args: str, input: bytes | None = None) -> RawResult:
        wd = self.workdir()
        raw = self._exec(op_argv(op, wd.real, *args), input=input, timeout_s=CONTROL_TIMEOUT_S)
        raise_if_escaped(raw.exit_code, raw.text("stderr"), host=self.host.name, workdir=wd.declared)
        return raw

    def _op_failed(self, op: str, path: str, raw: RawResult) -> RemoteCommandError:
        return RemoteCommandError(
            Completed(self.host.name, (op, path), raw.exit_code, raw.text(), raw.text("stderr"), raw.duration_s)
        )

    # -- small files ---------------------------------------------------------------------------------------------
    def exists(self, p: str) -> bool:
        path = self.path(p)
        raw = self._op("exists", path)
        if raw.exit_code != 0:
            raise self._op_failed("exists", path, raw)
        return raw.text().strip() == "1"

    def stat(self, p: str) -> PathStat | None:
        """Size, mtime and kind of a path (symlinks followed); None when it does not exist."""
        path = self.path(p)
        raw = self._op("stat", path)
        if raw.exit_code == MISSING_EXIT:
            return None
        if raw.exit_code != 0:
            raise self._op_failed("stat", path, raw)
        kind, size, mtime, mode = raw.text().strip().rsplit("|", 3)
        sec, _, frac = mtime.partition(".")
        mtime_ns = int(sec) * 1_000_000_000 + int((frac + "000000000")[:9])
        return PathStat(path, _KINDS.get(kind, "other"), int(size), mtime_ns, int(mode, 8))

    def mkdir(self, p: str) -> str:
        """Create a directory and its parents (new ones mode 700); returns its absolute path."""
        path = self.path(p)
        raw = self._op("mkdir", path)
        if raw.exit_code != 0:
            raise self._op_failed("mkdir", path, raw)
        return path

    def read_text(self, p: str, *, max_bytes: int = 1 << 20) -> str:
        """A small text file (configs, manifests); larger files move with `get`."""
        path = self.path(p)
        raw = self._op("read", path, str(max_bytes))
        if raw.exit_code == MISSING_EXIT:
            raise PathMissing(path, host=self.host.name)
        if raw.exit_code == 4:
            raise RemoteCommandError(
                Completed(self.host.name, ("read", path), 4, "",
                          f"{raw.text('stderr').strip()} bytes > max_bytes={max_bytes}; use get() for large files",
                          raw.duration_s)
            )
        if raw.exit_code != 0:
            raise self._op_failed("read", path, raw)
        return raw.text()

    def write_text(self, p: str, text: str) -> str:
        """Write a small file atomically (temporary name, then rename; mode 600); returns its path."""
        path = self.path(p)
        raw = self._op("write", path, input=text.encode("utf-8"))
        if raw.exit_code != 0:
            raise self._op_failed("write", path, raw)
        return path

    def remove(self, p: str, *, recursive: bool = False) -> None:
        """Remove a file, an empty directory, or (recursive) a tree; a missing path is not an error."""
        path = self.path(p)
        raw = self._op("remove", path, "1" if recursive else "0")
        if raw.exit_code != 0:
            raise self._op_failed("remove", path, raw)

    # -- hashing and snapshots -----------------------------------------------------------------------------------
    def memo_path(self) -> str:
        """Where this host keeps its hash memo (inside the workdir unless the transport was told otherwise)."""
        return self._memo_path or posixpath.join(self.workdir().real, ".alignflow", "hashmemo.sqlite")

    def sha256(self, paths: Sequence[str], *, memo: bool = True) -> dict[str, Fingerprint]:
        """Fingerprints computed ON the host by its Python: the bytes never cross the network to be hashed.

        The controller's own `alignflow/fingerprint.py` is sent on stdin (`python - PATH... --json --manifest`),
        so every host hashes with exactly the algorithm the controller verifies with, whatever alignflow
        version (if any) is installed there. Keys of the result are the paths as given.
        """
        if isinstance(paths, str):
            raise TypeError("sha256() takes a list of paths")
        absolute = {self.path(p): p for p in paths}
        if not absolute:
            return {}
        raw = self._fingerprint_py(list(absolute), ["--json", "--manifest", *(
            ["--memo", self.memo_path()] if memo else ["--no-memo"])])
        if raw.exit_code == MISSING_EXIT:
            raise PathMissing(raw.text("stderr").strip().splitlines()[-1], host=self.host.name)
        if raw.exit_code != 0:
            raise self._op_failed("sha256", " ".join(absolute), raw)
        try:
            data: dict[str, Any] = json.loads(raw.text())
            return {absolute[k]: Fingerprint.from_json(v) for k, v in data.items()}
        except (ValueError, KeyError, TypeError) as exc:
            raise self._op_failed(f"sha256 (unreadable output: {exc})", " ".join(absolute), raw) from None

    def check_confined(self, paths: Sequence[str]) -> None:
        """`PathNotAllowed` if a path, or a link anywhere below it, resolves outside the workdir; reads no file.

        What a copy runs on its source when the source's fingerprint was recorded earlier (and so is not
        computed again, which would have made the same check): the bytes sent are those of the workdir only.
        """
        absolute = [self.path(p) for p in paths]
        if not absolute:
            return
        raw = self._fingerprint_py(absolute, ["--walk-only"])
        if raw.exit_code == MISSING_EXIT:
            raise PathMissing(raw.text("stderr").strip().splitlines()[-1], host=self.host.name)
        if raw.exit_code != 0:
            raise self._op_failed("confinement check", " ".join(absolute), raw)

    def _fingerprint_py(self, absolute: list[str], options: list[str]) -> RawResult:
        """`python - PATH... --confine WORKDIR OPTIONS` on the host, with the controller's fingerprint.py on stdin;
        escapes raised, every path checked to exist first (exit MISSING_EXIT naming it)."""
        from alignflow import fingerprint as fp_module

        wd = self.workdir()
        script = (
            CONFINE_SH
            + 'W=$1; py=$2; n=$3; shift 3; af_confine "$W" "${@:1:n}"\n'
            + 'for p in "${@:1:n}"; do [ -e "$p" ] || { printf "%s\\n" "$p" >&2; '
            + f'exit {MISSING_EXIT}; }}; done\n'
            + 'exec "$py" - "$@"'
        )
        # The controller's workdir is "/": its paths are the user's, nothing to confine them to.
        confine = ["--confine", wd.real] if wd.real != "/" else []
        prologue = render_prologue(host_env=self.host.env, setup=self.host.setup, env=None, cwd=wd.real)
        argv = ["bash", "-c", f"{prologue}\n{script}", commands.ARGV0, wd.real, self.python(), str(len(absolute)),
                *absolute, *confine, *options]
        raw = self._exec(argv, input=_module_source(fp_module.__file__))
        raise_if_escaped(raw.exit_code, raw.text("stderr"), host=self.host.name, workdir=wd.declared)
        return raw

    def follow_sha256(self, p: str) -> FollowedHash:
        """Start hashing `p` on the host while it is being written (a copy's staging dir); see follow_hash.py."""
        from alignflow import fingerprint as fp_module
        from alignflow.transport import follow_hash

        path = self.path(p)
        wd = self.workdir()
        prologue = render_prologue(host_env=self.host.env, setup=self.host.setup, env=None, cwd=wd.real)
        script = CONFINE_SH + 'W=$1; shift; af_confine "$W" "$4"\n"$@"\nexit $?'
        argv = ["bash", "-c", f"{prologue}\n{script}", commands.ARGV0, wd.real, self.python(), "-c",
                _module_source(follow_hash.__file__).decode(), path, _module_source(fp_module.__file__).decode()]
        return FollowedHash(self, path, self._spawn(argv))

    def snapshot(self) -> HostSnapshot:
        """Python, framework versions, declared repos' commit + dirty flag, accelerators, env (issue 3, item 5)."""
        from alignflow.transport import snapshot_probe

        request = {
            "packages": list(PACKAGES),
            "repos": dict(self.host.repos),
            "env_names": sorted(self.host.env),
            "env_prefixes": list(ENV_PREFIXES),
        }
        taken_at = datetime.now(UTC)
        done = self.run([self.python(), "-", json.dumps(request)], check=False,
                        input=_module_source(snapshot_probe.__file__), timeout_s=120)
        if done.exit_code != 0:
            tail = done.stderr.strip().splitlines()[-3:]
            return HostSnapshot(self.host.name, taken_at, error=f"{self.python()} exited {done.exit_code}: "
                                + " | ".join(tail))
        try:
            return HostSnapshot.from_probe(self.host.name, taken_at, json.loads(done.stdout))
        except (ValueError, KeyError, TypeError) as exc:
            return HostSnapshot(self.host.name, taken_at, error=f"unreadable probe output: {exc}")

    # -- detached jobs -------------------------------------------------------------------------------------------
    def scheduler(self) -> Scheduler | None:
        """The host's job scheduler (`scheduler: slurm`); None for direct jobs, which this class runs itself."""
        if self._sched is None and self.host.scheduler != "direct":
            self._sched = scheduler_for(self)
        return self._sched

    def _job_dir(self, job_id: str) -> str:
        return posixpath.join(self.workdir().real, "jobs", jobs.check_job_id(job_id))

    def _checked_job_dir(self, handle: JobHandle) -> str:
        if handle.host != self.host.name:
            raise ValueError(f"job {handle.job_id} belongs to host {handle.host!r}, not {self.host.name!r}")
        return self.path(handle.job_dir)

    def launch(self, spec: JobSpec) -> JobHandle:
        """Start `spec` detached (own session and process group) in `<workdir>/jobs/<job_id>/`.

        Give `spec.job_id` to make a launch idempotent: if the connection drops during `launch`, launching
        the same id again fails with "job dir exists" and `attach(job_id)` finds the job.
        """
        if (sched := self.scheduler()) is not None:
            return sched.launch(spec)
        now = datetime.now(UTC)
        job_id = spec.job_id or jobs.new_job_id(spec.name, now)
        job_dir = self._job_dir(job_id)
        cwd = self.path(spec.cwd) if spec.cwd else self.workdir().real
        prologue = render_prologue(host_env=self.host.env, setup=self.host.setup, env=spec.env, cwd=cwd)
        header = f"alignflow job {job_id} ({spec.name}) on host {self.host.name}, launched {now.isoformat()}"
        record: dict[str, Any] = {"job_id": job_id, "name": spec.name, "argv": list(spec.argv), "env": dict(spec.env),
                                  "cwd": cwd, "host": self.host.name, "started_at": now.isoformat()}
        supervisor = jobs.supervisor_script(None)
        if spec.take_slot:
            supervisor = jobs.supervisor_script(self.host.max_concurrent_jobs, self.slot_dir())
            record["slots"] = self.host.max_concurrent_jobs
        raw = self._exec(["bash", "-c", jobs.LAUNCH_SH, commands.ARGV0, job_dir,
                          commands.render_job_script(spec.argv, prologue, header=header), supervisor,
                          json.dumps(record, indent=1)], timeout_s=CONTROL_TIMEOUT_S)
        if raw.exit_code == 98:
            raise RemoteJobError(f"{self.host.name}: job {job_id} already exists in {job_dir}; job ids are never "
                                 "reused (attach to it, or launch with a new id)")
        if raw.exit_code != 0:
            raise self._op_failed("launch", job_dir, raw)
        pid = int(raw.text().split()[-1])
        log.info("%s: launched job %s (pid %d) in %s", self.host.name, job_id, pid, job_dir)
        return JobHandle(self.host.name, job_id, job_dir, pid, pid, now, spec.name, spec.argv)

    def slot_dir(self) -> str:
        """Where the host's job slots live (`<workdir>/slots/<i>.lock`), shared by every controller."""
        return f"{self.workdir().real}/slots"

    def slot_note(self, handle: JobHandle) -> str:
        """The job's slot line ("waiting for one of ..." / "holding job slot ..."), or "" for a job without one."""
        if (sched := self.scheduler()) is not None:
            return sched.slot_note(handle)
        try:
            return self.read_text(f"{handle.job_dir}/slot", max_bytes=4096).strip()
        except AlignflowError:
            return ""

    def attach(self, job_id: str) -> JobHandle:
        """The handle of an existing job, from its job dir (for a controller that restarted)."""
        if (sched := self.scheduler()) is not None:
            return sched.attach(job_id)
        job_dir = self._job_dir(job_id)
        raw = self._exec(["bash", "-c", jobs.ATTACH_SH, commands.ARGV0, job_dir], timeout_s=CONTROL_TIMEOUT_S)
        if raw.exit_code == MISSING_EXIT:
            raise RemoteJobError(f"{self.host.name}: no job {job_id} (no {job_dir}/spec.json)")
        if raw.exit_code != 0:
            raise self._op_failed("attach", job_dir, raw)
        pid_line, _, spec_text = raw.text().partition("\n")
        record = json.loads(spec_text)
        return JobHandle.from_dict({**record, "job_dir": job_dir, "pid": int(pid_line), "pgid": int(pid_line)})

    def status(self, handle: JobHandle) -> JobState:
        if (sched := self.scheduler()) is not None:
            return sched.status(handle)
        job_dir = self._checked_job_dir(handle)
        raw = self._exec(["bash", "-c", jobs.STATUS_SH, commands.ARGV0, job_dir], timeout_s=CONTROL_TIMEOUT_S)
        return self._state(handle, raw)

    def _state(self, handle: JobHandle, raw: RawResult) -> JobState:
        if raw.exit_code != 0:
            raise self._op_failed("job status", handle.job_dir, raw)
        state = jobs.parse_status(raw.text().strip().splitlines()[-1])
        if state is None:
            raise RemoteJobError(f"{self.host.name}: job dir {handle.job_dir} is gone", handle=handle)
        return state

    def tail(self, handle: JobHandle, n_bytes: int = 4096, stream: Literal["stdout", "stderr"] = "stdout") -> str:
        """The last `n_bytes` of the job's stdout or stderr (poll with this; fetch whole logs once with get)."""
        if stream not in ("stdout", "stderr"):
            raise ValueError(f"stream must be 'stdout' or 'stderr', not {stream!r}")
        job_dir = self._checked_job_dir(handle)
        raw = self._exec(["bash", "-c", jobs.TAIL_SH, commands.ARGV0, job_dir, str(int(n_bytes)), stream],
                         timeout_s=CONTROL_TIMEOUT_S)
        if raw.exit_code != 0:
            raise RemoteJobError(f"{self.host.name}: cannot read {stream} of job {handle.job_id}", handle=handle)
        return raw.text()

    def cancel(self, handle: JobHandle, *, grace_s: float = 10.0) -> JobState:
        """TERM the job's whole process group, KILL it after `grace_s`; returns the final state."""
        if (sched := self.scheduler()) is not None:
            return sched.cancel(handle, grace_s=grace_s)
        job_dir = self._checked_job_dir(handle)
        grace = max(0, round(grace_s))
        raw = self._exec(["bash", "-c", jobs.CANCEL_SH, commands.ARGV0, job_dir, str(grace)],
                         timeout_s=grace + CONTROL_TIMEOUT_S)
        state = self._state(handle, raw)
        log.info("%s: cancelled job %s -> %s", self.host.name, handle.job_id, state)
        return state

    def wait(
        self,
        handle: JobHandle,
        *,
        poll_s: float = 5.0,
        timeout_s: float | None = None,
        on_poll: PollFn | None = None,
        check: bool = False,
    ) -> JobState:
        """Poll until the job ends. A dropped connection is not the job's end: reconnect and keep polling.

        `CommandTimeout` when `timeout_s` passes with the job still running (the job is left alone: cancel it
        if that is what you want). With `check`, `RemoteJobError` (with the stderr tail) unless exited(0).
        Time a job spends `pending` in a scheduler's queue does not count; a scheduler that enforces the job's
        limit itself (Slurm's --time) is given its `deadline_slack_s` past it to say so.
        """
        sched = self.scheduler()
        if timeout_s is not None and sched is not None:
            timeout_s += sched.deadline_slack_s
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        last_poll = time.monotonic()
        last_error: TransportError | None = None
        # Start polling fast and back off to `poll_s`: a conversion that ends in 2 s should not wait out a
        # 5 s interval, and a 10-hour training still costs one status command per `poll_s`.
        ramp = min(0.1, poll_s)
        while True:
            state: JobState | None = None
            try:
                state = self.status(handle)
            except TransportError as exc:
                if not exc.retryable:
                    raise
                last_error = exc
                log.warning("%s: polling job %s failed (%s); reconnecting", self.host.name, handle.job_id, exc)
            if state is not None:
                if state.kind == "pending" and deadline is not None:  # queued: the job's time has not started
                    deadline += time.monotonic() - last_poll
                last_poll = time.monotonic()
                if on_poll is not None:
                    on_poll(state)
                if state.finished:
                    break
            if deadline is not None and time.monotonic() >= deadline:
                why = f" (last error: {last_error})" if state is None and last_error else ""
                raise CommandTimeout(f"job {handle.job_id} still running after {timeout_s} s{why}",
                                     host=self.host.name)
            pause = ramp if deadline is None else max(0.0, min(ramp, deadline - time.monotonic()))
            ramp = min(poll_s, ramp * 2)
            time.sleep(pause)
        assert state is not None  # the loop only breaks on a finished state
        if check and not state.ok:
            tail = self.tail(handle, 2000, "stderr").rstrip().splitlines()[-20:]
            detail = "\n".join("    " + line for line in tail)
            raise RemoteJobError(f"{self.host.name}: job {handle.job_id} {state} (job dir {handle.job_dir})"
                                 + (f"\n{detail}" if detail else ""), handle=handle, state=state)
        return state

    # -- bulk transfers (alignflow.transport.transfer does the work) -----------------------------------------------
    def put(self, local: str, remote: str, *, progress: ProgressFn | None = None,
            overwrite: bool = False) -> Fingerprint:
        """Copy a controller file or directory to the host; verified on the host by sha256 before it appears."""
        with self._controller() as ctl:
            return copy_between(ctl, os.path.abspath(local), self, remote, progress=progress, overwrite=overwrite)

    def get(self, remote: str, local: str, *, progress: ProgressFn | None = None,
            overwrite: bool = False) -> Fingerprint:
        """Copy a host file or directory to the controller, verified against the sha256 computed on the host."""
        with self._controller() as ctl:
            return copy_between(self, remote, ctl, os.path.abspath(local), progress=progress, overwrite=overwrite)

    def receive(self, src: Transport, src_path: str, dst_path: str, *, progress: ProgressFn | None = None
                ) -> Fingerprint:
        """Copy `src:src_path` to `dst_path` here: host to host for one of ours (`copy_between`: verified on
        arrival, atomic), through the controller for any other transport (its `get`, then `put`)."""
        if isinstance(src, ShellTransport):
            return copy_between(src, src_path, self, dst_path, progress=progress)
        with tempfile.TemporaryDirectory(prefix="alignflow-receive-") as tmp:
            local = str(Path(tmp) / "copy")
            src.get(src_path, local)
            return self.put(local, dst_path, progress=progress)


class FollowedHash:
    """A hash that runs on the host while a copy arrives; `result()` after the copy, `abort()` if it failed."""

    def __init__(self, transport: ShellTransport, path: str, spawned: Spawned) -> None:
        self.transport, self.path, self._spawned = transport, path, spawned

    def result(self) -> Fingerprint:
        t = self.transport
        raw = self._spawned.finish()
        raise_if_escaped(raw.exit_code, raw.text("stderr"), host=t.host.name, workdir=t.workdir().declared)
        if raw.exit_code != 0:
            raise t._op_failed("sha256 (following a copy)", self.path, raw)
        try:
            return Fingerprint.from_json(json.loads(raw.text()))
        except (ValueError, KeyError, TypeError) as exc:
            raise t._op_failed(f"sha256 (unreadable output: {exc})", self.path, raw) from None

    def abort(self) -> None:
        try:
            self._spawned.send(b"abort\n")
            self._spawned.finish(timeout_s=30)
        except Exception:  # the copy's own error matters more; make sure nothing keeps running
            self._spawned.kill()
