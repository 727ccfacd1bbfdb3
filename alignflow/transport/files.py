"""`Files`: a host's commands and files over its `Shell` - argv with the host's env, paths confined to the workdir,
small files, and sha256 computed on the host.

Every operation is one round trip of a small bash script (`commands.OPS`) that checks confinement on the host
before it touches a path (`paths.CONFINE_SH`), so the embedded default runs the very scripts that production runs
(docs/architecture.md#key-interfaces). Jobs, locks and copies are built on this class; nothing here knows them.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from alignflow.errors import PathMissing, PathNotAllowed, RemoteCommandError
from alignflow.fingerprint import Fingerprint
from alignflow.transport import commands
from alignflow.transport.commands import MISSING_EXIT, op_argv, render_prologue, wrap_command
from alignflow.transport.paths import CONFINE_SH, confine, raise_if_escaped
from alignflow.transport.results import Completed, PathStat
from alignflow.transport.shell import CONTROL_TIMEOUT_S, Result, Shell, Spawned, Workdir

_KINDS: dict[str, Literal["file", "dir", "other"]] = {
    "regular file": "file",
    "regular empty file": "file",
    "directory": "dir",
}

# $1 workdir, $2 python, $3 n, then n paths and the fingerprint's options: every path confined and present (exit
# MISSING_EXIT naming the first missing one), then the controller's fingerprint.py, sent on stdin, runs.
_FINGERPRINT_SH = (CONFINE_SH + 'W=$1; py=$2; n=$3; shift 3; af_confine "$W" "${@:1:n}"\n'
                   + 'for p in "${@:1:n}"; do [ -e "$p" ] || { printf "%s\\n" "$p" >&2; '
                   + f'exit {MISSING_EXIT}; }}; done\n'
                   + 'exec "$py" - "$@"')
# $1 workdir, then `python -c <follow_hash.py> PATH <fingerprint.py>`; PATH ($4 after the shift) confined first.
_FOLLOW_SH = CONFINE_SH + 'W=$1; shift; af_confine "$W" "$4"\n"$@"\nexit $?'


def module_source(module_file: str) -> bytes:
    """A module's source, to send to a host's Python (which may have no alignflow installed)."""
    return Path(module_file).read_bytes()


class Files:
    """Commands and files of one host, over its shell (`memo_path`: where the host keeps its hash memo)."""

    def __init__(self, shell: Shell, *, memo_path: str | None = None) -> None:
        self.shell = shell
        self.host = shell.host
        self._memo_path = memo_path

    def __repr__(self) -> str:
        return f"Files({self.host.name!r})"

    # -- commands ----------------------------------------------------------------------------------------------
    def python(self) -> str:
        return self.host.python or self.shell.default_python

    def prologue(self, *, env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
        """The lines that give a command the host's env and setup lines (and `env`, `cwd`): `render_prologue`."""
        return render_prologue(host_env=self.host.env, setup=self.host.setup, env=env, cwd=cwd)

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
        prologue = self.prologue(env=env, cwd=self.path(cwd) if cwd else self.workdir().real)
        data = input.encode() if isinstance(input, str) else input
        raw = self.shell.exec(wrap_command(argv, prologue), input=data, timeout_s=timeout_s)
        done = Completed(self.host.name, tuple(argv), raw.exit_code, raw.text(), raw.text("stderr"), raw.duration_s)
        return done.check() if check else done

    # -- paths ---------------------------------------------------------------------------------------------------
    def workdir(self) -> Workdir:
        return self.shell.workdir()

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

    def op(self, op: str, *args: str, input: bytes | None = None) -> Result:
        """Run the file operation `commands.OPS[op]`; a path that escapes the workdir raises `PathNotAllowed`."""
        wd = self.workdir()
        raw = self.shell.exec(op_argv(op, wd.real, *args), input=input, timeout_s=CONTROL_TIMEOUT_S)
        raise_if_escaped(raw.exit_code, raw.text("stderr"), host=self.host.name, workdir=wd.declared)
        return raw

    def failed(self, op: str, path: str, raw: Result) -> RemoteCommandError:
        """The error of an operation on `path` that exited non-zero (exit code and stderr tail)."""
        return RemoteCommandError(
            Completed(self.host.name, (op, path), raw.exit_code, raw.text(), raw.text("stderr"), raw.duration_s)
        )

    # -- small files ---------------------------------------------------------------------------------------------
    def exists(self, p: str) -> bool:
        path = self.path(p)
        raw = self.op("exists", path)
        if raw.exit_code != 0:
            raise self.failed("exists", path, raw)
        return raw.text().strip() == "1"

    def stat(self, p: str) -> PathStat | None:
        """Size, mtime and kind of a path (symlinks followed); None when it does not exist."""
        path = self.path(p)
        raw = self.op("stat", path)
        if raw.exit_code == MISSING_EXIT:
            return None
        if raw.exit_code != 0:
            raise self.failed("stat", path, raw)
        kind, size, mtime, mode = raw.text().strip().rsplit("|", 3)
        sec, _, frac = mtime.partition(".")
        mtime_ns = int(sec) * 1_000_000_000 + int((frac + "000000000")[:9])
        return PathStat(path, _KINDS.get(kind, "other"), int(size), mtime_ns, int(mode, 8))

    def mkdir(self, p: str) -> str:
        """Create a directory and its parents (new ones mode 700); returns its absolute path."""
        path = self.path(p)
        raw = self.op("mkdir", path)
        if raw.exit_code != 0:
            raise self.failed("mkdir", path, raw)
        return path

    def read_text(self, p: str, *, max_bytes: int = 1 << 20) -> str:
        """A small text file (configs, manifests); larger files move with `get`."""
        path = self.path(p)
        raw = self.op("read", path, str(max_bytes))
        if raw.exit_code == MISSING_EXIT:
            raise PathMissing(path, host=self.host.name)
        if raw.exit_code == 4:
            raise RemoteCommandError(
                Completed(self.host.name, ("read", path), 4, "",
                          f"{raw.text('stderr').strip()} bytes > max_bytes={max_bytes}; use get() for large files",
                          raw.duration_s)
            )
        if raw.exit_code != 0:
            raise self.failed("read", path, raw)
        return raw.text()

    def write_text(self, p: str, text: str) -> str:
        """Write a small file atomically (temporary name, then rename; mode 600); returns its path."""
        path = self.path(p)
        raw = self.op("write", path, input=text.encode("utf-8"))
        if raw.exit_code != 0:
            raise self.failed("write", path, raw)
        return path

    def remove(self, p: str, *, recursive: bool = False) -> None:
        """Remove a file, an empty directory, or (recursive) a tree; a missing path is not an error."""
        path = self.path(p)
        raw = self.op("remove", path, "1" if recursive else "0")
        if raw.exit_code != 0:
            raise self.failed("remove", path, raw)

    # -- hashing -------------------------------------------------------------------------------------------------
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
            raise self.failed("sha256", " ".join(absolute), raw)
        try:
            data: dict[str, dict[str, object]] = json.loads(raw.text())
            return {absolute[k]: Fingerprint.from_json(v) for k, v in data.items()}
        except (ValueError, KeyError, TypeError) as exc:
            raise self.failed(f"sha256 (unreadable output: {exc})", " ".join(absolute), raw) from None

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
            raise self.failed("confinement check", " ".join(absolute), raw)

    def _fingerprint_py(self, absolute: list[str], options: list[str]) -> Result:
        """`python - PATH... --confine WORKDIR OPTIONS` on the host, with the controller's fingerprint.py on stdin;
        escapes raised, every path checked to exist first (exit MISSING_EXIT naming it)."""
        from alignflow import fingerprint as fp_module

        wd = self.workdir()
        # The controller's workdir is "/": its paths are the user's, nothing to confine them to.
        confined = ["--confine", wd.real] if wd.real != "/" else []
        argv = commands.script("sha256", _FINGERPRINT_SH, wd.real, self.python(), str(len(absolute)), *absolute,
                               *confined, *options, prologue=self.prologue(cwd=wd.real))
        raw = self.shell.exec(argv, input=module_source(fp_module.__file__))
        raise_if_escaped(raw.exit_code, raw.text("stderr"), host=self.host.name, workdir=wd.declared)
        return raw

    def follow_sha256(self, p: str) -> FollowedHash:
        """Start hashing `p` on the host while it is being written (a copy's staging dir); see follow_hash.py."""
        from alignflow import fingerprint as fp_module
        from alignflow.transport import follow_hash

        path = self.path(p)
        wd = self.workdir()
        argv = commands.script("follow", _FOLLOW_SH, wd.real, self.python(), "-c",
                               module_source(follow_hash.__file__).decode(), path,
                               module_source(fp_module.__file__).decode(), prologue=self.prologue(cwd=wd.real))
        return FollowedHash(self, path, self.shell.spawn(argv))


class FollowedHash:
    """A hash that runs on the host while a copy arrives; `result()` after the copy, `abort()` if it failed."""

    def __init__(self, files: Files, path: str, spawned: Spawned) -> None:
        self.files, self.path, self.spawned = files, path, spawned

    def result(self) -> Fingerprint:
        f = self.files
        raw = self.spawned.finish()
        raise_if_escaped(raw.exit_code, raw.text("stderr"), host=f.host.name, workdir=f.workdir().declared)
        if raw.exit_code != 0:
            raise f.failed("sha256 (following a copy)", self.path, raw)
        try:
            return Fingerprint.from_json(json.loads(raw.text()))
        except (ValueError, KeyError, TypeError) as exc:
            raise f.failed(f"sha256 (unreadable output: {exc})", self.path, raw) from None

    def abort(self) -> None:
        try:
            self.spawned.send(b"abort\n")
            self.spawned.finish(timeout_s=30)
        except Exception:  # the copy's own error matters more; make sure nothing keeps running
            self.spawned.kill()
