"""How the bytes of a copy move between two hosts (the senders of `transfer.copy_files`), and which one a pair of
hosts gets (`sender_for`, from what each end's shell says reaches its files: `on_this_machine`, or
`openssh_client()` - an SSH host through the controller's OpenSSH client).

This machine -> this machine: rsync, or Python's shutil where rsync is not installed (the embedded default must
work on a machine with only Python; same staging, verification and rename); this machine <-> SSH host: rsync over
the host's OpenSSH master connection; SSH host -> same host: rsync there; SSH host -> another SSH host: "direct"
(payloads from 32 MiB on) - rsync runs ON the source host and writes straight to the destination (the bytes
cross the network once; the destination's key is lent to the source for the copy's duration through a forwarded
ssh-agent, never written to the source's disk; the destination's host key is checked against the controller's
known_hosts) - or, for small payloads, when the source cannot reach the destination, or when no key can be lent,
"relay": a tar stream through the controller (twice the network traffic, no trust between hosts needed). A host
reached neither way (a new kind of host, a test's `FakeShell`) gets the same tar stream through the two shells'
`spawn`: slower than rsync, but it needs nothing but a Shell.

Every sender puts the source at `<staging>/payload` on the destination; what happens before and after (hashing,
verification, placement) is transfer.py's, the same for every route.
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import IO, Literal

from alignflow.errors import (
    AuthenticationFailed,
    ConfigError,
    HostKeyRejected,
    HostNotFound,
    HostUnusable,
    RemoteCommandError,
    TransportError,
)
from alignflow.fingerprint import Fingerprint
from alignflow.transport import commands
from alignflow.transport.commands import ARGV0
from alignflow.transport.direct import DirectRoute, direct_rsync_argv
from alignflow.transport.files import Files
from alignflow.transport.openssh import OpenSSHClient
from alignflow.transport.results import Completed, ProgressFn

log = logging.getLogger(__name__)

# A sender puts the source at `<staging>/payload` on the destination.
Sender = Callable[[Files, str, Files, str, Fingerprint, ProgressFn | None], None]

Route = Literal["auto", "direct", "relay"]
# -L: a copy holds content, never links (the fingerprint follows links too, so both sides hash the same bytes).
RSYNC = ("rsync", "-rLpt", "-s", "--info=progress2")
# rsync exit codes that mean "the connection failed" rather than "this file could not be written".
_RSYNC_CONNECTION_CODES = {5, 10, 12, 30, 35, 255}
_PIPE_CHUNK = 1 << 20
# Below this size "auto" relays: setting up the direct route (agent, a second SSH hop, a probe) costs ~0.5 s,
# more than sending a small file twice.
DIRECT_MIN_BYTES = 32 << 20


def sender_for(src: Files, dst: Files, route: Route) -> Sender:
    """The route, from what each end's shell says reaches its files (`on_this_machine`, `openssh_client()`)."""
    s_ssh, d_ssh = src.shell.openssh_client(), dst.shell.openssh_client()
    s_here, d_here = src.shell.on_this_machine, dst.shell.on_this_machine
    if s_ssh is not None and d_ssh is not None:
        if _same_host(src, dst):
            return _on_host
        return {"auto": _direct_or_relay, "direct": _direct, "relay": _relay}[route]
    if s_here and d_here:
        return _local_rsync if shutil.which("rsync") else _local_copy
    if not (s_here or s_ssh) or not (d_here or d_ssh):
        return _through_shells
    if not shutil.which("rsync"):
        ssh_host = dst if d_ssh is not None else src
        raise ConfigError(f"rsync is not installed on this machine (not on PATH): copies to and from SSH hosts "
                          f"such as {ssh_host.host.name} need it; install the `rsync` package (apt-get install rsync, "
                          "dnf install rsync, brew install rsync)")
    return _push if d_ssh is not None else _pull


def _ssh(t: Files) -> OpenSSHClient:
    """The end's OpenSSH client; `sender_for` only picks a route that uses it for an end that has one."""
    client = t.shell.openssh_client()
    assert client is not None, f"{t.host.name}: its files are not behind ssh"
    return client


def _same_host(a: Files, b: Files) -> bool:
    return a.host.name == b.host.name or (a.host.address, a.host.port, a.host.user) == (
        b.host.address, b.host.port, b.host.user)


