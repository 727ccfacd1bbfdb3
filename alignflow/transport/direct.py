"""The direct host -> host route: rsync runs ON the source host and writes to the destination over SSH.

Why direct by default: the bytes cross the network once, host to host, instead of twice through the
controller (docs/orchestration.md#transfer-speed: "run rsync on the source host, not through the controller").

How the source gets in without holding any secret: for the duration of one copy, the controller starts a
private ssh-agent holding only the destination's identity (a key lifetime is set too) and forwards it on a
dedicated connection to the source; the source's ssh checks the destination's host key against a one-off
known_hosts file written from the controller's managed one. Nothing is left on the source afterwards.
The price: while the copy runs, root on the source host could use the forwarded agent - use
`route="relay"` where that is not acceptable.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from alignflow.transport.commands import ARGV0
from alignflow.transport.files import Files
from alignflow.transport.hostkeys import trusted_keys
from alignflow.transport.openssh import (
    BULK_CIPHERS,
    OpenSSHClient,
    environ_with_agent,
    identity_path,
    known_host_name,
    known_hosts_path,
)

log = logging.getLogger(__name__)

_AGENT_KEY_LIFETIME_S = 6 * 3600
_UNSAFE_IN_RSH = set(" \t\n'\"\\")


class DirectRoute:
    """Context manager: lends the destination's key to the source host; `usable()` says whether it works."""

    def __init__(self, src: Files, dst: Files) -> None:
        self.src, self.dst = src, dst
        self.ssh: OpenSSHClient = _reached_over_ssh(src)  # the controller's OpenSSH client for the source
        _reached_over_ssh(dst)
        self.reason: str | None = None
        self._agent: subprocess.Popen[bytes] | None = None
        self._agent_dir: str | None = None
        self._sock: str | None = None
        self._kh_remote: str | None = None

    def usable(self) -> bool:
        return self.reason is None

    @property
    def known_hosts_file(self) -> str:
        """The one-off known_hosts file on the source host (exists while the context is open)."""
        assert self._kh_remote is not None
        return self._kh_remote

    def env(self) -> dict[str, str]:
        return environ_with_agent(self._sock)

    def __enter__(self) -> DirectRoute:
        name, peer_routes = self.dst.host.name, self.ssh.peer_routes
        if peer_routes.get(name) is not None:  # found unusable earlier on this connection
            self.reason = peer_routes[name]
            return self
        try:
            self._prepare()
            if self.reason is None and name not in peer_routes:
                self.reason = self._probe()
        except Exception:
            self.__exit__()
            raise
        peer_routes[name] = self.reason
        return self

    def __exit__(self, *exc: object) -> None:
        if self._kh_remote is not None:
            try:
                self.src.remove(self._kh_remote)
            except Exception as err:  # cleanup must not mask the copy's own error
                log.warning("%s: could not remove %s: %s", self.src.host.name, self._kh_remote, err)
            self._kh_remote = None
        if self._agent is not None:
            self._agent.terminate()
            self._agent.wait(timeout=10)
            self._agent = None
        if self._agent_dir is not None:
            shutil.rmtree(self._agent_dir, ignore_errors=True)
            self._agent_dir = None

    # -- set-up --------------------------------------------------------------------------------------------------
    def _prepare(self) -> None:
        if self.dst.host.proxy_jump is not None:  # the source would need the jump's key and route too
            self.reason = f"{self.dst.host.name} is behind a jump host (proxy_jump): copies to it go through the " \
                          "controller"
            return
        name = known_host_name(self.dst.host)  # hashed entries are re-written in clear for the one-off file
        lines = [key.known_hosts_line(name) for key in trusted_keys(self.dst.host)]
        if not lines:
            self.reason = f"{self.dst.host.name}'s host key is not in {known_hosts_path(self.dst.host)}"
            return
        ident = identity_path(self.dst.host)
        if ident is not None:
            self.reason = self._start_agent(ident)
        else:
            self._sock = os.environ.get("SSH_AUTH_SOCK")
            if not self._sock:
                self.reason = "no identity_file for the destination and no SSH agent to forward"
        if self.reason is not None:
            return
        wd = self.src.workdir().real
        if _UNSAFE_IN_RSH & set(wd):
            self.reason = f"the source's workdir {wd!r} has spaces or quotes, which rsync -e cannot carry"
            return
        self._kh_remote = self.src.write_text(f".alignflow/tmp/known_hosts-{secrets.token_hex(6)}",
                                              "\n".join(lines) + "\n")

    def _start_agent(self, ident: Path) -> str | None:
        self._agent_dir = tempfile.mkdtemp(prefix="af-agent-")
        self._sock = os.path.join(self._agent_dir, "agent.sock")
        self._agent = subprocess.Popen(["ssh-agent", "-D", "-a", self._sock], stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 10
        while not os.path.exists(self._sock):
            if self._agent.poll() is not None or time.monotonic() > deadline:
                return "ssh-agent did not start"
            time.sleep(0.01)
        env = {**environ_with_agent(self._sock), "SSH_ASKPASS_REQUIRE": "never"}
        env.pop("DISPLAY", None)
        added = subprocess.run(["ssh-add", "-q", "-t", str(_AGENT_KEY_LIFETIME_S), str(ident)], env=env,
                               stdin=subprocess.DEVNULL, capture_output=True, start_new_session=True, timeout=30,
                               check=False)
        if added.returncode != 0:
            why = added.stderr.decode(errors="replace").strip() or f"exit {added.returncode}"
            return f"cannot load {ident} into an agent ({why}); a passphrase-protected key needs your own agent"
        return None

    def _probe(self) -> str | None:
        """Can the source reach the destination with the lent key, and is rsync installed on both?"""
        check = 'command -v rsync >/dev/null || { echo "rsync is not installed on the source" >&2; exit 120; }'
        remote = "command -v rsync >/dev/null || { echo 'rsync is not installed on the destination' >&2; exit 121; }"
        argv = ["bash", "-c", f'{check}\nexec "$@"', ARGV0, *self.ssh_argv(), remote]
        cmd = self.ssh.ssh_argv(shlex.join(argv), forward_agent=True)
        try:
            done = subprocess.run(cmd, env=self.env(), stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=self.src.host.connect_timeout_s + self.dst.host.connect_timeout_s + 30,
                                  check=False)
        except subprocess.TimeoutExpired:
            return f"{self.src.host.name} could not reach {self.dst.host.name} in time"
        if done.returncode != 0:
            tail = " | ".join(done.stderr.decode(errors="replace").strip().splitlines()[-2:])
            return f"{self.src.host.name} cannot reach {self.dst.host.name} over SSH: {tail or done.returncode}"
        return None

    # -- what runs on the source ---------------------------------------------------------------------------------
    def ssh_argv(self) -> list[str]:
        """The ssh command the source host uses towards the destination (no user config read there either)."""
        h = self.dst.host
        assert self._kh_remote is not None
        assert h.user is not None
        return [
            "ssh", "-F", "/dev/null",
            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={self._kh_remote}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "UpdateHostKeys=no", "-o", "CheckHostIP=no",
            "-o", "BatchMode=yes", "-o", "PasswordAuthentication=no",
            "-o", f"ConnectTimeout={max(1, math.ceil(h.connect_timeout_s))}", "-o", "ServerAliveInterval=15",
            "-o", f"Ciphers={BULK_CIPHERS}", "-o", "Compression=no",
            "-p", str(h.port), "-l", h.user, h.address or "",
        ]

    def rsh(self) -> str:
        """`rsync -e` value: the ssh argv above without the destination address (rsync appends it)."""
        words = self.ssh_argv()[:-1]
        for w in words:
            if _UNSAFE_IN_RSH & set(w):
                raise ValueError(f"rsync -e cannot carry {w!r}")
        return " ".join(words)

    def remote(self, path: str) -> str:
        addr = self.dst.host.address or ""
        return f"[{addr}]:{path}" if ":" in addr else f"{addr}:{path}"


def _reached_over_ssh(t: Files) -> OpenSSHClient:
    client = t.shell.openssh_client()
    if client is None:
        raise ValueError(f"{t.host.name}'s files are on this machine: a direct host-to-host copy needs two SSH hosts")
    return client


def direct_rsync_argv(route: DirectRoute, rsync: list[str], a: str, b: str) -> list[str]:
    """rsync run on the source: `a` (source host path) -> `b` (destination host path)."""
    return [*rsync, "-e", route.rsh(), "--", a, route.remote(b)]
