"""Verified copies: controller <-> host (`put`/`get`) and host -> host (`copy_between`).

Every copy follows the same five steps, whatever the route:
1. the sha256 of the source is computed ON the source host (or taken from `expected`, the fingerprint the
   store recorded when the artifact was produced - then the source is not re-read);
2. if the destination already holds identical content, nothing moves (re-running a step is free);
3. the bytes go to a staging name in the destination's directory (`.af-partial-...`);
4. the destination host hashes the staged copy and compares it with step 1: a file that changed between
   hashing and copying, or was corrupted on the way, is refused here and the staged copy deleted (a
   directory is hashed file by file while it arrives, see follow_hash.py, so this costs little extra time);
5. only then is the staged copy renamed to its final name, without replacing anything that appeared
   meanwhile. So a partial or wrong copy never sits at the final path.

Routes (a table keyed by the two transports' types): local -> local: rsync; controller/local host <-> SSH host:
rsync over the host's OpenSSH master connection; SSH host -> same host: rsync there; SSH host -> another SSH
host: "direct" (payloads from 32 MiB on) - rsync runs ON the source host and writes straight to the
destination (the bytes cross the network once; the destination's key is lent to the source for the copy's
duration through a forwarded ssh-agent, never written to the source's disk; the destination's host key is
checked against the controller's known_hosts) - or, for small payloads, when the source cannot reach the
destination, or when no key can be lent, "relay": a tar stream through the controller (twice the network
traffic, no trust between hosts needed).
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import secrets
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Literal

from alignflow.errors import FingerprintMismatch, PathExists, RemoteCommandError, TransportError
from alignflow.fingerprint import Fingerprint
from alignflow.transport.commands import ARGV0
from alignflow.transport.direct import DirectRoute, direct_rsync_argv
from alignflow.transport.local import LocalTransport, controller_transport
from alignflow.transport.protocol import Completed, ProgressFn
from alignflow.transport.shell import ShellTransport
from alignflow.transport.ssh import SSHTransport

log = logging.getLogger(__name__)

Route = Literal["auto", "direct", "relay"]
# -L: a copy holds content, never links (the fingerprint follows links too, so both sides hash the same bytes).
RSYNC = ("rsync", "-rLpt", "-s", "--info=progress2")
# rsync exit codes that mean "the connection failed" rather than "this file could not be written".
_RSYNC_CONNECTION_CODES = {5, 10, 12, 30, 35, 255}
_PIPE_CHUNK = 1 << 20
# Below this size "auto" relays: setting up the direct route (agent, a second SSH hop, a probe) costs ~0.5 s,
# more than sending a small file twice.
DIRECT_MIN_BYTES = 32 << 20
_LOG_EVERY_S = 10.0
# A sender puts the source at `<staging>/payload` on the destination.
Sender = Callable[[ShellTransport, str, ShellTransport, str, Fingerprint, ProgressFn | None], None]


def put(dst: ShellTransport, local: str, remote: str, *, progress: ProgressFn | None = None,
        overwrite: bool = False) -> Fingerprint:
    """Controller file/dir -> host path (see the module docstring for the guarantees)."""
    with controller_transport() as ctl:
        return copy_between(ctl, os.path.abspath(local), dst, remote, progress=progress, overwrite=overwrite)


def get(src: ShellTransport, remote: str, local: str, *, progress: ProgressFn | None = None,
        overwrite: bool = False) -> Fingerprint:
    """Host path -> controller file/dir, verified on the controller against the sha256 computed on the host."""
    with controller_transport() as ctl:
        return copy_between(src, remote, ctl, os.path.abspath(local), progress=progress, overwrite=overwrite)


def copy_between(
    src: ShellTransport,
    src_path: str,
    dst: ShellTransport,
    dst_path: str,
    *,
    progress: ProgressFn | None = None,
    expected: Fingerprint | None = None,
    overwrite: bool = False,
    route: Route = "auto",
) -> Fingerprint:
    """Copy a file or directory from one host to another; returns the destination's verified fingerprint.

    `expected`: the source's fingerprint as recorded earlier; the copy must deliver exactly those bytes.
    `overwrite`: replace different content at `dst_path` (else `PathExists`). `route` (SSH -> SSH only):
    "auto" tries direct, then relay; "direct"/"relay" force one.
    """
    s_path, d_final = src.path(src_path), dst.path(dst_path)
    if expected is None:
        with ThreadPoolExecutor(max_workers=1) as pool:  # hash the source while the destination is looked at
            hashing = pool.submit(src.sha256, [s_path])
            exists = dst.stat(d_final) is not None
            want = hashing.result()[s_path]
    else:
        want, exists = expected, dst.stat(d_final) is not None
    name = f"{src.host.name}:{s_path} -> {dst.host.name}:{d_final}"
    if exists:
        have = dst.sha256([d_final])[d_final]
        if (have.kind, have.sha256) == (want.kind, want.sha256):
            log.info("%s: already there (sha256 %s), nothing copied", name, want.sha256[:12])
            return have
        if not overwrite:
            raise PathExists(f"{d_final} exists with different content (sha256 {have.sha256[:12]}, copy has "
                             f"{want.sha256[:12]}); nothing was overwritten - pass overwrite=True to replace it",
                             path=d_final, host=dst.host.name)
    parent = posixpath.dirname(d_final)
    staging = posixpath.join(parent, f".af-partial-{posixpath.basename(d_final)[:40]}-{secrets.token_hex(4)}")
    dst.mkdir(staging)
    sender = _sender(src, dst, route)
    reporter = _Reporter(name, want.size, progress)
    staged = posixpath.join(staging, "payload")
    start = time.perf_counter()
    placed = False
    try:
        # A directory is hashed on the destination while it arrives (file by file, as each is complete);
        # a single file can only be hashed once it is all there.
        follower = dst.follow_sha256(staged) if want.kind == "dir" else None
        try:
            sender(src, s_path, dst, staging, want, reporter)
        except BaseException:
            if follower is not None:
                follower.abort()
            raise
        got = follower.result() if follower is not None else dst.sha256([staged], memo=False)[staged]
        if (got.kind, got.sha256) != (want.kind, want.sha256):
            raise FingerprintMismatch(
                f"{dst.host.name}: copy of {src.host.name}:{s_path} refused - the bytes that arrived do not match "
                f"the sha256 computed on the source (changed between hashing and copying, or corrupted on the way)"
                f": expected {want.sha256[:16]}, got {got.sha256[:16]}{_diff(want, got)}; nothing was written to "
                f"{d_final}",
                expected=want.sha256,
                actual=got.sha256,
            )
        _place(dst, staged, d_final, overwrite=overwrite)  # also removes the emptied staging dir
        placed = True
    finally:
        if not placed:
            try:
                dst.remove(staging, recursive=True)
            except Exception as exc:  # cleanup must not mask the copy's own error
                log.warning("%s: could not remove staging dir %s: %s", dst.host.name, staging, exc)
    elapsed = time.perf_counter() - start
    log.info("%s: %d bytes in %.2f s (%.1f MB/s), sha256 %s verified on %s", name, want.size, elapsed,
             want.size / max(elapsed, 1e-9) / 1e6, want.sha256[:12], dst.host.name)
    return got


def _sender(src: ShellTransport, dst: ShellTransport, route: Route) -> Sender:
    if isinstance(src, SSHTransport) and isinstance(dst, SSHTransport):
        if _same_host(src, dst):
            return _on_host
        return {"auto": _direct_or_relay, "direct": _direct, "relay": _relay}[route]
    table: dict[tuple[str, str], Sender] = {
        ("local", "local"): _local_rsync,
        ("local", "ssh"): _push,
        ("ssh", "local"): _pull,
    }
    key = (_kind(src), _kind(dst))
    if key not in table:
        raise TypeError(f"no copy route from {type(src).__name__} to {type(dst).__name__}")
    return table[key]


def _kind(t: ShellTransport) -> str:
    # isinstance, not type(): subclasses (a transport with extra instrumentation) take their base's route
    return "ssh" if isinstance(t, SSHTransport) else "local" if isinstance(t, LocalTransport) else type(t).__name__


def _same_host(a: SSHTransport, b: SSHTransport) -> bool:
    return a.host.name == b.host.name or (a.host.address, a.host.port, a.host.user) == (
        b.host.address, b.host.port, b.host.user)


def _src_dst(s_path: str, staging: str, want: Fingerprint) -> tuple[str, str]:
    """rsync operands that put the source at `<staging>/payload`, for a file or a directory alike."""
    return (s_path + "/", staging + "/payload/") if want.kind == "dir" else (s_path, staging + "/payload")


def _local_rsync(src: ShellTransport, s_path: str, dst: ShellTransport, staging: str, want: Fingerprint,
                 progress: ProgressFn | None) -> None:
    a, b = _src_dst(s_path, staging, want)
    run_streaming([*RSYNC, "--", a, b], host=dst.host.name, progress=progress, total=want.size)


def _push(src: ShellTransport, s_path: str, dst: ShellTransport, staging: str, want: Fingerprint,
          progress: ProgressFn | None) -> None:
    assert isinstance(dst, SSHTransport)
    a, b = _src_dst(s_path, staging, want)
    run_streaming([*RSYNC, "-e", dst.openssh.rsh(), "--", a, dst.openssh.remote(b)], host=dst.host.name,
                  progress=progress, total=want.size)


def _pull(src: ShellTransport, s_path: str, dst: ShellTransport, staging: str, want: Fingerprint,
          progress: ProgressFn | None) -> None:
    assert isinstance(src, SSHTransport)
    a, b = _src_dst(s_path, staging, want)
    run_streaming([*RSYNC, "-e", src.openssh.rsh(), "--", src.openssh.remote(a), b], host=src.host.name,
                  progress=progress, total=want.size)


def _on_host(src: ShellTransport, s_path: str, dst: ShellTransport, staging: str, want: Fingerprint,
             progress: ProgressFn | None) -> None:
    a, b = _src_dst(s_path, staging, want)
    dst.run([*RSYNC, "--", a, b])
    if progress is not None:
        progress(want.size, want.size)


def _direct(src: ShellTransport, s_path: str, dst: ShellTransport, staging: str, want: Fingerprint,
            progress: ProgressFn | None) -> None:
    assert isinstance(src, SSHTransport)
    assert isinstance(dst, SSHTransport)
    with DirectRoute(src, dst) as route:
        if not route.usable():
            raise TransportError(f"direct copy to {dst.host.name} impossible: {route.reason}", host=src.host.name)
        _rsync_direct(route, s_path, staging, want, progress)


def _direct_or_relay(src: ShellTransport, s_path: str, dst: ShellTransport, staging: str, want: Fingerprint,
                     progress: ProgressFn | None) -> None:
    assert isinstance(src, SSHTransport)
    assert isinstance(dst, SSHTransport)
    if want.size < DIRECT_MIN_BYTES:
        _relay(src, s_path, dst, staging, want, progress)
        return
    with DirectRoute(src, dst) as route:
        if route.usable():
            _rsync_direct(route, s_path, staging, want, progress)
            return
        log.info("%s -> %s: direct copy not possible (%s); relaying through the controller",
                 src.host.name, dst.host.name, route.reason)
    _relay(src, s_path, dst, staging, want, progress)


def _rsync_direct(route: DirectRoute, s_path: str, staging: str, want: Fingerprint,
                  progress: ProgressFn | None) -> None:
    """rsync run on the source host, writing straight to the destination with the key `route` lends."""
    a, b = _src_dst(s_path, staging, want)
    argv = route.src.openssh.ssh_argv(shlex.join(direct_rsync_argv(route, [*RSYNC], a, b)), forward_agent=True)
    run_streaming(argv, host=route.src.host.name, progress=progress, total=want.size, env=route.env())


def _relay(src: ShellTransport, s_path: str, dst: ShellTransport, staging: str, want: Fingerprint,
           progress: ProgressFn | None) -> None:
    """tar on the source | this process | tar on the destination: hosts need no route or trust between them."""
    assert isinstance(src, SSHTransport)
    assert isinstance(dst, SSHTransport)
    payload = posixpath.join(staging, "payload")
    if want.kind == "dir":
        send = src.openssh.ssh_argv(shlex.join(["tar", "-C", s_path, "-chf", "-", "."]))
        recv = dst.openssh.ssh_argv(shlex.join(["bash", "-c", 'mkdir -p -- "$1" && exec tar -C "$1" -xpf -',
                                                ARGV0, payload]))
    else:
        send = src.openssh.ssh_argv(shlex.join(["cat", "--", s_path]))
        recv = dst.openssh.ssh_argv(shlex.join(["bash", "-c", 'exec cat > "$1"', ARGV0, payload]))
    sender = subprocess.Popen(send, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    receiver = subprocess.Popen(recv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert sender.stdout is not None
    assert receiver.stdin is not None
    errs = [_drain(sender.stderr), _drain(receiver.stderr)]
    done = 0
    try:
        while chunk := os.read(sender.stdout.fileno(), _PIPE_CHUNK):
            receiver.stdin.write(chunk)
            done += len(chunk)
            if progress is not None:
                progress(min(done, want.size), want.size)
        receiver.stdin.close()
    except BrokenPipeError:  # the receiver died: its exit status and stderr say why
        sender.kill()
    except BaseException:
        sender.kill()
        receiver.kill()
        raise
    finally:
        sender.stdout.close()
        with contextlib.suppress(OSError):
            receiver.stdin.close()
        s_code, r_code = sender.wait(), receiver.wait()
    s_err, r_err = (e.result() for e in errs)
    for code, err, host, argv in ((s_code, s_err, src.host.name, send), (r_code, r_err, dst.host.name, recv)):
        if code != 0:
            _raise_process_error(argv, code, err, host)


def _place(dst: ShellTransport, staged: str, final: str, *, overwrite: bool) -> None:
    raw = dst._op("place", staged, final, "1" if overwrite else "0")
    if raw.exit_code == 6:
        raise PathExists(f"{final} appeared while the copy was running; nothing was overwritten",
                         path=final, host=dst.host.name)
    if raw.exit_code != 0:
        raise dst._op_failed("place", final, raw)


def _diff(want: Fingerprint, got: Fingerprint) -> str:
    if want.kind != got.kind:
        return f" (a {want.kind} became a {got.kind})"
    a = {f.path: f.sha256 for f in want.files}
    b = {f.path: f.sha256 for f in got.files}
    bad = sorted(p for p in a.keys() | b.keys() if a.get(p) != b.get(p))
    if not bad:
        return ""
    shown = ", ".join(bad[:10]) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
    return f" (differing files: {shown})"


class _Result:
    def __init__(self) -> None:
        self._done = threading.Event()
        self._value = b""

    def set(self, value: bytes) -> None:
        self._value = value
        self._done.set()

    def result(self) -> bytes:
        self._done.wait()
        return self._value


def _drain(stream: IO[bytes] | None) -> _Result:
    out = _Result()
    if stream is None:
        out.set(b"")
        return out
    def read() -> None:
        with stream:
            out.set(stream.read())

    threading.Thread(target=read, daemon=True).start()
    return out


class _Reporter:
    """Progress to the caller's callback, and a log line every 10 s for long copies."""

    def __init__(self, name: str, total: int, callback: ProgressFn | None) -> None:
        self.name, self.total, self.callback = name, total, callback
        self.start = self.last_log = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        if self.callback is not None:
            self.callback(done, total)
        now = time.monotonic()
        if now - self.last_log >= _LOG_EVERY_S:
            self.last_log = now
            rate = done / max(now - self.start, 1e-9) / 1e6
            log.info("%s: %.0f%% (%d of %d bytes, %.1f MB/s)", self.name, 100 * done / max(total, 1), done, total,
                     rate)