def _src_dst(s_path: str, staging: str, want: Fingerprint) -> tuple[str, str]:
    """rsync operands that put the source at `<staging>/payload`, for a file or a directory alike."""
    return (s_path + "/", staging + "/payload/") if want.kind == "dir" else (s_path, staging + "/payload")


def _local_rsync(src: Files, s_path: str, dst: Files, staging: str, want: Fingerprint,
                 progress: ProgressFn | None) -> None:
    a, b = _src_dst(s_path, staging, want)
    run_streaming([*RSYNC, "--", a, b], host=dst.host.name, progress=progress, total=want.size)


def _local_copy(src: Files, s_path: str, dst: Files, staging: str, want: Fingerprint,
                progress: ProgressFn | None) -> None:
    """local -> local without rsync: what `rsync -rLpt` does (content of links, mode, mtime), with shutil."""
    done = 0

    def copy(a: str, b: str) -> str:
        nonlocal done
        shutil.copy2(a, b)  # follows symlinks; keeps mode and times
        done += os.path.getsize(b)
        if progress is not None:
            progress(min(done, want.size), want.size)
        return b

    target = posixpath.join(staging, "payload")
    try:
        if want.kind == "dir":
            shutil.copytree(s_path, target, symlinks=False, copy_function=copy)
        else:
            copy(s_path, target)
    except (OSError, shutil.Error) as exc:
        raise TransportError(f"local copy {s_path} -> {target} failed: {exc}", host=dst.host.name) from exc
    if progress is not None:
        progress(want.size, want.size)


def _push(src: Files, s_path: str, dst: Files, staging: str, want: Fingerprint,
          progress: ProgressFn | None) -> None:
    ssh = _ssh(dst)
    a, b = _src_dst(s_path, staging, want)
    run_streaming([*RSYNC, "-e", ssh.rsh(), "--", a, ssh.remote(b)], host=dst.host.name,
                  progress=progress, total=want.size)


def _pull(src: Files, s_path: str, dst: Files, staging: str, want: Fingerprint,
          progress: ProgressFn | None) -> None:
    ssh = _ssh(src)
    a, b = _src_dst(s_path, staging, want)
    trust, source = rsync_source(a)
    run_streaming([*RSYNC, *trust, "-e", ssh.rsh(), "--", ssh.remote(source), b], host=src.host.name,
                  progress=progress, total=want.size)


_WILDCARDS = frozenset("*?[")


def rsync_source(path: str) -> tuple[list[str], str]:
    """(extra options, operand) naming exactly `path` as the remote source of an `rsync -s`.

    With -s (--secluded-args) the sending rsync expands wildcards in a source operand itself (rsync(1)): a file
    named `*` would send every file of its directory. rsync matches an operand component by component: one with
    `*`, `?` or `[` in it is a pattern, where a backslash escapes the next character; one without them is taken
    literally, backslashes included (both seen with rsync 3.5.0). So each component with a wildcard character is
    escaped (a backslash before each of `\\*?[]`), the others are left as they are. The receiving rsync then
    checks the names it gets against its escaped request and can refuse the match ("rejecting unrequested
    file-list name"): such a pull trusts the sender (--trust-sender, rsync >= 3.2.5), whose bytes are checked
    against the source's fingerprint before anything is committed."""
    if not _WILDCARDS & set(path):
        return [], path
    parts = [re.sub(r"([\\*?\[\]])", r"\\\1", part) if _WILDCARDS & set(part) else part
             for part in path.split("/")]
    return ["--trust-sender"], "/".join(parts)


def _on_host(src: Files, s_path: str, dst: Files, staging: str, want: Fingerprint,
             progress: ProgressFn | None) -> None:
    a, b = _src_dst(s_path, staging, want)
    dst.run([*RSYNC, "--", a, b])
    if progress is not None:
        progress(want.size, want.size)


def _direct(src: Files, s_path: str, dst: Files, staging: str, want: Fingerprint,
            progress: ProgressFn | None) -> None:
    with DirectRoute(src, dst) as route:
        if not route.usable():
            raise TransportError(f"direct copy to {dst.host.name} impossible: {route.reason}", host=src.host.name)
        _rsync_direct(route, s_path, staging, want, progress)


def _direct_or_relay(src: Files, s_path: str, dst: Files, staging: str, want: Fingerprint,
                     progress: ProgressFn | None) -> None:
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
    argv = route.ssh.ssh_argv(shlex.join(direct_rsync_argv(route, [*RSYNC], a, b)), forward_agent=True)
    run_streaming(argv, host=route.src.host.name, progress=progress, total=want.size, env=route.env())


