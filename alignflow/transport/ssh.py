"""`SSHShell`: a host reached over SSH - paramiko for commands, the OpenSSH client for bulk data.

Security (issue 3, item 6): the host key must be in the host's managed known_hosts file (`RejectPolicy`;
fabric's AutoAdd default is never in play, docs/orchestration.md#g11-fabric-never-verifies-host-keys-by-default); keys
or agent only; commands are argv lists quoted once with
`shlex.join` here, at the SSH edge. Latency: commands run on one kept-alive connection with TCP_NODELAY set
(without it, Nagle + delayed ACK put ~40 ms on every small command); invoke's IO threads, which cost fabric
~100 ms per command (docs/orchestration.md#connection-reuse), are not used. A dropped connection is re-opened by the
next call.
"""

from __future__ import annotations

import logging
import select
import shlex
import socket
import threading
import time
from collections.abc import Sequence
from typing import NoReturn

import paramiko

from alignflow.config.hosts import Host
from alignflow.errors import (
    AuthenticationFailed,
    CommandTimeout,
    HostKeyRejected,
    HostUnreachable,
    TransportError,
)
from alignflow.transport.hostkeys import key_fingerprint
from alignflow.transport.names import invalid_name, lookup_error, never_resolves
from alignflow.transport.openssh import KEEPALIVE_S, OpenSSHClient, identity_path, known_hosts_path
from alignflow.transport.shell import Result, Shell, Spawned

log = logging.getLogger(__name__)

_CHUNK = 1 << 16
_KILL_AFTER_S = 5


def open_socket(host: Host) -> socket.socket:
    """A TCP connection to the host's SSH port within its connect timeout, or `HostUnreachable` saying why."""
    assert host.address is not None
    where, budget = f"{host.address}:{host.port}", host.connect_timeout_s
    if never_resolves(host.address):
        raise invalid_name(host.address, host=host.name)
    try:
        sock = socket.create_connection((host.address, host.port), timeout=budget)
    except TimeoutError:
        raise HostUnreachable(f"no answer from {where} within {budget:g} s", host=host.name) from None
    except ConnectionRefusedError:
        raise HostUnreachable(f"connection refused by {where} (is sshd running?)", host=host.name) from None
    except socket.gaierror as exc:  # no such name: permanent; no answer (EAI_AGAIN): retried
        raise lookup_error(exc, host.address, host=host.name) from None
    except OSError as exc:
        raise HostUnreachable(f"cannot connect to {where}: {exc.strerror or exc}", host=host.name) from None
    # Commands are small request/response exchanges: without TCP_NODELAY, Nagle's algorithm meets the
    # peer's delayed ACK and every command waits ~40 ms.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class _RejectUnknown(paramiko.RejectPolicy):
    """paramiko's RejectPolicy, with the refused key's fingerprint in the error (for `hosts trust`)."""

    def __init__(self, host_name: str, known_hosts: str) -> None:
        self.host_name, self.known_hosts = host_name, known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> NoReturn:
        raise HostKeyRejected(
            f"unknown host key for {hostname} ({key.get_name()} {key_fingerprint(key)}): not in {self.known_hosts}",
            host=self.host_name,
        )


def jump_channel(tr: paramiko.Transport, host: Host, jump: str) -> paramiko.Channel:
    """A `direct-tcpip` channel from the jump host to `host`'s SSH port (what `ssh -J` opens)."""
    assert host.address is not None
    where = f"{host.address}:{host.port}"
    try:
        return tr.open_channel("direct-tcpip", (host.address, host.port), ("127.0.0.1", 0),
                               timeout=host.connect_timeout_s)
    except paramiko.ChannelException as exc:
        raise HostUnreachable(f"jump host {jump} cannot reach {where}: {exc.args[-1] if exc.args else exc}",
                              host=host.name) from None
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise HostUnreachable(f"through jump host {jump}: no channel to {where} ({exc})", host=host.name) from None


