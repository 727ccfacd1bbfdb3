"""The OpenSSH client for bulk data: one generated ssh_config per host, with a reused master connection.

paramiko carries control traffic; checkpoints go through OpenSSH's `rsync`/`ssh`, which are 1.5-2x faster
on loopback and far faster on real links (docs/orchestration.md#transfer-speed,
docs/orchestration.md#g14-paramiko-sftp-is-slow). Every OpenSSH process gets
`-F <generated config>`: the user's ~/.ssh/config is never read, so hosts.yaml alone decides how a host is
reached, and the same host-key rules apply as for paramiko (StrictHostKeyChecking=yes against the host's
managed known_hosts, BatchMode, keys or agent only).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from alignflow.config.hosts import Host

log = logging.getLogger(__name__)

ALIAS = "alignflow-target"
JUMP_ALIAS = "alignflow-jump"
# AES-GCM first: with AES-NI it is ~1.2-1.5x faster than OpenSSH's default chacha20
# (docs/orchestration.md#transfer-speed); a server
# without it negotiates the next one. No cipher below OpenSSH's defaults is ever offered.
BULK_CIPHERS = "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com"
CONTROL_PERSIST_S = 60
KEEPALIVE_S = 15


def known_hosts_path(host: Host) -> Path:
    """The host's managed known_hosts file (default ~/.config/alignflow/known_hosts, resolved at call time)."""
    raw = host.known_hosts or "~/.config/alignflow/known_hosts"
    return Path(raw).expanduser()


def identity_path(host: Host) -> Path | None:
    return Path(host.identity_file).expanduser() if host.identity_file else None


def known_host_name(host: Host) -> str:
    """How known_hosts names the host: `addr`, or `[addr]:port` off port 22."""
    assert host.address is not None
    return host.address if host.port == 22 else f"[{host.address}]:{host.port}"


def _quote(value: str) -> str:
    # ssh_config: double quotes keep spaces; '%' starts a token in paths, so it is doubled.
    if '"' in value or "\n" in value:
        raise ValueError(f"ssh_config value {value!r} contains a double quote or a newline")
    return '"' + value.replace("%", "%%") + '"'


def render_config(host: Host, *, control_path: str | None) -> str:
    """An ssh_config for `ALIAS` with everything hosts.yaml says about the host; no user config involved.

    A host behind a jump host gets `ProxyJump alignflow-jump`, and that alias its own block (its address, user,
    key and managed known_hosts, the same strict checking): ssh passes `-F` on to the jump's ssh, so both hops
    read this file and nothing else.
    """
    jump = host.jump_host()
    lines = _host_block(ALIAS, host)
    if jump is not None:
        lines.append(f"  ProxyJump {JUMP_ALIAS}")
    if control_path is not None:
        lines += [
            "  ControlMaster auto",
            f"  ControlPath {_quote(control_path)}",
            f"  ControlPersist {CONTROL_PERSIST_S}",
        ]
    else:
        lines += ["  ControlMaster no", "  ControlPath none"]
    if jump is not None:
        lines += [*_host_block(JUMP_ALIAS, jump), "  ControlMaster no", "  ControlPath none"]
    return "\n".join(lines) + "\n"


def _host_block(alias: str, host: Host) -> list[str]:
    assert host.address is not None
    assert host.user is not None
    lines = [
        f"Host {alias}",
        f"  HostName {host.address}",
        f"  Port {host.port}",
        f"  User {_quote(host.user)}",
        f"  UserKnownHostsFile {_quote(str(known_hosts_path(host)))}",
        "  GlobalKnownHostsFile /dev/null",
        "  StrictHostKeyChecking yes",
        "  CheckHostIP no",
        "  BatchMode yes",
        "  PasswordAuthentication no",
        "  KbdInteractiveAuthentication no",
        f"  ConnectTimeout {max(1, math.ceil(host.connect_timeout_s))}",
        f"  ServerAliveInterval {KEEPALIVE_S}",
        "  ServerAliveCountMax 4",
        f"  Ciphers {BULK_CIPHERS}",
        "  Compression no",
        "  LogLevel ERROR",
    ]
    ident = identity_path(host)
    if ident is not None:
        lines += [f"  IdentityFile {_quote(str(ident))}", "  IdentitiesOnly yes"]
    return lines


class OpenSSHClient:
    """argv for OpenSSH tools aimed at one host; owns a private directory with the config and master socket."""

    def __init__(self, host: Host) -> None:
        self.host = host
        # destination host name -> None (direct copies from this host work) or why not; see transport.direct
        self.peer_routes: dict[str, str | None] = {}
        self._dir: Path | None = None
        self._lock = threading.Lock()

    def config_path(self) -> str:
        with self._lock:
            if self._dir is None:
                # A short private path: the master socket's path must fit in sockaddr_un (108 bytes).
                self._dir = Path(tempfile.mkdtemp(prefix="af-ssh-"))
                (self._dir / "config").write_text(render_config(self.host, control_path=str(self._dir / "cm")))
                (self._dir / "config-direct").write_text(render_config(self.host, control_path=None))
            return str(self._dir / "config")

    def ssh_argv(self, remote_command: str, *, forward_agent: bool = False) -> list[str]:
        """`ssh ... alignflow-target -- CMD`; CMD is already one shell-quoted string (`shlex.join`).

        With `forward_agent` the connection is a dedicated one: a multiplexed session would forward the
        master's agent, not the one in this process's environment.
        """
        cfg = self.config_path()
        if forward_agent:
            cfg = str(Path(cfg).with_name("config-direct"))
            return ["ssh", "-F", cfg, "-A", ALIAS, "--", remote_command]
        return ["ssh", "-F", cfg, ALIAS, "--", remote_command]

    def rsh(self) -> str:
        """The `rsync -e` value (rsync splits it on spaces; the private dir has none)."""
        cfg = self.config_path()
        if " " in cfg or "'" in cfg:
            raise ValueError(f"temporary directory {cfg!r} contains spaces or quotes; set TMPDIR to a plain path")
        return f"ssh -F {cfg}"

    def remote(self, path: str) -> str:
        return f"{ALIAS}:{path}"

    def close(self) -> None:
        """Stop the master connection and remove the private directory."""
        with self._lock:
            if self._dir is None:
                return
            if (self._dir / "cm").exists():
                subprocess.run(["ssh", "-F", str(self._dir / "config"), "-O", "exit", ALIAS],
                               capture_output=True, timeout=30, check=False)
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def environ_with_agent(sock: str | None) -> dict[str, str]:
    """This process's environment with SSH_AUTH_SOCK replaced (or removed) for one child process."""
    env = dict(os.environ)
    env.pop("SSH_AUTH_SOCK", None)
    if sock:
        env["SSH_AUTH_SOCK"] = sock
    return env