def _relay(src: Files, s_path: str, dst: Files, staging: str, want: Fingerprint,
           progress: ProgressFn | None) -> None:
    """tar on the source | this process | tar on the destination: hosts need no route or trust between them."""
    src_ssh, dst_ssh = _ssh(src), _ssh(dst)
    payload = posixpath.join(staging, "payload")
    if want.kind == "dir":
        send = src_ssh.ssh_argv(shlex.join(["tar", "-C", s_path, "-chf", "-", "."]))
        recv = dst_ssh.ssh_argv(shlex.join(["bash", "-c", 'mkdir -p -- "$1" && exec tar -C "$1" -xpf -',
                                                ARGV0, payload]))
    else:
        send = src_ssh.ssh_argv(shlex.join(["cat", "--", s_path]))
        recv = dst_ssh.ssh_argv(shlex.join(["bash", "-c", 'exec cat > "$1"', ARGV0, payload]))
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


# $1 the source path, $2 its kind: a tar of the directory's content (links followed, as rsync -L does) or the file.
_SEND_SH = 'if [ "$2" = dir ]; then exec tar -C "$1" -chf - .; else exec cat -- "$1"; fi'
# $1 the staged payload's path, $2 the kind; the payload on stdin.
_RECEIVE_SH = 'if [ "$2" = dir ]; then mkdir -p -- "$1" && exec tar -C "$1" -xpf -; else exec cat > "$1"; fi'


def _through_shells(src: Files, s_path: str, dst: Files, staging: str, want: Fingerprint,
                    progress: ProgressFn | None) -> None:
    """tar on the source | this process | tar on the destination, through the two hosts' shells (`spawn`): what any
    kind of host can do, with nothing between the hosts but the controller."""
    payload = posixpath.join(staging, "payload")
    sender = src.shell.spawn(commands.script("send", _SEND_SH, s_path, want.kind))
    try:
        receiver = dst.shell.spawn(commands.script("receive", _RECEIVE_SH, payload, want.kind))
    except BaseException:
        sender.kill()
        raise
    done = 0
    try:
        while chunk := sender.read(_PIPE_CHUNK):
            receiver.send(chunk)
            done += len(chunk)
            if progress is not None:
                progress(min(done, want.size), want.size)
    except BaseException:
        sender.kill()
        receiver.kill()
        raise
    for end, spawned, path in ((src, sender, s_path), (dst, receiver, payload)):
        result = spawned.finish()
        if result.exit_code != 0:
            raise end.failed("copy (tar stream)", path, result)


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


# What the OpenSSH client prints for what retrying cannot change (ssh.c, sshconnect.c; LogLevel ERROR keeps them).
_OPENSSH_PERMANENT: tuple[tuple[str, type[HostUnusable]], ...] = (
    ("Could not resolve hostname", HostNotFound),
    ("Host key verification failed", HostKeyRejected),
    ("REMOTE HOST IDENTIFICATION HAS CHANGED", HostKeyRejected),
    ("Permission denied (", AuthenticationFailed),
)


def openssh_error(message: str, stderr: str, *, host: str) -> TransportError:
    """The error of an OpenSSH client (ssh, rsync over ssh) that could not reach `host`: permanent for a name that
    does not resolve, a host key or a refused key (`HostUnusable`, not retried), else a retryable `TransportError`."""
    unresolved = re.search(r"Could not resolve hostname (\S+?):", stderr)
    if unresolved and unresolved.group(1).rstrip(".").lower().endswith(".invalid"):  # never resolves (RFC 6761)
        return HostNotFound(message, host=host)
    if "Temporary failure in name resolution" not in stderr:  # EAI_AGAIN: the resolver did not answer
        for marker, kind in _OPENSSH_PERMANENT:
            if marker in stderr:
                return kind(message, host=host)
    return TransportError(message, host=host)


def _raise_process_error(argv: Sequence[str], code: int, stderr: bytes, host: str) -> None:
    text = stderr.decode("utf-8", errors="replace")
    if code in _RSYNC_CONNECTION_CODES:
        tail = " | ".join(text.strip().splitlines()[-3:])
        raise openssh_error(f"transfer failed (exit {code}, {argv[0]}): {tail}", text, host=host)
    raise RemoteCommandError(Completed(host, tuple(argv), code, "", text, 0.0))