class SSHShell(Shell):
    """A host reached over SSH; connects on first use, reconnects after a drop."""

    def __init__(self, host: Host) -> None:
        super().__init__(host)
        self._ssh: paramiko.SSHClient | None = None
        self._conn_lock = threading.Lock()
        self.openssh = OpenSSHClient(self.host)
        self.peer_routes = self.openssh.peer_routes  # what direct copies from here found (transport.direct)
        self.connections_opened = 0  # for diagnostics: > 1 means the shell reconnected
        self._jump: SSHShell | None = None  # the connection to the host's jump host (proxy_jump)

    def openssh_client(self) -> OpenSSHClient:
        return self.openssh

    # -- connection ----------------------------------------------------------------------------------------------
    def connect(self) -> paramiko.Transport:
        """The live connection, opened (or re-opened) within the host's `connect_timeout_s`."""
        with self._conn_lock:
            if self._ssh is not None:
                tr = self._ssh.get_transport()
                if tr is not None and tr.is_active():
                    return tr
                self._ssh.close()
                self._ssh = None
                log.info("%s: connection lost; reconnecting", self.host.name)
            self._ssh = self._open()
            self.connections_opened += 1
            tr = self._ssh.get_transport()
            assert tr is not None
            return tr

    def _open(self) -> paramiko.SSHClient:
        h = self.host
        assert h.address is not None
        assert h.user is not None
        deadline = time.monotonic() + h.connect_timeout_s
        sock = self._socket()
        kh = known_hosts_path(h)
        client = paramiko.SSHClient()
        if kh.exists():
            client.load_host_keys(str(kh))
        client.set_missing_host_key_policy(_RejectUnknown(h.name, str(kh)))
        ident = identity_path(h)
        remaining = max(0.5, deadline - time.monotonic())
        try:
            client.connect(
                h.address,
                port=h.port,
                username=h.user,
                key_filename=str(ident) if ident else None,
                allow_agent=ident is None,
                look_for_keys=False,
                sock=sock,
                timeout=remaining,
                banner_timeout=remaining,
                auth_timeout=remaining,
                channel_timeout=remaining,
            )
        except HostKeyRejected:
            client.close()
            raise
        except (paramiko.SSHException, EOFError, OSError) as exc:
            dropped = not _active(client)
            client.close()
            raise _connect_error(exc, h, dropped=dropped, timed_out=time.monotonic() >= deadline - 0.05) from None
        tr = client.get_transport()
        assert tr is not None
        tr.set_keepalive(KEEPALIVE_S)
        return client

    def _socket(self) -> socket.socket | paramiko.Channel:
        """A stream to the host's SSH port: TCP, or a channel through its jump host (OpenSSH's ProxyJump)."""
        jump = self.host.jump_host()
        if jump is None:
            return open_socket(self.host)
        if self._jump is None:
            self._jump = SSHShell(jump)
        return jump_channel(self._jump.connect(), self.host, jump.name)

    def _drop(self) -> None:
        with self._conn_lock:
            if self._ssh is not None:
                self._ssh.close()
                self._ssh = None

    def close(self) -> None:
        self._drop()
        self.openssh.close()
        if self._jump is not None:
            self._jump.close()

    # -- commands ------------------------------------------------------------------------------------------------
    def exec(self, argv: Sequence[str], *, input: bytes | None = None, timeout_s: float | None = None) -> Result:
        if timeout_s is not None:
            # Killed on the host too: closing our channel alone would leave the command running there.
            argv = ["timeout", "-k", str(_KILL_AFTER_S), f"{timeout_s + 1:g}", *argv]
        command = shlex.join(argv)
        start = time.perf_counter()
        tr = self.connect()
        try:
            chan = tr.open_session(timeout=self.host.connect_timeout_s)
            try:
                chan.exec_command(command)
                out, err, code = self._pump(chan, input, timeout_s)
            finally:
                chan.close()
        except CommandTimeout:
            self._drop()  # a command that hangs may be a connection that hangs: start afresh next time
            raise
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self._drop()
            raise TransportError(f"connection lost during a command: {exc or type(exc).__name__}",
                                 host=self.host.name) from None
        return Result(code, out, err, time.perf_counter() - start)

    def spawn(self, argv: Sequence[str]) -> Spawned:
        tr = self.connect()
        try:
            chan = tr.open_session(timeout=self.host.connect_timeout_s)
            chan.exec_command(shlex.join(argv))
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self._drop()
            raise TransportError(f"connection lost starting a command: {exc}", host=self.host.name) from None
        return _SSHSpawned(self, chan)

    def _pump(self, chan: paramiko.Channel, data: bytes | None, timeout_s: float | None) -> tuple[bytes, bytes, int]:
        """Feed stdin and drain stdout/stderr together (no deadlock on large outputs) until the exit status."""
        deadline = None if timeout_s is None else time.perf_counter() + timeout_s
        out: list[bytes] = []
        err: list[bytes] = []
        pending = memoryview(data) if data else None
        if pending is None:
            chan.shutdown_write()
        while True:
            busy = False
            if pending is not None and chan.send_ready():  # paramiko: a closed channel is "ready" (and refuses)
                try:
                    sent = chan.send(bytes(pending[:_CHUNK]))
                except OSError:
                    if not chan.closed:
                        raise
                    pending = None  # the command ended without reading all of its input: its exit is the answer
                else:
                    pending = pending[sent:] if sent < len(pending) else None
                    if pending is None:
                        chan.shutdown_write()
                busy = True
            while chan.recv_ready():
                out.append(chan.recv(_CHUNK))
                busy = True
            while chan.recv_stderr_ready():
                err.append(chan.recv_stderr(_CHUNK))
                busy = True
            # OpenSSH sends exit-status as the process ends, and the rest of its output, EOF and CLOSE after:
            # done once the status and the end of the output are both in. A closed channel is done too: paramiko
            # sets `closed` a moment before it sets the status event (`_set_closed`), so a channel seen closed right
            # after its status was seen missing still has its status, which `recv_exit_status` waits for (-1 if none).
            if chan.closed or (chan.exit_status_ready() and chan.eof_received):
                _drain(chan, out, err)
                code = chan.recv_exit_status()
                if code == -1:  # paramiko's "no exit-status came": the channel closed without one
                    tr = chan.get_transport()
                    if tr is None or not tr.is_active():
                        raise EOFError("the connection closed before the command's exit status arrived")
                    code = 255
                    err.append(b"\nalignflow: the command ended without an exit status (killed by a signal?)\n")
                return b"".join(out), b"".join(err), code
            tr = chan.get_transport()
            if tr is None or not tr.is_active():
                raise EOFError("the connection closed before the command's exit status arrived")
            now = time.perf_counter()
            if deadline is not None and now >= deadline:
                raise CommandTimeout(f"command timed out after {timeout_s:g} s and was killed",
                                     host=self.host.name)
            if not busy:
                wait = 0.5 if deadline is None else min(0.5, deadline - now)
                select.select([chan], [], [], wait if pending is None else min(wait, 0.01))