def run_streaming(argv: Sequence[str], *, host: str, progress: ProgressFn | None, total: int,
                  env: dict[str, str] | None = None) -> None:
    """Run an rsync (possibly wrapped in ssh) on the controller, feeding `--info=progress2` lines to progress."""
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env)
    assert proc.stdout is not None
    err = _drain(proc.stderr)
    try:
        with proc.stdout:
            _feed_progress(proc.stdout, progress, total)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    code = proc.wait()
    if code != 0:
        _raise_process_error(argv, code, err.result(), host)
    if progress is not None:
        progress(total, total)


def _feed_progress(stream: IO[bytes], progress: ProgressFn | None, total: int) -> None:
    buf = b""
    while chunk := os.read(stream.fileno(), 1 << 14):
        buf += chunk
        *lines, buf = buf.replace(b"\r", b"\n").split(b"\n")
        for line in lines:
            fields = line.split()
            if progress is not None and len(fields) >= 2 and fields[1].endswith(b"%"):
                with contextlib.suppress(ValueError):
                    progress(min(int(fields[0].replace(b",", b"")), total), total)


def _raise_process_error(argv: Sequence[str], code: int, stderr: bytes, host: str) -> None:
    text = stderr.decode("utf-8", errors="replace")
    if code in _RSYNC_CONNECTION_CODES:
        tail = " | ".join(text.strip().splitlines()[-3:])
        raise TransportError(f"transfer failed (exit {code}, {argv[0]}): {tail}", host=host)
    raise RemoteCommandError(Completed(host, tuple(argv), code, "", text, 0.0))