def _active(client: paramiko.SSHClient) -> bool:
    transport = client.get_transport()
    return transport is not None and transport.is_active()


def _connect_error(exc: paramiko.SSHException | EOFError | OSError, h: Host, *, dropped: bool,
                   timed_out: bool) -> TransportError:
    """paramiko's reason a connection failed, as our error: a changed key, a refused key, or a lost connection."""
    where = f"{h.address}:{h.port}"
    if isinstance(exc, paramiko.BadHostKeyException):
        return HostKeyRejected(
            f"host key CHANGED for {where}: it presents {key_fingerprint(exc.key)}, {known_hosts_path(h)} has "
            f"{key_fingerprint(exc.expected_key)} - possible man-in-the-middle, or the host was reinstalled",
            host=h.name,
        )
    if isinstance(exc, paramiko.AuthenticationException):
        if dropped:
            # paramiko reports a connection that died during authentication (sshd restarting, the connection
            # killed) as "Authentication failed: transport shut down or saw EOF": the server never answered
            # the key, so this is a lost connection (retryable), not a refusal.
            return TransportError(f"SSH connection to {where} dropped during authentication ({exc})", host=h.name)
        ident = identity_path(h)
        how = f"key {ident}" if ident else "the SSH agent's keys"
        return AuthenticationFailed(f"{h.user}@{where} refused {how}: {exc}", host=h.name)
    if timed_out or "banner" in str(exc).lower():
        return HostUnreachable(f"{where} accepted TCP but did not complete the SSH handshake within "
                               f"{h.connect_timeout_s:g} s ({exc})", host=h.name)
    return TransportError(f"SSH handshake with {where} failed: {exc}", host=h.name)


def _drain(chan: paramiko.Channel, out: list[bytes], err: list[bytes]) -> None:
    """Read what the channel has buffered; past EOF nothing more comes."""
    while chan.recv_ready():
        out.append(chan.recv(_CHUNK))
    while chan.recv_stderr_ready():
        err.append(chan.recv_stderr(_CHUNK))


class _SSHSpawned:
    def __init__(self, shell: SSHShell, chan: paramiko.Channel) -> None:
        self.shell, self.chan, self.start = shell, chan, time.perf_counter()

    def send(self, data: bytes) -> None:
        try:
            self.chan.sendall(data)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise TransportError(f"connection lost: {exc}", host=self.shell.host.name) from None

    def read(self, n: int) -> bytes:
        try:
            return bytes(self.chan.recv(n))
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise TransportError(f"connection lost: {exc}", host=self.shell.host.name) from None

    def read_line(self) -> bytes:
        line = b""
        try:
            while not line.endswith(b"\n"):
                byte = self.chan.recv(1)
                if not byte:
                    break
                line += byte
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise TransportError(f"connection lost: {exc}", host=self.shell.host.name) from None
        return line

    def finish(self, timeout_s: float | None = None) -> Result:
        try:
            out, err, code = self.shell._pump(self.chan, None, timeout_s)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self.shell._drop()
            raise TransportError(f"connection lost during a command: {exc}", host=self.shell.host.name) from None
        finally:
            self.chan.close()
        return Result(code, out, err, time.perf_counter() - self.start)

    def kill(self) -> None:
        self.chan.close()
